//! However the agent ends, the kernel keeps nothing of it: its programs,
//! the links attaching them and its maps are all freed. Asserted through
//! the kernel's own object ids, only those this agent reported (other
//! agents run on the same kernel). Nothing is pinned: a pinned object keeps
//! a reference, so "freed" also proves "not pinned".
use std::{
    net::TcpListener,
    os::unix::process::ExitStatusExt as _,
    process::{Command, Stdio},
    sync::Mutex,
};

use evictd::kernel::triggers::{self, MemoryFalls, Mode};
use evictd_integration::{
    AGENT_DEADLINE, Agent, AgentLog, BpfObjects, agent_binary, load_probes, program_ids, wait_until,
};
use nix::sys::signal::Signal;
use rstest::rstest;

fn assert_freed(objects: &BpfObjects) {
    if let Err((timeout, left)) = objects.wait_freed(AGENT_DEADLINE) {
        panic!("{timeout}: still loaded {left:?}");
    }
}

/// SIGTERM (kubelet stopping the pod) and SIGINT (Ctrl-C) shut down
/// cleanly; SIGKILL and SIGABRT (what a panic does under `panic = "abort"`,
/// or a panic while unwinding) end the process where it stands, and the
/// kernel frees what its closed fds held.
#[rstest]
#[case::sigterm(Signal::SIGTERM)]
#[case::sigint(Signal::SIGINT)]
#[case::sigkill(Signal::SIGKILL)]
#[case::sigabrt(Signal::SIGABRT)]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn every_way_the_agent_ends_frees_its_programs_links_and_maps(#[case] signal: Signal) {
    // Every program linked at the end, however far the node is from a
    // threshold (the zone would unlink the memory hooks, and no PID line
    // the PID hooks: precise_hooks.rs).
    let mut agent = Agent::start(&[
        "--eviction-hard=pid.available<1",
        "--precise-hooks",
        "always",
    ])
    .unwrap();
    let attached = agent.log.expect("eBPF programs attached", &[]);
    agent.log.expect("protection armed", &[]);
    let ids = program_ids(&attached);
    let loaded = BpfObjects::of_programs(&ids);
    assert!(
        ids.iter().all(|id| loaded.programs.contains(id)),
        "{loaded:?}"
    );
    assert_eq!(
        loaded.links.len(),
        ids.len(),
        "one link per attached program: {loaded:?}"
    );
    assert!(!loaded.maps.is_empty(), "{loaded:?}");

    agent.signal(signal).unwrap();
    let (status, mut log) = agent.wait_exit().unwrap();
    if matches!(signal, Signal::SIGTERM | Signal::SIGINT) {
        assert!(status.success(), "{status:?}");
        log.expect("all eBPF programs detached", &[]);
    } else {
        assert_eq!(status.signal(), Some(signal as i32), "{status:?}");
    }
    assert_freed(&loaded);
}

/// SIGTERM as the agent starts, while its programs load (kubelet stopping
/// a pod it just started): handled once loading is done, as a clean stop.
#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_sigterm_while_the_programs_load_is_a_clean_stop() {
    let mut agent = Agent::start(&["--eviction-hard="]).unwrap();
    // Logged just before the programs load.
    agent.log.expect("cgroup hierarchies", &[]);
    agent.signal(Signal::SIGTERM).unwrap();
    let (status, mut log) = agent.wait_exit().unwrap();
    assert!(status.success(), "{status:?}");
    log.expect("SIGTERM received", &[]);
    let attached = log.expect("eBPF programs attached", &[]);
    log.expect("all eBPF programs detached", &[]);
    assert_freed(&BpfObjects::programs_only(&program_ids(&attached)));
}

/// An error after the programs are loaded: the metrics address is taken.
/// The agent says so, exits 1, and frees what it loaded on the way out.
#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn an_error_after_the_programs_are_loaded_frees_them() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let mut child = Command::new(agent_binary())
        .args(["--log-format", "json", "--eviction-hard="])
        .args(["--metrics-address", &address])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut log, reader) = AgentLog::read(child.stdout.take().unwrap());
    let mut status = None;
    let exited = wait_until(AGENT_DEADLINE, "the agent to fail", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the agent kept running on a taken address");
    }
    reader.join().unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{status:?}");
    let attached = log.expect("eBPF programs attached", &[]);
    let named = log.problems().into_iter().any(|line| {
        line["level"] == "ERROR" && line["message"].as_str().unwrap().contains(&address)
    });
    assert!(named, "no error naming {address}: {:#?}", log.seen);
    // The agent was gone before the test could look up its links and
    // maps; its program ids are what it reported.
    assert_freed(&BpfObjects::programs_only(&program_ids(&attached)));
}

/// A panic unwinds (the agent keeps the default `panic = "unwind"`, so
/// that a pod frozen for its kill is thawed by its guard), and unwinding
/// drops the programs: freed while the process still runs.
#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_panic_unwinding_past_the_loaded_programs_frees_them() {
    let loaded = Mutex::new(BpfObjects::default());
    let result = std::panic::catch_unwind(|| {
        // The programs the agent would attach on this kernel.
        let (capabilities, mut probes) = load_probes(256 * 1024).unwrap();
        for hook in
            triggers::choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge).hooks()
        {
            probes.attach(hook).unwrap();
        }
        let ids: Vec<u32> = probes.program_ids().into_values().collect();
        let objects = BpfObjects::of_programs(&ids);
        assert_eq!(objects.links.len(), ids.len(), "{objects:?}");
        *loaded.lock().unwrap() = objects;
        panic!("a bug with the programs loaded");
    });
    assert!(result.is_err());
    let loaded = loaded.into_inner().unwrap();
    assert!(
        !loaded.programs.is_empty() && !loaded.maps.is_empty(),
        "{loaded:?}"
    );
    assert_freed(&loaded);
}
