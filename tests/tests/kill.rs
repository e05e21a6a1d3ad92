//! The kill executor (`evictd::act::kill`) on the real kernel: real pod cgroups
//! in a private tree, real processes. Run as root, single-threaded (the
//! tests share the machine's cgroup hierarchies):
//! `cargo test -p evictd-integration --test kill -- --ignored --test-threads=1`.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{fs, os::unix::process::ExitStatusExt as _, path::PathBuf, sync::mpsc, time::Duration};

use evictd::{
    act::kill::{KillError, KillMethod, KillReport, Killer, Sandbox, freeze_holdouts},
    node::cgroupfs::CgroupFs,
};
use evictd_integration::{
    CgroupVersion, Controller, PrivateCgroupTree, Workload, scaled, wait_until,
};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
/// How long a kill may take here: generous for a loaded 2-core machine.
const KILL_DEADLINE: Duration = Duration::from_secs(10);
/// How long a killed process, or its memory, may take to be gone.
const GONE_DEADLINE: Duration = Duration::from_secs(10);
/// What a pod cgroup may still be charged once its processes are gone:
/// kernel objects (dentries, slab) outlive them, and v1 usage is batched
/// per CPU.
const RESIDUE: u64 = 4 * MIB;

fn killer() -> Killer {
    Killer::new(CgroupFs::discover().unwrap()).with_deadline(scaled(KILL_DEADLINE))
}

/// On a runtime like the agent's: the kill's short polls wait on a
/// timerfd, which needs the runtime's I/O driver. No sandbox is known.
fn kill_pod(tree: &PrivateCgroupTree, rel: &str, grace: Duration) -> Result<KillReport, KillError> {
    kill_pod_with(tree, rel, grace, &Sandbox::Unknown)
}

fn kill_pod_with(
    tree: &PrivateCgroupTree,
    rel: &str,
    grace: Duration,
    sandbox: &Sandbox,
) -> Result<KillReport, KillError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(killer().kill_pod(&tree.relative_path(rel), grace, sandbox))
}

fn has_freezer(tree: &PrivateCgroupTree) -> bool {
    tree.layout().freezer.is_some()
}

/// The signal that ended `workload`, waiting for it to die.
fn death_signal(workload: &mut Workload) -> Option<i32> {
    let status = workload
        .wait_exit(GONE_DEADLINE)
        .unwrap()
        .expect("the workload died");
    status.signal()
}

/// No process in `rel` or below, in any hierarchy.
fn assert_empty(tree: &PrivateCgroupTree, rel: &str) {
    for hierarchy in tree.layout().hierarchies() {
        let dir = hierarchy.mount_point.join(tree.name()).join(rel);
        let mut stack = vec![dir];
        while let Some(dir) = stack.pop() {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            assert!(procs.trim().is_empty(), "{}: {procs:?}", dir.display());
            for entry in fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    stack.push(entry.path());
                }
            }
        }
    }
}

