//! The oracle row: no agent runs; the bench itself kills the bomb at the
//! crossing it sees in the bomb's log, with what the kernel offers a killer
//! (pidfd_send_signal SIGKILL, then process_mrelease). What it measures is
//! the kernel's own floor for "memory back", in the same run as the modes.
//!
//! The bomb appends a record after every 64 KiB it touches (time, bytes
//! held, the node's page counter); an inotify watch on the log wakes the
//! oracle's thread on each write, which reads the new records and kills at
//! the first one past the level: the same record the bench later takes as
//! the crossing. Written here rather than taken from the agent's kill path:
//! the floor must not share the agent's mistakes.
use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::FileExt as _},
    },
    path::Path,
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use evictd::kernel::bpf::monotonic_now_ns;

/// Bytes per bomb log record: time, bytes held, node page counter.
const RECORD: usize = 24;
/// How long the oracle waits for the bomb to cross, or to exit once killed.
const DEADLINE: Duration = Duration::from_secs(60);

/// What the oracle did, on CLOCK_MONOTONIC.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct OracleKill {
    /// When it read the first record past the level.
    pub seen_ns: u64,
    /// Just before pidfd_send_signal(SIGKILL).
    pub signalled_ns: u64,
    /// When process_mrelease returned, and whether it reaped the memory
    /// (it fails harmlessly once the bomb's own exit got there first).
    pub released_ns: u64,
    pub released: bool,
    /// When the bomb's pidfd said it had exited.
    pub exited_ns: Option<u64>,
}

/// The oracle's thread, armed before the bomb starts.
pub struct Oracle {
    outcome: mpsc::Receiver<Result<Option<OracleKill>, String>>,
}

impl Oracle {
    /// Watches the bomb `pid`'s `log` (which must exist) and kills the
    /// bomb at the first record whose page counter is at least `level`.
    pub fn arm(pid: u32, log: &Path, level: u64) -> Result<Self> {
        let pidfd = pidfd_open(pid).with_context(|| format!("pidfd of the bomb {pid}"))?;
        let inotify = watch_writes(log).with_context(|| format!("inotify on {}", log.display()))?;
        let file = File::open(log).with_context(|| format!("{}", log.display()))?;
        let (sender, outcome) = mpsc::channel();
        std::thread::spawn(move || {
            let result =
                kill_at_crossing(&pidfd, &inotify, &file, level).map_err(|e| e.to_string());
            let _ = sender.send(result);
        });
        Ok(Self { outcome })
    }

    /// What it did: `None` if the bomb ended before crossing (the kernel
    /// got there first). Waits for the thread, which ends once the bomb
    /// has exited.
    pub fn outcome(self) -> Result<Option<OracleKill>> {
        match self.outcome.recv_timeout(DEADLINE) {
            Ok(Ok(kill)) => Ok(kill),
            Ok(Err(e)) => bail!("the oracle failed: {e}"),
            Err(_) => bail!("the oracle did not finish within {DEADLINE:?}"),
        }
    }
}

/// When process `pid` exits (CLOCK_MONOTONIC ns, from its pidfd), for the
/// rows where something other than the agent or the oracle kills the bomb
/// (earlyoom, the kernel's OOM killer); nothing is sent if it outlives
/// [`DEADLINE`].
pub fn exit_watch(pid: u32) -> Result<mpsc::Receiver<u64>> {
    let pidfd = pidfd_open(pid).with_context(|| format!("pidfd of {pid}"))?;
    let (sender, exited) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok(Some(_)) = wait_readable(&[&pidfd], DEADLINE) {
            let _ = sender.send(monotonic_now_ns());
        }
    });
    Ok(exited)
}

fn kill_at_crossing(
    pidfd: &OwnedFd,
    inotify: &OwnedFd,
    log: &File,
    level: u64,
) -> io::Result<Option<OracleKill>> {
    let mut offset = 0u64;
    let mut buffer = vec![0u8; RECORD * 4096];
    loop {
        // Whole records only: a write the reader catches halfway is read
        // again once complete.
        loop {
            let read = log.read_at(&mut buffer, offset)?;
            let read_ns = monotonic_now_ns();
            let whole = read - read % RECORD;
            if whole == 0 {
                break;
            }
            let crossed = buffer[..whole]
                .chunks_exact(RECORD)
                .any(|record| word(record, 2) >= level);
            if crossed {
                return kill(pidfd, read_ns).map(Some);
            }
            offset += whole as u64;
        }
        // Sleep until the log grows or the bomb exits on its own.
        match wait_readable(&[inotify, pidfd], DEADLINE)? {
            Some(0) => drain(inotify)?,
            Some(_) => return Ok(None),
            None => return Err(io::Error::other("the bomb neither crossed nor exited")),
        }
    }
}

/// SIGKILL and process_mrelease; `seen_ns` is when the crossing record was
/// read.
fn kill(pidfd: &OwnedFd, seen_ns: u64) -> io::Result<OracleKill> {
    let signalled_ns = monotonic_now_ns();
    // SAFETY: an open pidfd, a null siginfo (as kill(2) sends it), flags 0.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an open pidfd and flags 0.
    let released = unsafe {
        libc::syscall(
            libc::SYS_process_mrelease,
            pidfd.as_raw_fd(),
            0 as libc::c_uint,
        )
    } == 0;
    let released_ns = monotonic_now_ns();
    let exited_ns = wait_readable(&[pidfd], DEADLINE)?.map(|_| monotonic_now_ns());
    Ok(OracleKill {
        seen_ns,
        signalled_ns,
        released_ns,
        released,
        exited_ns,
    })
}

/// The `index`th little-endian u64 of a record.
fn word(record: &[u8], index: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&record[index * 8..index * 8 + 8]);
    u64::from_le_bytes(bytes)
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    owned(fd)
}

/// An inotify descriptor that becomes readable when `path` is written.
fn watch_writes(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: inotify_init1 takes flags and returns a new descriptor.
    let inotify = owned(unsafe { libc::inotify_init1(libc::IN_CLOEXEC) }.into())?;
    let mut name = path.as_os_str().as_bytes().to_vec();
    name.push(0);
    // SAFETY: a valid descriptor and a NUL-terminated path.
    let watch = unsafe {
        libc::inotify_add_watch(inotify.as_raw_fd(), name.as_ptr().cast(), libc::IN_MODIFY)
    };
    if watch < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(inotify)
}

/// Reads (and forgets) the pending inotify events.
fn drain(inotify: &OwnedFd) -> io::Result<()> {
    let mut events = [0u8; 4096];
    // SAFETY: reads into a buffer of the size given.
    let read = unsafe {
        libc::read(
            inotify.as_raw_fd(),
            events.as_mut_ptr().cast(),
            events.len(),
        )
    };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until one of `fds` is readable: its index, or `None` at the
/// deadline.
fn wait_readable(fds: &[&OwnedFd], deadline: Duration) -> io::Result<Option<usize>> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = libc::c_int::try_from(deadline.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: `polled` holds `polled.len()` valid pollfd structs.
        let ready =
            unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        return Ok(polled.iter().position(|p| p.revents != 0));
    }
}

fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned this descriptor and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
