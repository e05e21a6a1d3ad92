//! Processes addressed through pidfds. A pidfd names one process for its
//! whole life, so a pid recycled between reading `cgroup.procs` and sending
//! the signal is never hit: the signal fails with ESRCH instead.
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

/// An open pidfd and the pid it was opened for (for error messages).
#[derive(Debug)]
pub(super) struct PidFd {
    fd: OwnedFd,
    pub(super) pid: u32,
}

impl PidFd {
    /// `pidfd_open(2)`; `Ok(None)` if the process has already exited.
    pub(super) fn open(pid: u32) -> io::Result<Option<Self>> {
        let raw = libc::pid_t::try_from(pid).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid} too large"))
        })?;
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new
        // file descriptor or -1; no memory is shared with the kernel.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0 as libc::c_uint) };
        if ret < 0 {
            return gone_or(io::Error::last_os_error(), None);
        }
        let fd = libc::c_int::try_from(ret)
            .map_err(|_| io::Error::other(format!("pidfd_open returned {ret}")))?;
        // SAFETY: the kernel just created this descriptor for us and nothing
        // else owns it, so OwnedFd may close it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Some(Self { fd, pid }))
    }

    /// `pidfd_send_signal(2)`; `Ok(false)` if the process has exited
    /// (and been reaped) since the pidfd was opened.
    pub(super) fn signal(&self, signal: libc::c_int) -> io::Result<bool> {
        // SAFETY: the descriptor is open for the life of `self`; a null
        // siginfo means "as kill(2) would send it"; flags must be 0.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if ret < 0 {
            return gone_or(io::Error::last_os_error(), false);
        }
        Ok(true)
    }

    /// `process_mrelease(2)`: reaps the address space of a process that is
    /// dying (SIGKILL sent) now, rather than when its last thread gets to run
    /// its exit path, which a frozen or stalled task may not do for a while.
    /// Fails harmlessly (ESRCH, EINVAL) when the process or its mm is
    /// already gone.
    pub(super) fn release_memory(&self) -> io::Result<()> {
        // SAFETY: the descriptor is open for the life of `self`; flags must
        // be 0; no memory is shared with the kernel.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_process_mrelease,
                self.fd.as_raw_fd(),
                0 as libc::c_uint,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// ESRCH means the process is gone: `gone`; anything else is an error.
fn gone_or<T>(error: io::Error, gone: T) -> io::Result<T> {
    if error.raw_os_error() == Some(libc::ESRCH) {
        Ok(gone)
    } else {
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn signals_a_child_and_then_sees_it_gone() {
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pidfd = PidFd::open(child.id()).unwrap().unwrap();
        assert!(pidfd.signal(libc::SIGKILL).unwrap());
        // Dying with SIGKILL pending: mrelease may reap it or find it gone.
        let _ = pidfd.release_memory();
        child.wait().unwrap();
        // Reaped: its pid may be reused, the pidfd still names the dead one.
        assert!(!pidfd.signal(libc::SIGKILL).unwrap());
        assert!(pidfd.release_memory().is_err());
    }

    #[test]
    fn a_pid_that_cannot_exist_is_an_error_not_a_panic() {
        assert!(PidFd::open(u32::MAX).is_err());
    }
}