#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn kills_every_container_of_the_pod_returns_its_memory_and_spares_the_sibling() {
    let tree = PrivateCgroupTree::new().unwrap();
    for rel in [
        "kubepods/pod-a/c1",
        "kubepods/pod-a/c2",
        "kubepods/pod-b/c1",
    ] {
        tree.create(rel).unwrap();
    }
    let mut a1 = Workload::spawn_in(&tree, "kubepods/pod-a/c1", WORKLOAD).unwrap();
    let mut a2 = Workload::spawn_in(&tree, "kubepods/pod-a/c2", WORKLOAD).unwrap();
    let mut b1 = Workload::spawn_in(&tree, "kubepods/pod-b/c1", WORKLOAD).unwrap();
    a1.alloc(64 * MIB).unwrap();
    a2.alloc(64 * MIB).unwrap();
    b1.alloc(32 * MIB).unwrap();
    assert!(tree.memory_usage("kubepods/pod-a").unwrap() >= 128 * MIB);

    let report = kill_pod(&tree, "kubepods/pod-a", Duration::ZERO).unwrap();
    eprintln!("{report:?}");
    assert_empty(&tree, "kubepods/pod-a");
    let method = match tree.layout().memory.version {
        CgroupVersion::V1 => KillMethod::Signals,
        CgroupVersion::V2 => KillMethod::CgroupKill,
    };
    assert_eq!(report.method, method);
    assert_eq!(report.sigterm_sent, 0);
    assert_eq!(report.sigkill_sent, 2);
    assert!(report.rounds >= 1);
    assert_eq!(report.frozen, has_freezer(&tree));
    // Each was reaped beside its exit (or had exited by then): signals are
    // sent to the processes listed; after cgroup.kill, one may have left
    // the cgroup before the listing (the 7.2 guest's ends a process that
    // fast).
    let reaped = report.mrelease_ok + report.mrelease_failed;
    match method {
        KillMethod::Signals => assert_eq!(reaped, 2, "{report:?}"),
        _ => assert!(reaped <= 2, "{report:?}"),
    }
    if let Some(released_after) = report.released_after {
        assert!(released_after >= report.first_sigkill_after.unwrap());
    }
    assert!(report.first_sigkill_after.unwrap() <= report.empty_after);
    // A frozen pod is thawed after its SIGKILLs, once.
    assert_eq!(report.thawed_after.is_some(), has_freezer(&tree));
    if let Some(thawed_after) = report.thawed_after {
        assert!(thawed_after >= report.first_sigkill_after.unwrap());
    }
    assert_eq!(death_signal(&mut a1), Some(libc::SIGKILL));
    assert_eq!(death_signal(&mut a2), Some(libc::SIGKILL));
    wait_until(GONE_DEADLINE, "pod-a's memory to come back", || {
        tree.memory_usage("kubepods/pod-a").unwrap() < RESIDUE
    })
    .unwrap();
    if has_freezer(&tree) {
        assert_eq!(tree.freezer_state("kubepods/pod-a").unwrap(), "THAWED");
    }

    // The sibling pod is untouched.
    assert_eq!(b1.reported_pid().unwrap(), b1.pid());
    assert_eq!(
        tree.procs(Controller::Memory, "kubepods/pod-b/c1").unwrap(),
        [b1.pid()]
    );
    assert!(tree.memory_usage("kubepods/pod-b").unwrap() >= 32 * MIB);
}

#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn a_pod_whose_processes_keep_changing_pid_is_killed_whole() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("kubepods/pod-bomb/c1").unwrap();
    // Hoppers, their successors mid-fork, the reaper and the workload.
    tree.set_pids_limit("kubepods/pod-bomb", 64).unwrap();
    let mut workload = Workload::spawn_in(&tree, "kubepods/pod-bomb/c1", WORKLOAD).unwrap();
    let hoppers = 16;
    workload.command(&format!("hop {hoppers} 60")).unwrap();
    wait_until(GONE_DEADLINE, "the hoppers to start", || {
        tree.pids_current("kubepods/pod-bomb").unwrap() >= hoppers + 2
    })
    .unwrap();
    // They hop: some pid listed now is gone a moment later.
    let first = tree
        .procs(Controller::Memory, "kubepods/pod-bomb/c1")
        .unwrap();
    wait_until(GONE_DEADLINE, "a hopper to change pid", || {
        let now = tree
            .procs(Controller::Memory, "kubepods/pod-bomb/c1")
            .unwrap();
        first.iter().any(|pid| !now.contains(pid))
    })
    .unwrap();

    let report = kill_pod(&tree, "kubepods/pod-bomb", Duration::ZERO).unwrap();
    eprintln!("{report:?}");
    assert_empty(&tree, "kubepods/pod-bomb");
    assert_eq!(report.frozen, has_freezer(&tree));
    match report.method {
        // One signal per task, all listed and killed.
        KillMethod::Signals => {
            assert!(u64::from(report.sigkill_sent) >= hoppers + 2, "{report:?}");
        }
        // The kernel kills the whole subtree in one write; sigkill_sent only
        // counts the pidfds opened for process_mrelease just before, and a
        // hopper listed then may be gone (replaced) by the time it is opened.
        KillMethod::CgroupKill => assert_eq!(report.rounds, 1, "{report:?}"),
    }
    if report.frozen {
        // Frozen, no process could hop away between being listed and being
        // killed; each killed process is then reaped (or already gone,
        // which process_mrelease counts failed). Unfrozen, successors forked
        // meanwhile need another round.
        assert_eq!(
            report.mrelease_ok + report.mrelease_failed,
            report.sigkill_sent,
            "{report:?}"
        );
    }
    assert_eq!(death_signal(&mut workload), Some(libc::SIGKILL));
    // Every task is gone and reaped, none escaped.
    wait_until(GONE_DEADLINE, "the pod's tasks to be reaped", || {
        tree.pids_current("kubepods/pod-bomb").unwrap() == 0
    })
    .unwrap();
}

