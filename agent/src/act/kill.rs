//! The kill executor: ends every process of a pod's cgroup subtree, and
//! gets their memory back at once.
//!
//! - cgroup v2: `cgroup.kill` SIGKILLs the whole subtree atomically (no
//!   fork escapes it), written first; then, best effort, pidfds of the
//!   dying processes let `process_mrelease` reap their memory without
//!   waiting for them to exit.
//! - cgroup v1 (and v2 kernels older than 5.14, without `cgroup.kill`):
//!   rounds of freeze (where a v1 freezer hierarchy has the pod), SIGKILL
//!   of every listed process through its pidfd, `process_mrelease`, thaw;
//!   until the subtree is empty or the deadline passes. The freeze only has
//!   to hold while the pod is listed and signalled (no fork escapes): a
//!   task thawed with SIGKILL pending dies before it runs user code again.
//!   So the pod is thawed as soon as the reapers are seen unmapping (they
//!   then hold the victims' memory), and each victim's exit frees beside
//!   them; thawed earlier, a victim's exit would detach its memory before
//!   a reaper found it and free it alone, at half the speed.
//! - `process_mrelease` runs on blocking threads (one per CPU at most, as
//!   Android lmkd's reaper pool), never on the agent's loop: reaping a
//!   large process takes tens of milliseconds, and the loop must go on
//!   deciding meanwhile. Each thread stays off the CPU its first victim
//!   last ran on while it reaps: the thawed victim wakes there, and a
//!   reaper beside it would take turns with its exit instead of freeing
//!   at the same time.
//! - Soft evictions first SIGTERM the containers' processes (not the pod
//!   sandbox's, whose end would take the pod's network down during their
//!   grace period: [`Sandbox`] says which they are) and wait up to the
//!   grace period for them to exit.
//!
//! Signals go through pidfds opened [`SIGNAL_BATCH`] at a time, so a pod
//! with more processes than the agent may open files (a fork bomb under a
//! 1,024 soft limit) is still emptied. A pid read from `cgroup.procs` may
//! exit and be reused by a process outside the pod before its pidfd is
//! opened; only pids the pod still lists once their pidfds are open are
//! signalled. A pidfd names one process for good, so no window is left in
//! which a signal reaches a process that was never in the pod: a listed
//! pid whose pidfd is open is either that process, alive and in the pod,
//! or a process that has since exited, which the signal then misses
//! (ESRCH).
//!
//! It never kills the hierarchy root, pid 1, or the agent itself: a pod
//! that holds the agent is refused whole.
mod cpu;
mod holdout;
mod pidfd;
mod sandbox;
mod tree;

use std::{
    collections::BTreeSet,
    io,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};
use tracing::{debug, warn};

use crate::{
    act::timer::Pacer,
    kernel::bpf::monotonic_now_ns,
    node::cgroupfs::{CgroupFs, CgroupVersion, is_gone},
};
use cpu::OffVictimCpu;
pub use holdout::{Holdout, describe_holdouts, freeze_holdouts};
use pidfd::PidFd;
pub use sandbox::Sandbox;
use tree::Freezer;

