//! The executor against fixture directories shaped like cgroupfs. No test
//! here signals anything: the only pids listed are pid 1 (which the
//! executor never signals) and the test's own (which it refuses).
use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use super::*;
use crate::testing::LogCapture;

/// A temporary directory removed on drop.
pub(crate) struct Fixture {
    root: PathBuf,
}

impl Fixture {
    pub(crate) fn new(name: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "evictd-kill-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&root).unwrap();
        Self { root }
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// A cgroup directory whose `cgroup.procs` holds `procs`.
    pub(crate) fn cgroup(&self, rel: &str, procs: &str) -> PathBuf {
        let dir = self.path(rel);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cgroup.procs"), procs).unwrap();
        dir
    }

    /// A v1 freezer cgroup, thawed.
    fn freezer(&self, rel: &str) -> PathBuf {
        let dir = self.cgroup(rel, "");
        fs::write(dir.join("freezer.state"), "THAWED\n").unwrap();
        dir
    }

    fn v1(&self) -> CgroupFs {
        CgroupFs {
            version: CgroupVersion::V1,
            memory_root: self.path("memory"),
            pids_root: Some(self.path("pids")),
            freezer_root: Some(self.path("freezer")),
        }
    }

    fn v2(&self) -> CgroupFs {
        CgroupFs {
            version: CgroupVersion::V2,
            memory_root: self.path("unified"),
            pids_root: Some(self.path("unified")),
            freezer_root: None,
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

#[tokio::test]
async fn v2_writes_cgroup_kill_once_for_the_subtree() {
    let fixture = Fixture::new("v2");
    let pod = fixture.cgroup("unified/kubepods/pod1", "");
    fixture.cgroup("unified/kubepods/pod1/c1", "");
    fs::write(pod.join("cgroup.kill"), "").unwrap();
    let report = Killer::new(fixture.v2())
        .kill_pod("/kubepods/pod1", Duration::ZERO, &Sandbox::Unknown)
        .await
        .unwrap();
    assert_eq!(read(&pod.join("cgroup.kill")), "1");
    assert_eq!(report.method, KillMethod::CgroupKill);
    assert_eq!((report.rounds, report.sigkill_sent), (1, 0));
    assert!(report.first_sigkill_after.is_some());
    assert!(!pod.join("c1/cgroup.kill").exists());
}

#[test]
fn a_v2_kill_is_sent_even_when_no_thread_can_run_its_reaper() {
    // One blocking thread, held: the reaper that would send the kill never
    // runs. (The child is only listed: writing the fixture's cgroup.kill
    // signals nothing, and process_mrelease refuses a process not dying.)
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    let fixture = Fixture::new("v2-busy");
    let mut listed = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pod = fixture.cgroup("unified/pod1", &format!("{}\n", listed.id()));
    fs::write(pod.join("cgroup.kill"), "").unwrap();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let written = runtime.block_on(async {
        let busy = tokio::task::spawn_blocking(move || {
            let _ = held.recv();
        });
        let killer = Killer::new(fixture.v2()).with_deadline(Duration::from_millis(500));
        // Fails at its deadline: the listed child never leaves the file.
        let _ = killer
            .kill_pod("/pod1", Duration::ZERO, &Sandbox::Unknown)
            .await;
        let written = read(&pod.join("cgroup.kill"));
        release.send(()).unwrap();
        busy.await.unwrap();
        written
    });
    let _ = listed.kill();
    let _ = listed.wait();
    assert_eq!(written, "1");
}

#[tokio::test]
async fn the_threads_of_a_kill_are_started_beforehand_all_at_once() {
    let fixture = Fixture::new("threads");
    let killer = Killer::new(fixture.v1());
    // Each thread waits for all the others: fewer threads would never end.
    tokio::time::timeout(Duration::from_secs(10), killer.ready_threads())
        .await
        .expect("a reaper thread per CPU running at once");
}

#[tokio::test]
async fn v2_without_cgroup_kill_falls_back_to_signals() {
    let fixture = Fixture::new("v2-old");
    let pod = fixture.cgroup("unified/pod1", "");
    let report = Killer::new(fixture.v2())
        .kill_pod("/pod1", Duration::ZERO, &Sandbox::Unknown)
        .await
        .unwrap();
    assert_eq!(report.method, KillMethod::Signals);
    assert_eq!(report.rounds, 0);
    assert!(!pod.join("cgroup.kill").exists());
}

#[tokio::test]
async fn an_empty_v1_pod_is_frozen_then_thawed_and_reported_empty() {
    let fixture = Fixture::new("v1-empty");
    fixture.cgroup("memory/pod1/c1", "");
    let freezer = fixture.freezer("freezer/pod1");
    let report = Killer::new(fixture.v1())
        .kill_pod("/pod1", Duration::from_secs(30), &Sandbox::Unknown)
        .await
        .unwrap();
    assert_eq!(report.method, KillMethod::Signals);
    assert_eq!((report.sigterm_sent, report.sigkill_sent), (0, 0));
    assert_eq!(report.rounds, 0);
    assert!(report.frozen);
    assert_eq!(read(&freezer.join("freezer.state")), "THAWED");
    assert!(report.empty_after < Duration::from_secs(30));
}

#[test]
fn lists_the_subtree_in_every_v1_hierarchy_once() {
    let fixture = Fixture::new("v1-list");
    fixture.cgroup("memory/pod1", "10\n");
    fixture.cgroup("memory/pod1/c1", "11\n");
    fixture.cgroup("pids/pod1/c1", "11\n42\n");
    fixture.freezer("freezer/pod1");
    fixture.cgroup("freezer/pod1/c2", "43\n");
    let killer = Killer::new(fixture.v1());
    let dirs = killer.listed_dirs("/pod1");
    assert_eq!(dirs.len(), 3);
    let pod = Pod {
        cgroup: "/pod1",
        dirs,
        reapers: 1,
        reaping: Arc::default(),
    };
    assert_eq!(
        pod.pids().unwrap().into_iter().collect::<Vec<_>>(),
        [10, 11, 42, 43]
    );
    // v2: one hierarchy, listed once.
    assert_eq!(Killer::new(fixture.v2()).listed_dirs("/pod1").len(), 1);
}

#[tokio::test]
async fn refuses_a_pod_that_holds_the_agent_before_freezing_it() {
    let fixture = Fixture::new("self");
    fixture.cgroup("memory/pod1", "");
    fixture.cgroup("memory/pod1/c1", &format!("1\n{}\n", std::process::id()));
    let freezer = fixture.freezer("freezer/pod1");
    fs::write(freezer.join("freezer.state"), "UNTOUCHED").unwrap();
    let err = Killer::new(fixture.v1())
        .kill_pod("/pod1", Duration::from_secs(1), &Sandbox::Unknown)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, KillError::HoldsSelf { cgroup, pid } if cgroup == "/pod1" && *pid == std::process::id()),
        "{err}"
    );
    assert!(err.to_string().contains("evictd itself"), "{err}");
    assert_eq!(read(&freezer.join("freezer.state")), "UNTOUCHED");
}

#[tokio::test]
async fn refuses_paths_beyond_one_pod() {
    let fixture = Fixture::new("paths");
    let killer = Killer::new(fixture.v1());
    for bad in ["", "/", "/kubepods/../.."] {
        let err = killer
            .kill_pod(bad, Duration::ZERO, &Sandbox::Unknown)
            .await
            .unwrap_err();
        assert!(
            matches!(err, KillError::UnsafePath { .. }),
            "{bad:?}: {err}"
        );
    }
}

#[tokio::test]
async fn a_pod_that_never_empties_times_out_naming_what_is_left_and_is_thawed() {
    let fixture = Fixture::new("timeout");
    // pid 1 is never signalled, so it stays listed.
    fixture.cgroup("memory/pod1", "");
    fixture.cgroup("memory/pod1/c1", "1\n");
    let freezer = fixture.freezer("freezer/pod1");
    let container = fixture.freezer("freezer/pod1/c1");
    fs::write(container.join("freezer.state"), "FROZEN\n").unwrap();
    let deadline = Duration::from_millis(50);
    let err = Killer::new(fixture.v1())
        .with_deadline(deadline)
        .kill_pod("/pod1", Duration::ZERO, &Sandbox::Unknown)
        .await
        .unwrap_err();
    match &err {
        KillError::Timeout {
            cgroup,
            pids,
            waited,
        } => {
            assert_eq!(cgroup, "/pod1");
            assert_eq!(pids, &[1]);
            assert!(*waited >= deadline);
        }
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("\"/pod1\" still holds pids [1]"),
        "{err}"
    );
    assert_eq!(read(&freezer.join("freezer.state")), "THAWED");
    assert_eq!(read(&container.join("freezer.state")), "THAWED");
}

/// The pod's processes exited and kubelet removed its cgroups after the
/// executor found the freezer but before it froze it.
#[tokio::test]
async fn a_pod_removed_before_its_freeze_is_no_error() {
    let fixture = Fixture::new("gone-before-freeze");
    let memory = fixture.cgroup("memory/pod1", "");
    let dir = fixture.freezer("freezer/pod1");
    let freezer = Freezer::at(dir.clone()).unwrap();
    fs::remove_dir_all(&memory).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    let pod = Pod {
        cgroup: "/pod1",
        dirs: vec![memory, dir],
        reapers: 1,
        reaping: Arc::default(),
    };
    let (log, _guard) = LogCapture::start();
    let mut report = KillReport::new(KillMethod::Signals, 0);
    let started = Instant::now();
    pod.signal_rounds(
        Some(&freezer),
        started,
        started + DEFAULT_KILL_DEADLINE,
        &mut report,
    )
    .await
    .unwrap();
    assert!(!report.frozen);
    assert_eq!((report.rounds, report.sigkill_sent), (0, 0));
    assert_eq!(log.problems(), Vec::<String>::new());
    assert!(log.contains("freezer cgroup is gone"), "{:?}", log.lines());
}

/// Removed while the executor waits for `FROZEN`: the wait ends at once,
/// without the warning a pod that will not freeze gets.
#[tokio::test]
async fn a_pod_removed_while_freezing_ends_the_wait_quietly() {
    let fixture = Fixture::new("gone-while-freezing");
    let dir = fixture.freezer("freezer/pod1");
    let freezer = Freezer::at(dir.clone()).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    let pod = Pod {
        cgroup: "/pod1",
        dirs: vec![dir],
        reapers: 1,
        reaping: Arc::default(),
    };
    let (log, _guard) = LogCapture::start();
    let started = Instant::now();
    let mut holdouts = Vec::new();
    let frozen = pod
        .wait_frozen(&freezer, started + DEFAULT_KILL_DEADLINE, &mut holdouts)
        .await
        .unwrap();
    assert!(!frozen);
    assert!(started.elapsed() < FREEZE_DEADLINE);
    assert_eq!(holdouts, []);
    assert_eq!(log.problems(), Vec::<String>::new());
    assert!(log.contains("removed while freezing"), "{:?}", log.lines());
}

/// A pod still freezing [`SLOW_FREEZE`] after the write names the tasks
/// the freezer waits on, kept for the report and given in the warning of
/// a freeze that never completes.
#[tokio::test]
async fn a_freeze_that_does_not_complete_names_the_tasks_it_waits_on() {
    let fixture = Fixture::new("holdouts");
    // pid 1 is in no freezer this test made: nothing ever stops it.
    let dir = fixture.cgroup("freezer/pod1", "1\n");
    fs::write(dir.join("freezer.state"), "FREEZING\n").unwrap();
    let freezer = Freezer::at(dir.clone()).unwrap();
    let pod = Pod {
        cgroup: "/pod1",
        dirs: vec![dir],
        reapers: 1,
        reaping: Arc::default(),
    };
    let (log, _guard) = LogCapture::start();
    let mut holdouts = Vec::new();
    let frozen = pod
        .wait_frozen(&freezer, Instant::now() + 20 * SLOW_FREEZE, &mut holdouts)
        .await
        .unwrap();
    assert!(!frozen);
    assert!(!holdouts.is_empty());
    assert!(holdouts.iter().all(|task| task.pid == 1), "{holdouts:?}");
    assert!(log.contains("not frozen within"), "{:?}", log.lines());
    assert!(
        log.contains(&describe_holdouts(&holdouts)),
        "{:?}",
        log.lines()
    );
}

/// A pod a killed agent left frozen is thawed at the pod's level only: a
/// container paused on its own stays paused, and pods frozen only through
/// an ancestor, or not at all, are left alone.
#[test]
fn thaws_pods_left_frozen_at_their_own_level_only() {
    let fixture = Fixture::new("abandoned");
    let frozen = fixture.freezer("freezer/kubepods/pod-left");
    fs::write(frozen.join("freezer.state"), "FROZEN\n").unwrap();
    fs::write(frozen.join("freezer.self_freezing"), "1\n").unwrap();
    let paused = fixture.freezer("freezer/kubepods/pod-left/paused");
    fs::write(paused.join("freezer.state"), "FROZEN\n").unwrap();
    fs::write(paused.join("freezer.self_freezing"), "1\n").unwrap();
    let running = fixture.freezer("freezer/kubepods/pod-running");
    fs::write(running.join("freezer.self_freezing"), "0\n").unwrap();
    let killer = Killer::new(fixture.v1());
    let (log, _guard) = LogCapture::start();
    let thawed = killer.thaw_abandoned(&[
        "/kubepods/pod-left",
        "/kubepods/pod-running",
        "/kubepods/pod-gone",
    ]);
    assert_eq!(thawed, ["/kubepods/pod-left"]);
    assert_eq!(read(&frozen.join("freezer.state")), "THAWED");
    assert_eq!(read(&paused.join("freezer.state")), "FROZEN\n");
    assert_eq!(read(&running.join("freezer.state")), "THAWED\n");
    assert_eq!(log.problems(), Vec::<String>::new());
    // v2 has no freezer hierarchy: nothing to do.
    assert!(
        Killer::new(fixture.v2())
            .thaw_abandoned(&["/kubepods/pod-left"])
            .is_empty()
    );
}

/// A pid listed by the pod when the kill reads it, but no longer once its
/// pidfd is open, is a process that left, or a pid reused outside the pod:
/// it is not signalled. `cgroup.procs` is a FIFO here, so each read sees
/// what the test says the pod holds at that moment.
#[tokio::test]
async fn a_pid_that_left_the_pod_before_its_pidfd_was_checked_is_not_signalled() {
    use std::{
        io::Write as _,
        os::unix::fs::OpenOptionsExt as _,
        process::Command,
        sync::{Arc, atomic::AtomicBool},
    };

    let fixture = Fixture::new("left");
    let pod = fixture.path("unified/pod1");
    fs::create_dir_all(&pod).unwrap();
    let procs = pod.join("cgroup.procs");
    nix::unistd::mkfifo(&procs, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // A live process outside the pod, as a reused pid would be.
    let mut outsider = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = outsider.id();
    // Listed for the refusal check and the round's listing; gone once its
    // pidfd is open; the pod empty from then on.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (procs, stop) = (procs.clone(), stop.clone());
        std::thread::spawn(move || {
            let listed = format!("{pid}\n");
            let mut read = 0;
            loop {
                if read >= 2 && stop.load(Ordering::Acquire) {
                    return;
                }
                let content = if read < 2 { listed.as_str() } else { "" };
                let mut fifo = fs::OpenOptions::new().write(true).open(&procs).unwrap();
                match fifo.write_all(content.as_bytes()) {
                    Ok(()) => read += 1,
                    // The open found the last reader still there, at its
                    // end of file and about to close: nobody read this
                    // content, the next reader will. (Before, the writer
                    // died here and the next reader waited for ever.)
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                    Err(e) => panic!("writing {}: {e}", procs.display()),
                }
            }
        })
    };
    let report = Killer::new(fixture.v2())
        .kill_pod("/pod1", Duration::ZERO, &Sandbox::Unknown)
        .await
        .unwrap();
    // Let the writer see the stop: a reader keeps its last open from
    // blocking.
    stop.store(true, Ordering::Release);
    let reader = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&procs)
        .unwrap();
    writer.join().unwrap();
    drop(reader);
    assert_eq!(report.method, KillMethod::Signals);
    assert_eq!(report.sigkill_sent, 0, "{report:?}");
    assert!(
        outsider.try_wait().unwrap().is_none(),
        "the process outside the pod lives"
    );
    outsider.kill().unwrap();
    outsider.wait().unwrap();
}