#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn soft_eviction_sigterms_first_and_sigkills_only_what_outlives_the_grace_period() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("kubepods/pod-polite/c1").unwrap();
    tree.create("kubepods/pod-stubborn/c1").unwrap();
    let mut polite = Workload::spawn_in(&tree, "kubepods/pod-polite/c1", WORKLOAD).unwrap();
    let mut stubborn = Workload::spawn_in(&tree, "kubepods/pod-stubborn/c1", WORKLOAD).unwrap();
    assert_eq!(stubborn.command("ignore-sigterm").unwrap(), "ignoring");

    // Exits on SIGTERM, well within its grace period: no SIGKILL.
    let grace = Duration::from_secs(10);
    let report = kill_pod(&tree, "kubepods/pod-polite", grace).unwrap();
    eprintln!("{report:?}");
    assert_eq!((report.sigterm_sent, report.sigkill_sent), (1, 0));
    assert_eq!(report.rounds, 0);
    assert_eq!(report.first_sigkill_after, None);
    assert!(report.empty_after < grace);
    assert_eq!(death_signal(&mut polite), Some(libc::SIGTERM));
    assert_empty(&tree, "kubepods/pod-polite");

    // Ignores SIGTERM: SIGKILLed once the grace period is over.
    let grace = Duration::from_millis(300);
    let report = kill_pod(&tree, "kubepods/pod-stubborn", grace).unwrap();
    eprintln!("{report:?}");
    assert_eq!((report.sigterm_sent, report.sigkill_sent), (1, 1));
    assert!(report.first_sigkill_after.unwrap() >= grace, "{report:?}");
    assert_eq!(death_signal(&mut stubborn), Some(libc::SIGKILL));
    assert_empty(&tree, "kubepods/pod-stubborn");
}

/// Puts one of this process's threads (v1) or the whole process (v2, where
/// single threads cannot move) into `rel`; undone on drop.
struct SelfInPod {
    release: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// v2: this process's own cgroup directory, to move back to.
    home: Option<PathBuf>,
}

impl SelfInPod {
    fn enter(tree: &PrivateCgroupTree, rel: &str) -> Self {
        if tree.layout().memory.version == CgroupVersion::V2 {
            let own = fs::read_to_string("/proc/self/cgroup").unwrap();
            let path = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .expect("a v2 entry");
            let home = tree
                .layout()
                .memory
                .mount_point
                .join(path.trim_start_matches('/'));
            tree.move_pid(rel, std::process::id()).unwrap();
            return Self {
                release: None,
                thread: None,
                home: Some(home),
            };
        }
        let (tid_tx, tid_rx) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            // Exiting takes the thread out of the pod's cgroup.
            let _ = released.recv();
        });
        let tid = tid_rx.recv_timeout(scaled(GONE_DEADLINE)).unwrap();
        tree.move_thread(rel, u32::try_from(tid).unwrap()).unwrap();
        Self {
            release: Some(release),
            thread: Some(thread),
            home: None,
        }
    }
}

impl Drop for SelfInPod {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(home) = &self.home {
            let _ = fs::write(home.join("cgroup.procs"), std::process::id().to_string());
        }
    }
}