/// How long a hard kill may take before it is reported as failed: tasks in
/// uninterruptible sleep (a stuck NFS read, say) can hold a pod that long,
/// and a victim's memory locked that long can hold its reapers. The whole
/// kill is bounded by it, reapers included.
pub(crate) const DEFAULT_KILL_DEADLINE: Duration = Duration::from_secs(10);
/// How long to wait for a v1 freezer to report `FROZEN`; a task that will
/// not freeze (in uninterruptible sleep) must not stop the kill, which then
/// goes ahead on a partly frozen pod.
const FREEZE_DEADLINE: Duration = Duration::from_secs(1);
/// How long one SIGKILL round waits for its victims to leave before listing
/// and signalling again (what is left then was forked meanwhile, or moved in).
const ROUND_WAIT: Duration = Duration::from_millis(200);
/// How often `cgroup.procs` and `freezer.state` are re-read while waiting:
/// short against exit latencies, cheap for cgroupfs.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// How often `freezer.state` is read while the pod freezes: a task in the
/// middle of a page fault freezes on its way back to user mode, well under
/// a millisecond later. On a timerfd: tokio's timer ticks every
/// millisecond, so its next look would come one to two milliseconds on.
const FREEZE_POLL: Duration = Duration::from_micros(100);
/// How long after the freezer's write the tasks it still waits on are
/// named: a pod freezes in well under this unless a task is blocked in the
/// kernel.
const SLOW_FREEZE: Duration = Duration::from_millis(1);
/// How long a frozen pod waits for its reapers to be seen unmapping before
/// it is thawed anyway, how often that is looked at, and how far their
/// first victims' resident memory must fall to count as seen. Looked at on
/// a timerfd: tokio's timer ticks every millisecond, and while the pod is
/// frozen one CPU frees alone. 256 pages: 1 MiB of 4 KiB pages.
const REAPERS_HOLD: Duration = Duration::from_millis(3);
const REAPERS_POLL: Duration = Duration::from_micros(100);
const UNMAPPING_SEEN_PAGES: u64 = 256;
/// pidfds open at once: a quarter of the 1,024 soft file limit a container
/// runtime may give the agent, whatever else it has open. Also how many
/// processes of a round have their memory reaped (the first ones listed):
/// a pod with more is a fork bomb, whose processes hold little.
pub const SIGNAL_BATCH: usize = 256;
// The pidfds a kill holds (its batch, and the reapers' own) fit in what
// the inventory leaves free when it keeps pods' files open.
const _: () = assert!(2 * SIGNAL_BATCH as u64 <= crate::node::inventory::FILES_LEFT_TO_THE_REST);
/// How long a kill waits for the reaper thread that sends it to run before
/// it sends the kill itself: a thread kept idle for it wakes in
/// microseconds.
const KILL_HANDOFF: Duration = Duration::from_millis(20);
/// How long the agent's idle blocking threads wait for work before they
/// end: for good, so the threads `Killer::ready_threads` starts are
/// there at the first kill, however far off.
pub const BLOCKING_THREADS_KEEP_ALIVE: Duration = Duration::MAX;

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("refusing to kill cgroup {cgroup:?}: {reason}")]
    UnsafePath {
        cgroup: String,
        reason: &'static str,
    },
    #[error("refusing to kill cgroup {cgroup:?}: it holds evictd itself (pid {pid})")]
    HoldsSelf { cgroup: String, pid: u32 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a pid: {text:?}")]
    Parse { path: PathBuf, text: String },
    #[error("cgroup {cgroup:?}: {action} pid {pid}: {source}")]
    Process {
        cgroup: String,
        pid: u32,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cgroup {cgroup:?} still holds pids {pids:?} {waited:?} after the kill began")]
    Timeout {
        cgroup: String,
        pids: Vec<u32>,
        waited: Duration,
    },
    /// process_mrelease waits for the victim's mmap lock, which a task of
    /// the victim can hold in uninterruptible sleep for as long as it
    /// sleeps: the kill gives up at its deadline, the threads are left to
    /// end when the lock is free.
    #[error(
        "cgroup {cgroup:?}: {stuck} process_mrelease threads still blocked {waited:?} after the kill began (the memory of pids {victims:?} is locked, e.g. by a task stuck in the kernel holding its mmap lock)"
    )]
    ReapersStuck {
        cgroup: String,
        stuck: usize,
        victims: Vec<u32>,
        waited: Duration,
    },
}

impl KillError {
    fn io(path: &Path, source: io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// How the hard kill was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMethod {
    /// cgroup v2 `cgroup.kill`.
    CgroupKill,
    /// SIGKILL rounds through pidfds (cgroup v1, or v2 without cgroup.kill).
    Signals,
}

/// What a kill did, for the decision log and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillReport {
    pub method: KillMethod,
    /// CLOCK_MONOTONIC when the kill began (the clock of kernel records
    /// and of the decision's log line): the phases below count from here.
    pub started_at_ns: u64,
    /// Processes sent SIGTERM (soft eviction).
    pub sigterm_sent: u32,
    /// Processes sent SIGKILL through their pidfd; with `cgroup.kill`, those
    /// alive just before the write (the kernel signals them itself).
    pub sigkill_sent: u32,
    /// SIGKILL rounds (one for `cgroup.kill`); 0 if the pod emptied during
    /// the grace period.
    pub rounds: u32,
    pub mrelease_ok: u32,
    /// `process_mrelease` calls that failed, mostly benignly (the process
    /// exited, or its memory was already gone).
    pub mrelease_failed: u32,
    /// The v1 freezer reported `FROZEN` before a SIGKILL round.
    pub frozen: bool,
    /// From the call to the v1 freezer's first `FROZEN`.
    pub frozen_after: Option<Duration>,
    /// The tasks the first freeze still waited on `SLOW_FREEZE` after
    /// it was asked for; none when it was quicker.
    pub freeze_holdouts: Vec<Holdout>,
    /// From the call to the first SIGKILL (or `cgroup.kill` write).
    pub first_sigkill_after: Option<Duration>,
    /// From the call to the first thaw of the frozen pod (its reapers seen
    /// unmapping, or `REAPERS_HOLD` passed).
    pub thawed_after: Option<Duration>,
    /// From the call to the end of the first round's `process_mrelease`
    /// calls: the victims' memory reaped, their exits still to come.
    pub released_after: Option<Duration>,
    /// From the call to the moment the subtree held no process.
    pub empty_after: Duration,
}

