//! A handle on one `evictd-workload` process (see `src/bin/evictd-workload.rs`)
//! running in a private cgroup: commands with deadlines, SIGKILL on drop.
//! [`WorkloadChannel`] is the command protocol alone, which the containerd
//! tier speaks over a socket to workloads in containers.
use std::{
    fmt,
    io::{self, BufRead as _, BufReader, Read, Write},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use crate::{
    cgroup_tree::PrivateCgroupTree,
    wait::{scaled, wait_until},
};

/// How long one command may take: allocating hundreds of MiB, or forking
/// dozens of children, on a loaded 2-core machine stays well inside it.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(30);
/// How long a SIGKILLed workload may take to be reaped on drop.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// The workload process. Dropping it SIGKILLs it (by pid) and reaps it; its
/// children die with it (PR_SET_PDEATHSIG). Its commands are those of its
/// [`WorkloadChannel`] (`workload.alloc(..)`).
#[derive(Debug)]
pub struct Workload {
    child: Child,
    channel: WorkloadChannel,
}

/// The command protocol of `evictd-workload` (see its source), over its
/// stdin and stdout or over a socket: one line out, one reply line back,
/// each command bounded in time.
#[derive(Debug)]
pub struct WorkloadChannel {
    /// Who answers, for error messages (`workload 1234`).
    peer: String,
    commands: Box<dyn WriteDebug>,
    /// Reply lines, read by a thread so a command can time out. The channel
    /// closes when the workload's end does, i.e. when it dies.
    replies: mpsc::Receiver<String>,
    /// How long a command may take; [`COMMAND_DEADLINE`] unless changed.
    deadline: Duration,
    /// Set when a reply did not come in time: a late one would answer the
    /// next command, so there is no next command.
    desynchronised: bool,
}

/// A writer that can be printed in a `Debug` of its owner.
pub trait WriteDebug: Write + Send + fmt::Debug {}
impl<T: Write + Send + fmt::Debug> WriteDebug for T {}

impl WorkloadChannel {
    /// Commands go to `commands`; replies are read from `replies` on a
    /// thread until it ends.
    pub fn new(
        peer: String,
        commands: impl WriteDebug + 'static,
        replies: impl Read + Send + 'static,
    ) -> Self {
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(replies).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            peer,
            commands: Box::new(commands),
            replies: receiver,
            deadline: COMMAND_DEADLINE,
            desynchronised: false,
        }
    }

    /// Changes how long each command may take from now on (stretched by
    /// [`scaled`](crate::scaled), as every deadline).
    pub fn set_command_deadline(&mut self, deadline: Duration) {
        self.deadline = deadline;
    }

    /// Allocates and touches `bytes` more (rounded up to whole MiB); returns
    /// the bytes the workload now holds.
    pub fn alloc(&mut self, bytes: u64) -> io::Result<u64> {
        self.command_u64(&format!("alloc {bytes}"))
    }

    /// Grows by `step` bytes at a time until an allocation fails (something
    /// stopped the workload); returns what it held by then. An error if it
    /// reaches `limit` (its node's capacity, say) unstopped.
    pub fn grow_until_stopped(&mut self, step: u64, limit: u64) -> io::Result<u64> {
        self.grow(step, limit, None)
    }

    /// As [`Self::grow_until_stopped`], at `rate` bytes/s.
    pub fn grow_until_stopped_at(&mut self, step: u64, limit: u64, rate: u64) -> io::Result<u64> {
        self.grow(step, limit, Some(rate))
    }

    fn grow(&mut self, step: u64, limit: u64, rate: Option<u64>) -> io::Result<u64> {
        let command = match rate {
            Some(rate) => format!("alloc {step} {rate}"),
            None => format!("alloc {step}"),
        };
        let mut held = 0;
        while self.command_u64(&command).is_ok() {
            held += step;
            if held >= limit {
                return Err(io::Error::other(format!(
                    "{} reached {held} bytes and was never stopped",
                    self.peer
                )));
            }
        }
        Ok(held)
    }

    /// Frees at least `bytes` (whole MiB chunks, newest first), back to the
    /// kernel; returns the bytes the workload still holds.
    pub fn free(&mut self, bytes: u64) -> io::Result<u64> {
        self.command_u64(&format!("free {bytes}"))
    }

    /// Starts `count` sleeping children; returns how many it now has.
    pub fn fork(&mut self, count: u32) -> io::Result<u64> {
        self.command_u64(&format!("fork {count}"))
    }

    /// As [`Self::fork`], `rate` children a second.
    pub fn fork_at(&mut self, count: u32, rate: u32) -> io::Result<u64> {
        self.command_u64(&format!("fork {count} {rate}"))
    }

    /// Forks `count` children one after another, each exiting at once and
    /// reaped before the next; returns how long that took.
    pub fn fork_exit(&mut self, count: u32) -> io::Result<Duration> {
        self.command_u64(&format!("fork-exit {count}"))
            .map(Duration::from_nanos)
    }

    /// Starts one child running `count` threads besides its main one;
    /// returns how many children the workload now has.
    pub fn threads(&mut self, count: u32) -> io::Result<u64> {
        self.command_u64(&format!("threads {count}"))
    }

    /// Kills and reaps the `count` newest children; returns how many are
    /// left.
    pub fn reap(&mut self, count: u32) -> io::Result<u64> {
        self.command_u64(&format!("reap {count}"))
    }

    /// Maps `bytes` of fresh anonymous memory and faults in every 4 KiB
    /// page; returns how long the faults took. Kept until [`Self::unmap`].
    pub fn touch(&mut self, bytes: u64) -> io::Result<Duration> {
        self.command_u64(&format!("touch {bytes}"))
            .map(Duration::from_nanos)
    }

    /// Maps up to `bytes` and faults in page after page until the page
    /// counter in `usage` reads at least `level`, then stops (kept until
    /// the workload exits); returns the bytes touched.
    pub fn touch_until(&mut self, bytes: u64, level: u64, usage: &Path) -> io::Result<u64> {
        self.command_u64(&format!("touch-until {bytes} {level} {}", usage.display()))
    }

    /// As [`Self::touch`], at `rate` bytes/s.
    pub fn touch_at(&mut self, bytes: u64, rate: u64) -> io::Result<Duration> {
        self.command_u64(&format!("touch {bytes} {rate}"))
            .map(Duration::from_nanos)
    }

    /// Unmaps what [`Self::touch`] mapped; returns how long munmap took.
    pub fn unmap(&mut self) -> io::Result<Duration> {
        self.command_u64("unmap").map(Duration::from_nanos)
    }

    /// Starts a child that faults in `bytes`, SIGKILLs it once it holds
    /// them, and returns the time from the signal until it was reaped (its
    /// memory freed).
    pub fn kill_large(&mut self, bytes: u64) -> io::Result<Duration> {
        self.command_u64(&format!("kill-large {bytes}"))
            .map(Duration::from_nanos)
    }

    /// The pid as the workload itself reports it (the `pid` command).
    pub fn reported_pid(&mut self) -> io::Result<u32> {
        let text = self.command("pid")?;
        text.parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("pid {text:?}")))
    }

    /// Sends one command line and returns the text after `ok `. Fails with
    /// `TimedOut` after the command deadline (after which every further
    /// command fails too), `UnexpectedEof` if the workload
    /// died (killed by the OOM killer, say), `Other` on an `err` reply.
    pub fn command(&mut self, line: &str) -> io::Result<String> {
        if self.desynchronised {
            return Err(io::Error::other(
                "an earlier command timed out: the workload's replies are out of step",
            ));
        }
        // A dead workload fails the write (EPIPE) or the read below.
        let peer = &self.peer;
        writeln!(self.commands, "{line}")
            .and_then(|()| self.commands.flush())
            .map_err(|e| io::Error::new(e.kind(), format!("sending {line:?} to {peer}: {e}")))?;
        let reply = match self.replies.recv_timeout(scaled(self.deadline)) {
            Ok(reply) => reply,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.desynchronised = true;
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}: no reply to {line:?} within {:?}",
                        self.peer,
                        scaled(self.deadline)
                    ),
                ));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{} exited before answering {line:?}", self.peer),
                ));
            }
        };
        match reply.strip_prefix("ok ") {
            Some(text) => Ok(text.to_owned()),
            None => Err(io::Error::other(format!(
                "{} answered {line:?} with {reply:?}",
                self.peer
            ))),
        }
    }

    fn command_u64(&mut self, line: &str) -> io::Result<u64> {
        let text = self.command(line)?;
        text.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{line:?} answered {text:?}, not a number"),
            )
        })
    }
}