#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn refuses_to_kill_a_pod_holding_the_agent_and_touches_nothing() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("kubepods/pod-self/c1").unwrap();
    tree.create("kubepods/pod-self/c2").unwrap();
    let mut bystander = Workload::spawn_in(&tree, "kubepods/pod-self/c1", WORKLOAD).unwrap();
    let inside = SelfInPod::enter(&tree, "kubepods/pod-self/c2");
    assert!(
        tree.procs(Controller::Memory, "kubepods/pod-self/c2")
            .unwrap()
            .contains(&std::process::id())
    );

    let err = kill_pod(&tree, "kubepods/pod-self", Duration::from_secs(5)).unwrap_err();
    match &err {
        KillError::HoldsSelf { cgroup, pid } => {
            assert_eq!(cgroup, &tree.relative_path("kubepods/pod-self"));
            assert_eq!(*pid, std::process::id());
        }
        other => panic!("{other}"),
    }
    drop(inside);
    // Nothing was signalled or frozen.
    assert_eq!(bystander.reported_pid().unwrap(), bystander.pid());
    if has_freezer(&tree) {
        assert_eq!(tree.freezer_state("kubepods/pod-self").unwrap(), "THAWED");
    }
    wait_until(GONE_DEADLINE, "this process to leave the pod", || {
        tree.procs(Controller::Memory, "kubepods/pod-self/c2")
            .unwrap()
            .is_empty()
    })
    .unwrap();

    // Without us inside it is killed as any pod.
    let report = kill_pod(&tree, "kubepods/pod-self", Duration::ZERO).unwrap();
    assert_eq!(report.sigkill_sent, 1);
    assert_eq!(death_signal(&mut bystander), Some(libc::SIGKILL));
}

/// Pods killed just as they end on their own and kubelet removes their
/// cgroups: between listing, freezing, signalling and thawing, any of the
/// pod's cgroups may vanish. Kills are started at every point of the
/// removal, over and over until it is done; each must succeed and log
/// nothing above debug.
#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn pods_that_end_and_vanish_while_being_killed_are_no_error() {
    const PODS: usize = 200;
    let tree = PrivateCgroupTree::new().unwrap();
    let log_path = std::env::temp_dir().join(format!("evictd-kill-race-{}.log", tree.name()));
    let log = std::sync::Arc::new(fs::File::create(&log_path).unwrap());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(log.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let killer = killer();
    let mut kills = 0;
    for index in 0..PODS {
        let pod = format!("kubepods/pod-race{index}");
        let container = format!("{pod}/c1");
        tree.create(&container).unwrap();
        let workload = Workload::spawn_in(&tree, &container, WORKLOAD).unwrap();
        let path = tree.relative_path(&pod);
        std::thread::scope(|scope| {
            // The pod's process dies and its cgroups go.
            let remover = scope.spawn(|| {
                drop(workload);
                tree.remove(&pod)
            });
            loop {
                let finished = remover.is_finished();
                let report =
                    runtime.block_on(killer.kill_pod(&path, Duration::ZERO, &Sandbox::Unknown));
                kills += 1;
                if let Err(e) = report {
                    panic!("{path}, kill {kills}: {e}");
                }
                if finished {
                    break;
                }
            }
            remover.join().unwrap().unwrap();
        });
    }
    let text = fs::read_to_string(&log_path).unwrap();
    fs::remove_file(&log_path).unwrap();
    let problems: Vec<&str> = text
        .lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    assert!(problems.is_empty(), "{problems:#?}");
    let vanished = text.lines().filter(|line| line.contains("gone")).count();
    eprintln!("{kills} kills of {PODS} vanishing pods; {vanished} met a freezer cgroup gone");
}

#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn a_pod_with_more_processes_than_the_soft_file_limit_is_emptied() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};

    const PROCESSES: u32 = 3000;
    const SOFT_LIMIT: u64 = 1024;
    let tree = PrivateCgroupTree::new().unwrap();
    tree.set_pids_limit("", 4096).unwrap();
    tree.create("kubepods/pod-many").unwrap();
    let mut workload = Workload::spawn_in(&tree, "kubepods/pod-many", WORKLOAD).unwrap();
    workload.set_command_deadline(scaled(Duration::from_secs(60)));
    assert_eq!(workload.fork(PROCESSES).unwrap(), u64::from(PROCESSES));
    // The soft limit a runtime may leave the agent; the kill must not need
    // a pidfd per process at once.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, SOFT_LIMIT.min(hard), hard).unwrap();
    let result = kill_pod(&tree, "kubepods/pod-many", Duration::ZERO);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let report = result.unwrap();
    eprintln!("{report:?}");
    assert_empty(&tree, "kubepods/pod-many");
    if report.method == KillMethod::Signals {
        assert!(
            report.sigkill_sent > PROCESSES,
            "every process signalled: {report:?}"
        );
    }
    assert_eq!(death_signal(&mut workload), Some(libc::SIGKILL));
}