impl KillReport {
    fn new(method: KillMethod, started_at_ns: u64) -> Self {
        Self {
            method,
            started_at_ns,
            sigterm_sent: 0,
            sigkill_sent: 0,
            rounds: 0,
            mrelease_ok: 0,
            mrelease_failed: 0,
            frozen: false,
            frozen_after: None,
            freeze_holdouts: Vec::new(),
            first_sigkill_after: None,
            thawed_after: None,
            released_after: None,
            empty_after: Duration::ZERO,
        }
    }
}

/// Kills pods' cgroups in the hierarchies of a [`CgroupFs`].
#[derive(Debug, Clone)]
pub struct Killer {
    cgroupfs: CgroupFs,
    deadline: Duration,
    /// Reaper threads a kill uses at most: one per CPU the agent may run
    /// on, counted once (each count reads the cgroup's CPU quota files).
    reapers: usize,
    /// The processes reaper threads work on now, shared by every kill: a
    /// kill tried again after one whose reaper stayed blocked on its
    /// victim's memory starts no second thread to block beside it.
    reaping: Arc<Mutex<BTreeSet<u32>>>,
}

impl Killer {
    pub fn new(cgroupfs: CgroupFs) -> Self {
        Self {
            cgroupfs,
            deadline: DEFAULT_KILL_DEADLINE,
            reapers: std::thread::available_parallelism().map_or(1, usize::from),
            reaping: Arc::default(),
        }
    }

    /// Starts the blocking threads a kill reaps on and returns once they
    /// all run at once, so that a kill finds them idle instead of starting
    /// a thread between its SIGKILL and its first `process_mrelease` while
    /// the pod is frozen. The runtime must keep idle blocking threads (the
    /// agent's sets `thread_keep_alive` to [`BLOCKING_THREADS_KEEP_ALIVE`]).
    pub(crate) async fn ready_threads(&self) {
        let all_running = Arc::new(std::sync::Barrier::new(self.reapers));
        let started: Vec<_> = (0..self.reapers)
            .map(|_| {
                let all_running = Arc::clone(&all_running);
                // None returns before every one has started: the pool
                // cannot run them on fewer threads.
                tokio::task::spawn_blocking(move || {
                    all_running.wait();
                })
            })
            .collect();
        for thread in started {
            let _ = thread.await;
        }
    }

    /// How long the hard kill may take (from its first signal) before
    /// [`KillError::Timeout`]; `DEFAULT_KILL_DEADLINE` unless set.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Kills every process in `cgroup` (a path from the hierarchy root, e.g.
    /// `/kubepods/burstable/pod<uid>`) and its descendants. With `grace` >
    /// 0 the processes first get SIGTERM, all but `sandbox`'s, and up to
    /// `grace` to exit. Returns once the subtree holds no process. Runs on
    /// a runtime with its I/O and time drivers (its short polls wait on a
    /// timerfd).
    pub async fn kill_pod(
        &self,
        cgroup: &str,
        grace: Duration,
        sandbox: &Sandbox,
    ) -> Result<KillReport, KillError> {
        tree::validate(cgroup)?;
        let started = Instant::now();
        let started_at_ns = monotonic_now_ns();
        let pod = Pod {
            cgroup,
            dirs: self.listed_dirs(cgroup),
            reapers: self.reapers,
            reaping: Arc::clone(&self.reaping),
        };
        // Listing refuses a pod holding the agent, before anything is
        // frozen or signalled.
        let pids = pod.pids()?;
        let cgroup_kill = self.cgroupfs.memory_dir(cgroup).join("cgroup.kill");
        let method = match self.cgroupfs.version {
            CgroupVersion::V2 if cgroup_kill.exists() => KillMethod::CgroupKill,
            _ => KillMethod::Signals,
        };
        let mut report = KillReport::new(method, started_at_ns);
        let mut alive = pids.len();
        if !grace.is_zero() && !pids.is_empty() {
            let spared = sandbox.pids(&self.cgroupfs.memory_dir(cgroup))?;
            let containers: BTreeSet<u32> = pids.difference(&spared).copied().collect();
            report.sigterm_sent = pod.signal_batched(&containers, libc::SIGTERM)?.0;
            // As kubelet stops the containers, then the sandbox: once only
            // the sandbox is left, the hard kill below ends it at once.
            pod.wait_for(started + grace, |left| left.is_subset(&spared))
                .await?;
            let left = pod.pids()?;
            if left.is_empty() {
                report.empty_after = started.elapsed();
                return Ok(report);
            }
            alive = left.len();
        }
        let deadline = Instant::now() + self.deadline;
        match method {
            KillMethod::CgroupKill => {
                report.sigkill_sent = u32::try_from(alive).unwrap_or(u32::MAX);
                pod.cgroup_kill(&cgroup_kill, started, deadline, &mut report)
                    .await?;
            }
            KillMethod::Signals => {
                let freezer = self.cgroupfs.freezer_dir(cgroup).and_then(Freezer::at);
                pod.signal_rounds(freezer.as_ref(), started, deadline, &mut report)
                    .await?;
            }
        }
        if !pod.wait_empty(deadline).await? {
            return Err(pod.timeout(started));
        }
        report.empty_after = started.elapsed();
        Ok(report)
    }

