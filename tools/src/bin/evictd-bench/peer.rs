//! A real peer on the machine's root: Debian's earlyoom (1.7), what users
//! deploy today against a node running out of memory. It polls
//! `MemAvailable` in /proc/meminfo (sleeping 100 ms to 1 s between reads,
//! the nearer the line the shorter) and, below `-M` KiB, sends SIGTERM to
//! the process with the highest `oom_score` (SIGKILL below half of it). It
//! knows no pods, QoS classes or priorities: it kills one process, which on
//! a node is the one the kernel's OOM killer would pick, so its choice
//! follows kubelet's `oom_score_adj` per QoS class and the process's size.
//!
//! And the kernel's own OOM kills on the root: /proc/vmstat's `oom_kill`
//! counts them machine-wide, /dev/kmsg names their victims.
use std::{
    fs::File,
    io::{BufRead as _, BufReader, ErrorKind, Read as _},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use evictd::kernel::bpf::monotonic_now_ns;
use evictd_integration::{VMSTAT, set_oom_score_adj, wait_until};

/// The mode name of the earlyoom row.
pub const EARLYOOM: &str = "earlyoom";
/// What kubelet gives a system-node-critical pod's processes (and the
/// agent's DaemonSet is one): a node daemon, as earlyoom is.
pub const NODE_CRITICAL_OOM_SCORE_ADJ: i64 = -997;
const STARTUP_DEADLINE: Duration = Duration::from_secs(30);

/// earlyoom running, its output lines with the CLOCK_MONOTONIC time the
/// bench read each.
pub struct Earlyoom {
    child: Child,
    lines: mpsc::Receiver<(u64, String)>,
    readers: Vec<std::thread::JoinHandle<()>>,
    seen: Vec<(u64, String)>,
}

/// What earlyoom did in a run.
#[derive(Debug, Default)]
pub struct EarlyoomKill {
    /// When the bench read its first `sending SIGTERM`/`SIGKILL` line: its
    /// decision, one pipe hop later.
    pub decided_ns: Option<u64>,
    /// The pids it signalled, in order.
    pub pids: Vec<u32>,
}

impl Earlyoom {
    /// Starts `binary` with the line at `threshold` bytes of MemAvailable
    /// and no periodic report; returns once it has said what it watches.
    pub fn start(binary: &Path, threshold: u64) -> Result<Self> {
        let mut child = Command::new(binary)
            .args(["-M", &(threshold / 1024).to_string(), "-r", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        set_oom_score_adj(child.id(), NODE_CRITICAL_OOM_SCORE_ADJ)?;
        let (sender, lines) = mpsc::channel();
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let sender = sender.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if sender.send((monotonic_now_ns(), line)).is_err() {
                        break;
                    }
                }
            }));
        }
        let mut earlyoom = Self {
            child,
            lines,
            readers,
            seen: Vec::new(),
        };
        // "sending SIGTERM when mem <= …": its line is set.
        let ready = wait_until(STARTUP_DEADLINE, "earlyoom's start", || {
            earlyoom
                .lines()
                .iter()
                .any(|(_, l)| l.contains("sending SIGTERM when"))
        });
        if ready.is_err() {
            bail!("earlyoom did not start: {:?}", earlyoom.lines());
        }
        Ok(earlyoom)
    }

    fn lines(&mut self) -> &[(u64, String)] {
        self.seen.extend(self.lines.try_iter());
        &self.seen
    }

    /// Ends earlyoom (started here: by its pid) and says whom it signalled.
    pub fn stop(mut self) -> Result<EarlyoomKill> {
        let _ = self.child.kill();
        self.child.wait()?;
        // The readers end at the pipes' end, their last lines sent.
        for reader in std::mem::take(&mut self.readers) {
            let _ = reader.join();
        }
        let mut kill = EarlyoomKill::default();
        for (at, line) in self.lines() {
            // `sending SIGTERM to process 1234 uid 0 "name": badness …`
            let Some(rest) = line.split_once("sending SIG").map(|(_, rest)| rest) else {
                continue;
            };
            let Some(pid) = rest
                .split_once("to process ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|pid| pid.parse().ok())
            else {
                continue;
            };
            kill.decided_ns.get_or_insert(*at);
            if !kill.pids.contains(&pid) {
                kill.pids.push(pid);
            }
        }
        Ok(kill)
    }
}

/// The kernel's OOM kills from here on: /proc/vmstat's machine-wide count
/// and the kernel log's lines naming the victims.
pub struct KernelOomKills {
    count_before: u64,
    kmsg: File,
}

impl KernelOomKills {
    pub fn start() -> Result<Self> {
        let kmsg = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .context("/dev/kmsg")?;
        // SAFETY: an open descriptor; SEEK_END on /dev/kmsg skips to the
        // next record to come.
        if unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&kmsg), 0, libc::SEEK_END) } < 0 {
            return Err(std::io::Error::last_os_error()).context("seeking /dev/kmsg");
        }
        Ok(Self {
            count_before: oom_kill_count()?,
            kmsg,
        })
    }

    /// Kills since [`KernelOomKills::start`], and the `(pid, command)` of
    /// each victim the kernel log named.
    pub fn since(&mut self) -> Result<(u64, Vec<(u32, String)>)> {
        let count = oom_kill_count()?.saturating_sub(self.count_before);
        let mut victims = Vec::new();
        let mut record = vec![0u8; 8192];
        loop {
            match self.kmsg.read(&mut record) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&record[..n]);
                    if let Some(victim) = victim(&text) {
                        victims.push(victim);
                    }
                }
                // Records overwritten before they were read.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e).context("reading /dev/kmsg"),
            }
        }
        Ok((count, victims))
    }
}

/// `Out of memory: Killed process 1234 (evictd-workload) total-vm:…`.
fn victim(record: &str) -> Option<(u32, String)> {
    let (_, rest) = record.split_once("Killed process ")?;
    let (pid, rest) = rest.split_once(" (")?;
    let (command, _) = rest.split_once(')')?;
    Some((pid.parse().ok()?, command.to_owned()))
}

fn oom_kill_count() -> Result<u64> {
    let text = std::fs::read_to_string(VMSTAT)?;
    text.lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|count| count.trim().parse().ok())
        .context("no oom_kill in /proc/vmstat")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_logs_victim_is_named_by_pid_and_command() {
        let record = "3,1234,5678,-;Out of memory: Killed process 4321 (evictd-workload) \
                      total-vm:2097152kB, anon-rss:1900000kB, file-rss:0kB";
        assert_eq!(victim(record), Some((4321, "evictd-workload".to_owned())));
        assert_eq!(victim("6,1,2,-;oom-kill:constraint=CONSTRAINT_NONE"), None);
    }
}