#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn a_soft_eviction_spares_the_sandbox_the_runtime_names_its_sigterm_and_ends_it_once_the_containers_are_gone()
 {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("kubepods/pod-web/sandbox-id").unwrap();
    tree.create("kubepods/pod-web/app-id").unwrap();
    // Named `pause` to show the name counts for nothing: the runtime's
    // word does.
    let dir = tempfile_dir("sandbox");
    let pause = dir.join("pause");
    std::os::unix::fs::symlink(WORKLOAD, &pause).unwrap();
    let mut sandbox = Workload::spawn_in(&tree, "kubepods/pod-web/sandbox-id", WORKLOAD).unwrap();
    let mut app = Workload::spawn_in(&tree, "kubepods/pod-web/app-id", &pause).unwrap();

    let grace = Duration::from_secs(10);
    for known in [
        Sandbox::Named(vec!["sandbox-id".into()]),
        // No runtime: the API's containers say the same.
        Sandbox::NotContaining(vec!["app-id".into()]),
    ] {
        let report = kill_pod_with(&tree, "kubepods/pod-web", grace, &known).unwrap();
        eprintln!("{report:?}");
        assert_eq!(report.sigterm_sent, 1, "only the container: {report:?}");
        assert!(
            report.empty_after < grace,
            "no wait for the sandbox: {report:?}"
        );
        assert_eq!(death_signal(&mut app), Some(libc::SIGTERM));
        assert_eq!(death_signal(&mut sandbox), Some(libc::SIGKILL));
        assert_empty(&tree, "kubepods/pod-web");
        sandbox = Workload::spawn_in(&tree, "kubepods/pod-web/sandbox-id", WORKLOAD).unwrap();
        app = Workload::spawn_in(&tree, "kubepods/pod-web/app-id", &pause).unwrap();
    }
    // Nothing known: the SIGTERM goes to both.
    let report = kill_pod(&tree, "kubepods/pod-web", grace).unwrap();
    assert_eq!(report.sigterm_sent, 2, "{report:?}");
    assert_eq!(death_signal(&mut app), Some(libc::SIGTERM));
    assert_eq!(death_signal(&mut sandbox), Some(libc::SIGTERM));
    fs::remove_dir_all(dir).unwrap();
}

/// What a slow freeze names: a task the v1 freezer has stopped is no
/// holdout, the same task unfrozen is.
#[test]
#[ignore = "needs root and cgroups: run with --ignored --test-threads=1"]
fn a_task_the_freezer_stopped_is_no_holdout_and_a_thawed_one_is() {
    let tree = PrivateCgroupTree::new().unwrap();
    if !has_freezer(&tree) {
        eprintln!("no v1 freezer: nothing to stop tasks with");
        return;
    }
    tree.create("kubepods/pod-f/c1").unwrap();
    let mut task = Workload::spawn_in(&tree, "kubepods/pod-f/c1", WORKLOAD).unwrap();
    // It has answered, so it waits for the next command.
    task.alloc(MIB).unwrap();
    let pid = task.pid();
    let state = tree
        .dir(Controller::Freezer, "kubepods/pod-f")
        .join("freezer.state");
    fs::write(&state, "FROZEN").unwrap();
    wait_until(GONE_DEADLINE, "the pod frozen", || {
        tree.freezer_state("kubepods/pod-f").unwrap() == "FROZEN"
    })
    .unwrap();
    let frozen = freeze_holdouts([pid]);
    fs::write(&state, "THAWED").unwrap();
    assert_eq!(frozen, [], "stopped, yet named");
    let mut thawed = Vec::new();
    wait_until(GONE_DEADLINE, "the task named, asleep", || {
        thawed = freeze_holdouts([pid]);
        thawed
            .first()
            .is_some_and(|t| t.state == 'S' && t.waits_in.is_some())
    })
    .unwrap();
    assert!(thawed.iter().all(|t| t.pid == pid), "{thawed:?}");
    task.alloc(MIB).unwrap();
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("evictd-{name}-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    dir
}