    /// Thaws the pods among `cgroups` that are frozen at the pod's own level:
    /// a kill a previous agent began and never finished (it was killed
    /// itself while the pod was frozen). Only evictd freezes a whole pod —
    /// container runtimes pause containers — and left so the pod would stay
    /// frozen for good, its SIGKILLed tasks unable to die. Returns the pods
    /// thawed.
    pub(crate) fn thaw_abandoned(&self, cgroups: &[&str]) -> Vec<String> {
        let mut thawed = Vec::new();
        for cgroup in cgroups {
            let Some(freezer) = self.cgroupfs.freezer_dir(cgroup).and_then(Freezer::at) else {
                continue;
            };
            match freezer.is_self_frozen().and_then(|frozen| {
                if frozen {
                    freezer.thaw()?;
                }
                Ok(frozen)
            }) {
                Ok(true) => thawed.push((*cgroup).to_owned()),
                Ok(false) => {}
                Err(error) => warn!(cgroup, %error, "cannot thaw a pod left frozen"),
            }
        }
        thawed
    }

    /// The directories whose `cgroup.procs` make up the pod: memory, and on
    /// v1 the pids and freezer hierarchies too where they are mounted apart
    /// (a task moved in one v1 hierarchy stays put in the others).
    fn listed_dirs(&self, cgroup: &str) -> Vec<PathBuf> {
        let mut dirs = vec![self.cgroupfs.memory_dir(cgroup)];
        if self.cgroupfs.version == CgroupVersion::V1 {
            let others = [
                self.cgroupfs.pids_dir(cgroup).ok(),
                self.cgroupfs.freezer_dir(cgroup),
            ];
            for dir in others.into_iter().flatten() {
                if !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
        dirs
    }
}

/// One kill in progress.
struct Pod<'a> {
    cgroup: &'a str,
    dirs: Vec<PathBuf>,
    /// See [`Killer::reapers`].
    reapers: usize,
    /// See [`Killer::reaping`].
    reaping: Arc<Mutex<BTreeSet<u32>>>,
}

impl Pod<'_> {
    /// Every process in the subtree, in every listed hierarchy. Refuses the
    /// whole kill if the agent is among them.
    fn pids(&self) -> Result<BTreeSet<u32>, KillError> {
        let mut pids = BTreeSet::new();
        for dir in &self.dirs {
            tree::subtree_pids(dir, &mut pids)?;
        }
        let me = std::process::id();
        if pids.contains(&me) {
            return Err(KillError::HoldsSelf {
                cgroup: self.cgroup.to_owned(),
                pid: me,
            });
        }
        Ok(pids)
    }

    /// pidfds for the processes of `pids` that still exist.
    fn open(&self, pids: &[u32]) -> Result<Vec<PidFd>, KillError> {
        let mut pidfds = Vec::with_capacity(pids.len());
        for &pid in pids {
            if let Some(pidfd) =
                PidFd::open(pid).map_err(|e| self.process_error(pid, "opening", e))?
            {
                pidfds.push(pidfd);
            }
        }
        Ok(pidfds)
    }