impl Workload {
    /// Starts the workload binary and moves it into `rel` of `tree` before it
    /// is given any command, so everything it allocates or forks is charged
    /// there. (What the process touched while starting up stays charged to
    /// the test's own cgroup.)
    ///
    /// `binary` is `env!("CARGO_BIN_EXE_evictd-workload")`, which cargo
    /// defines only when compiling this package's integration tests, not
    /// this library.
    pub fn spawn_in(
        tree: &PrivateCgroupTree,
        rel: &str,
        binary: impl AsRef<Path>,
    ) -> io::Result<Self> {
        let binary = binary.as_ref();
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", binary.display())))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => (stdin, stdout),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other("workload started without pipes"));
            }
        };
        let pid = child.id();
        // From here on, drop kills the workload if anything fails.
        let mut workload = Self {
            child,
            channel: WorkloadChannel::new(format!("workload {pid}"), stdin, stdout),
        };
        tree.move_pid(rel, workload.pid())?;
        // One round trip: the workload runs its command loop, in the cgroup.
        let reported = workload.reported_pid()?;
        if reported != workload.pid() {
            return Err(io::Error::other(format!(
                "workload {} reports pid {reported}",
                workload.pid()
            )));
        }
        Ok(workload)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `deadline` for the workload to exit on its own or be
    /// killed (by the OOM killer, or by the agent); `None` if it still runs.
    /// On Linux `ExitStatusExt::signal()` tells a SIGKILL (9) apart.
    pub fn wait_exit(&mut self, deadline: Duration) -> io::Result<Option<ExitStatus>> {
        let mut outcome = Ok(None);
        let _ = wait_until(deadline, "the workload to exit", || {
            outcome = self.child.try_wait();
            !matches!(outcome, Ok(None))
        });
        outcome
    }
}

impl std::ops::Deref for Workload {
    type Target = WorkloadChannel;

    fn deref(&self) -> &WorkloadChannel {
        &self.channel
    }
}

impl std::ops::DerefMut for Workload {
    fn deref_mut(&mut self) -> &mut WorkloadChannel {
        &mut self.channel
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to the child's pid, and does nothing once
        // the child has been reaped (so never to a recycled pid).
        let _ = self.child.kill();
        match self.wait_exit(EXIT_DEADLINE) {
            Ok(Some(_)) => {}
            Ok(None) => eprintln!(
                "evictd-integration: workload {} not gone {EXIT_DEADLINE:?} after SIGKILL",
                self.pid()
            ),
            Err(e) => eprintln!("evictd-integration: reaping workload {}: {e}", self.pid()),
        }
    }
}