    /// Sends `signal` to every process of `pids` the pod still holds (never
    /// pid 1 or the agent), [`SIGNAL_BATCH`] pidfds at a time. Returns how
    /// many were signalled and, with SIGKILL, the pidfds of the first
    /// [`SIGNAL_BATCH`] of them, whose memory is to be reaped.
    fn signal_batched(
        &self,
        pids: &BTreeSet<u32>,
        signal: libc::c_int,
    ) -> Result<(u32, Vec<PidFd>), KillError> {
        let me = std::process::id();
        let targets: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&pid| pid > 1 && pid != me)
            .collect();
        let mut sent = 0;
        let mut to_reap = Vec::new();
        for batch in targets.chunks(SIGNAL_BATCH) {
            let opened = self.open(batch)?;
            // With the pidfds open, the pids the pod still lists are its own
            // processes (see the module's documentation).
            let listed = self.pids()?;
            let pidfds: Vec<PidFd> = opened
                .into_iter()
                .filter(|pidfd| listed.contains(&pidfd.pid))
                .collect();
            for pidfd in pidfds {
                if self.signal(&pidfd, signal)? {
                    sent += 1;
                    if signal == libc::SIGKILL && to_reap.len() < SIGNAL_BATCH {
                        to_reap.push(pidfd);
                    }
                }
            }
        }
        Ok((sent, to_reap))
    }

    /// `Ok(false)` if the process was already gone.
    fn signal(&self, pidfd: &PidFd, signal: libc::c_int) -> Result<bool, KillError> {
        pidfd
            .signal(signal)
            .map_err(|e| self.process_error(pidfd.pid, "signalling", e))
    }

    /// Starts reaping the memory of SIGKILLed processes on at most one
    /// blocking thread per CPU, in parallel with each other and with the
    /// processes' own exits. With `kill`, the processes are not killed yet:
    /// the first thread sends the kill and reaps at once, and the others
    /// wait for it.
    fn reap(&self, pidfds: Vec<PidFd>, kill: Option<KillFirst>) -> Reaping {
        let pidfds: Vec<PidFd> = {
            let mut reaping = lock(&self.reaping);
            pidfds
                .into_iter()
                .filter(|pidfd| reaping.insert(pidfd.pid))
                .collect()
        };
        let reapers = self.reapers.min(pidfds.len());
        let mut shares: Vec<Vec<PidFd>> = (0..reapers).map(|_| Vec::new()).collect();
        for (i, pidfd) in pidfds.into_iter().enumerate() {
            shares[i % reapers].push(pidfd);
        }
        let mut reaping = Reaping {
            cgroup: self.cgroup.to_owned(),
            first_victims: shares
                .iter()
                .filter_map(|share| Some(share.first()?.pid))
                .collect(),
            begun: Vec::with_capacity(reapers),
            threads: Vec::with_capacity(reapers),
        };
        let gate = kill.as_ref().map(|kill| Arc::clone(&kill.gate));
        let mut kill = kill;
        for share in shares {
            let (begin, begun) = oneshot::channel();
            reaping.begun.push(begun);
            let pids = share.iter().map(|pidfd| pidfd.pid).collect();
            let being_reaped = Arc::clone(&self.reaping);
            let sends_the_kill = kill.take();
            let gate = gate.clone();
            let thread = tokio::task::spawn_blocking(move || {
                // No kill, no reaping: its victims may be reaped by a later
                // kill.
                let let_go = |share: &[PidFd]| {
                    lock(&being_reaped).retain(|pid| !share.iter().any(|p| p.pid == *pid));
                    Vec::new()
                };
                // The thread that kills reaps where it runs: moving first
                // would give the victims the time to let go of their memory.
                let _off_victim_cpu = match sends_the_kill {
                    Some(kill) => {
                        if !kill.send() {
                            return let_go(&share);
                        }
                        None
                    }
                    None => share
                        .first()
                        .and_then(|pidfd| OffVictimCpu::enter(pidfd.pid)),
                };
                if gate.is_some_and(|gate| !gate.wait()) {
                    return let_go(&share);
                }
                let _ = begin.send(());
                share
                    .iter()
                    .map(|pidfd| {
                        let released = pidfd.release_memory();
                        lock(&being_reaped).remove(&pidfd.pid);
                        (pidfd.pid, released)
                    })
                    .collect::<Vec<_>>()
            });
            reaping.threads.push((pids, thread));
        }
        reaping
    }

    /// `cgroup.kill`, with the memory of what it kills reaped at once,
    /// until `deadline`.
    ///
    /// The kill is sent by the first reaper thread, which then reaps at
    /// once: `process_mrelease` reaps only while a victim still holds its
    /// memory, and a victim killed unfrozen lets go of it (`exit_mm`) as
    /// soon as it runs, then frees it alone. Reapers woken after the kill
    /// came too late on every v2 kill of the bench (ESRCH), and its 2 GiB
    /// bomb took 1.2–1.9 s to come back against 0.8–1.1 s for the bench's
    /// oracle, whose `process_mrelease` follows its SIGKILL on the same
    /// thread.
    async fn cgroup_kill(
        &self,
        file: &Path,
        started: Instant,
        deadline: Instant,
        report: &mut KillReport,
    ) -> Result<(), KillError> {
        // Best effort, and nothing here may keep the kill from happening (a
        // listing that fails, a file limit, a pid gone): what is listed now
        // is what the kill will reach. A process forked before the kill
        // lands is killed all the same, only not reaped at once. A pid
        // reused by a live process outside the pod before its pidfd is open
        // is refused by process_mrelease (not dying), so nothing is hurt.
        let me = std::process::id();
        let listed = self.pids().unwrap_or_else(|error| {
            debug!(cgroup = self.cgroup, %error, "cannot list the pod to reap it: killing it unreaped");
            BTreeSet::new()
        });
        let mut pidfds = Vec::new();
        for pid in listed
            .into_iter()
            .filter(|&pid| pid > 1 && pid != me)
            .take(SIGNAL_BATCH)
        {
            match PidFd::open(pid) {
                Ok(Some(pidfd)) => pidfds.push(pidfd),
                Ok(None) => {}
                Err(error) => {
                    report.mrelease_failed += 1;
                    debug!(cgroup = self.cgroup, pid, %error, "no pidfd for a process to reap");
                }
            }
        }
        let sent = if pidfds.is_empty() {
            send_cgroup_kill(file)
        } else {
            let (kill, sent) = KillFirst::new(file);
            let reaping = self.reap(pidfds, Some(kill));
            // A thread that does not run at once (the blocking pool busy)
            // must not hold the kill back: it is sent from here then (the
            // thread's own, later, is a harmless second write).
            let handoff = deadline.min(Instant::now() + KILL_HANDOFF);
            let sent = match tokio::time::timeout_at(handoff, sent).await {
                Ok(Ok(sent)) => sent,
                Ok(Err(_)) | Err(_) => send_cgroup_kill(file),
            };
            if sent.is_ok() {
                report.first_sigkill_after = Some(started.elapsed());
                report.rounds = 1;
            }
            sent.map_err(|e| KillError::io(file, e))?;
            return reaping.finish(started, deadline, report).await;
        };
        sent.map_err(|e| KillError::io(file, e))?;
        report.first_sigkill_after = Some(started.elapsed());
        report.rounds = 1;
        Ok(())
    }

    /// Freeze, SIGKILL all, release memory, thaw; again until the subtree
    /// is empty or `deadline`.
    async fn signal_rounds(
        &self,
        freezer: Option<&Freezer>,
        started: Instant,
        deadline: Instant,
        report: &mut KillReport,
    ) -> Result<(), KillError> {
        loop {
            let mut thaw = match freezer {
                Some(freezer) => {
                    let guard = ThawOnDrop(freezer);
                    if freezer.freeze()? {
                        if self
                            .wait_frozen(freezer, deadline, &mut report.freeze_holdouts)
                            .await?
                        {
                            report.frozen = true;
                            report.frozen_after.get_or_insert(started.elapsed());
                        }
                    } else {
                        debug!(
                            cgroup = self.cgroup,
                            "pod's freezer cgroup is gone: its tasks exited"
                        );
                    }
                    Some(guard)
                }
                None => None,
            };
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(());
            }
            report.rounds += 1;
            let signalled_at = started.elapsed();
            let (sent, to_reap) = self.signal_batched(&pids, libc::SIGKILL)?;
            if sent > 0 {
                report.sigkill_sent += sent;
                report.first_sigkill_after.get_or_insert(signalled_at);
            }
            // The reapers take hold of the frozen victims' memory first:
            // thawed, a victim's exit would detach it from its memory before
            // a reaper could find it, and free it alone.
            let mut reaping = self.reap(to_reap, None);
            // Read before the reapers are seen to begin: their threads
            // were idle, and waking them takes longer than this.
            let resident = thaw
                .is_some()
                .then(|| resident_pages(&reaping.first_victims))
                .flatten();
            reaping.begun(deadline).await;
            if let Some(resident) = resident {
                reapers_hold(&reaping.first_victims, resident).await;
            }
            // Frozen tasks die only once thawed; every one listed has its
            // SIGKILL, so none runs user code again (no fork escapes).
            if let Some(thaw) = thaw.take() {
                drop(thaw);
                report.thawed_after.get_or_insert(started.elapsed());
            }
            reaping.finish(started, deadline, report).await?;
            let round_end = deadline.min(Instant::now() + ROUND_WAIT);
            if self.wait_empty(round_end).await? || Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// Whether the freezer reported `FROZEN` in time (not if the cgroup went
    /// away meanwhile). Still freezing [`SLOW_FREEZE`] on, the tasks it
    /// waits on are named once in `holdouts`, unless they already name an
    /// earlier round's.
    async fn wait_frozen(
        &self,
        freezer: &Freezer,
        deadline: Instant,
        holdouts: &mut Vec<Holdout>,
    ) -> Result<bool, KillError> {
        let started = Instant::now();
        let until = deadline.min(started + FREEZE_DEADLINE);
        let mut looked = !holdouts.is_empty();
        let mut pacer = Pacer::new();
        loop {
            match freezer.is_frozen()? {
                Some(true) => return Ok(true),
                Some(false) => {}
                None => {
                    debug!(
                        cgroup = self.cgroup,
                        "pod's freezer cgroup removed while freezing: its tasks exited"
                    );
                    return Ok(false);
                }
            }
            if !looked && started.elapsed() >= SLOW_FREEZE {
                looked = true;
                // Only to explain the wait: a listing that fails here fails
                // again below, where it counts.
                if let Ok(pids) = self.pids() {
                    *holdouts = freeze_holdouts(pids);
                }
            }
            if Instant::now() >= until {
                warn!(cgroup = self.cgroup, freezer = %freezer.dir().display(),
                    holdouts = describe_holdouts(holdouts),
                    "not frozen within {FREEZE_DEADLINE:?}; killing it unfrozen");
                return Ok(false);
            }
            pacer.sleep(FREEZE_POLL).await;
        }
    }

    /// Polls until the subtree holds no process (`true`) or `until` passes
    /// (`false`); checks at least once.
    async fn wait_empty(&self, until: Instant) -> Result<bool, KillError> {
        self.wait_for(until, |pids| pids.is_empty()).await
    }

    async fn wait_for(
        &self,
        until: Instant,
        done: impl Fn(&BTreeSet<u32>) -> bool,
    ) -> Result<bool, KillError> {
        loop {
            if done(&self.pids()?) {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            tokio::time::sleep(POLL_INTERVAL.min(until - Instant::now())).await;
        }
    }

    fn timeout(&self, started: Instant) -> KillError {
        KillError::Timeout {
            cgroup: self.cgroup.to_owned(),
            pids: match self.pids() {
                Ok(pids) => pids.into_iter().collect(),
                Err(e) => return e,
            },
            waited: started.elapsed(),
        }
    }

    fn process_error(&self, pid: u32, action: &'static str, source: io::Error) -> KillError {
        KillError::Process {
            cgroup: self.cgroup.to_owned(),
            pid,
            action,
            source,
        }
    }
}

/// Waits, at most [`REAPERS_HOLD`], until the resident memory of the
/// reapers' `first_victims` has fallen [`UNMAPPING_SEEN_PAGES`] below
/// `resident` pages (taken before the reapers began): they are unmapping, so
/// they hold the victims' memory, and a thawed victim's exit frees beside
/// them instead of taking the memory from them. Victims with little memory
/// wait the whole bound. A victim's resident memory falls as a reaper
/// unmaps each page table; its cgroup's charge falls only as each batch of
/// about 40 MiB is freed, and the cgroup's `total_rss` once the memory
/// statistics are flushed, each a few milliseconds in (docs/design.md).
/// The loop looks, not another thread: one woken there would have to share
/// a CPU with a reaper or wait for it.
async fn reapers_hold(first_victims: &[u32], resident: u64) {
    let until = Instant::now() + REAPERS_HOLD;
    let mut pacer = Pacer::new();
    while resident_pages(first_victims)
        .is_some_and(|now| now.saturating_add(UNMAPPING_SEEN_PAGES) > resident)
        && Instant::now() < until
    {
        pacer.sleep(REAPERS_POLL).await;
    }
}

/// The resident pages of `pids` (`/proc/<pid>/statm`); a process gone
/// counts none. `None` when none can be read.
fn resident_pages(pids: &[u32]) -> Option<u64> {
    let mut read_any = false;
    let mut pages = 0;
    for pid in pids {
        let Ok(statm) = std::fs::read_to_string(format!("/proc/{pid}/statm")) else {
            continue;
        };
        if let Some(resident) = statm
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<u64>().ok())
        {
            pages += resident;
            read_any = true;
        }
    }
    read_any.then_some(pages)
}

/// `process_mrelease` calls under way on blocking threads.
struct Reaping {
    cgroup: String,
    /// The first process each thread reaps.
    first_victims: Vec<u32>,
    /// Each thread says when it begins its calls.
    begun: Vec<oneshot::Receiver<()>>,
    /// Each thread, with the processes it reaps.
    threads: Vec<(Vec<u32>, tokio::task::JoinHandle<Vec<Reaped>>)>,
}

/// A victim's pid and what `process_mrelease` answered.
type Reaped = (u32, io::Result<()>);

impl Reaping {
    /// Returns once every thread has begun, or at `deadline`.
    async fn begun(&mut self, deadline: Instant) {
        for begun in self.begun.drain(..) {
            // A thread that ended early, or never began, is reported by
            // `finish`.
            let _ = tokio::time::timeout_at(deadline, begun).await;
        }
    }

    /// Waits for every call until `deadline`; counts them in `report`
    /// (failures only count: mostly a victim that had exited). Threads
    /// still blocked then are left to end on their own: nothing can cut a
    /// `process_mrelease` short, and they hold nothing but their victims'
    /// pidfds.
    async fn finish(
        self,
        started: Instant,
        deadline: Instant,
        report: &mut KillReport,
    ) -> Result<(), KillError> {
        let mut stuck = 0;
        let mut victims = Vec::new();
        for (pids, thread) in self.threads {
            let results = match tokio::time::timeout_at(deadline, thread).await {
                Ok(Ok(results)) => results,
                Ok(Err(error)) => {
                    warn!(cgroup = self.cgroup, %error, "a process_mrelease thread failed");
                    report.mrelease_failed += 1;
                    continue;
                }
                Err(_) => {
                    stuck += 1;
                    victims.extend(pids);
                    continue;
                }
            };
            for (pid, result) in results {
                match result {
                    Ok(()) => report.mrelease_ok += 1,
                    Err(error) => {
                        report.mrelease_failed += 1;
                        debug!(cgroup = self.cgroup, pid, %error, "process_mrelease failed");
                    }
                }
            }
        }
        if stuck > 0 {
            return Err(KillError::ReapersStuck {
                cgroup: self.cgroup,
                stuck,
                victims,
                waited: started.elapsed(),
            });
        }
        report.released_after.get_or_insert(started.elapsed());
        Ok(())
    }
}

/// Writes `cgroup.kill`. A live cgroup never loses it, and it was there
/// when the method was chosen: ENOENT (path gone, or the cgroup already
/// offline) or ENODEV (its files deactivated while the directory is still
/// listed) mean it is being removed, which the kernel allows only once it
/// is empty: nothing to kill.
fn send_cgroup_kill(file: &Path) -> io::Result<()> {
    match tree::write_existing(file, "1") {
        Err(e) if is_gone(&e) => Ok(()),
        other => other,
    }
}

/// The kill a reaper thread sends before it reaps, and what it tells the
/// other reapers and the kill.
struct KillFirst {
    file: PathBuf,
    sent: Option<oneshot::Sender<io::Result<()>>>,
    gate: Arc<Gate>,
}

impl KillFirst {
    fn new(file: &Path) -> (Self, oneshot::Receiver<io::Result<()>>) {
        let (sent, result) = oneshot::channel();
        let kill = Self {
            file: file.to_owned(),
            sent: Some(sent),
            gate: Arc::default(),
        };
        (kill, result)
    }

    /// Sends the kill, lets the other reapers go (or, failed, shuts them
    /// out) and tells the kill; whether it was sent.
    fn send(mut self) -> bool {
        let result = send_cgroup_kill(&self.file);
        let sent = result.is_ok();
        self.gate.set(sent);
        if let Some(told) = self.sent.take() {
            let _ = told.send(result);
        }
        sent
    }
}

impl Drop for KillFirst {
    /// Never sent (its thread never ran): the other reapers let go.
    fn drop(&mut self) {
        self.gate.set(false);
    }
}

/// Holds reapers made before their victims' kill until it is sent (open)
/// or has failed (shut).
#[derive(Default)]
struct Gate {
    open: Mutex<Option<bool>>,
    changed: Condvar,
}

impl Gate {
    /// Opens or shuts it, once.
    fn set(&self, open: bool) {
        lock(&self.open).get_or_insert(open);
        self.changed.notify_all();
    }

    /// Blocks until it is opened (`true`) or shut (`false`).
    fn wait(&self) -> bool {
        let mut state = lock(&self.open);
        loop {
            if let Some(open) = *state {
                return open;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A panic elsewhere while holding the lock leaves plain data behind.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Thaws the pod when a round ends, however it ends (an error included):
/// a pod must never be left frozen.
struct ThawOnDrop<'a>(&'a Freezer);

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.0.thaw_subtree() {
            warn!(%error, "thawing a killed pod failed");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
