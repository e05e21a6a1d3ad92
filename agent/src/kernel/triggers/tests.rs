//! The choice of triggers on the kernels evictd is tested on, from their
//! capabilities as `Capabilities::detect` reports them there.
use std::collections::BTreeMap;

use super::{Trigger::Kernel, *};
use crate::{kernel::capabilities::Psi, node::cgroupfs::CgroupVersion};

/// Tracepoints (and arities) both test kernels have.
const COMMON: [(&str, usize); 9] = [
    ("mm_lru_insertion", 1),
    ("sched_switch", 4),
    ("mm_page_alloc", 4),
    ("mm_page_free", 2),
    ("sched_process_fork", 2),
    ("sched_process_free", 1),
    ("mark_victim", 2),
    ("cgroup_mkdir", 2),
    ("cgroup_rmdir", 2),
];

/// This machine: Linux 6.18, memory controller on cgroup v1.
fn linux_6_18_v1() -> Capabilities {
    let mut tracepoints: BTreeMap<&'static str, usize> = COMMON.into_iter().collect();
    tracepoints.insert("mod_memcg_lruvec_state", 3);
    tracepoints.insert("mod_memcg_state", 3);
    Capabilities {
        kernel_release: "6.18.0".into(),
        btf: Support::Yes,
        tracepoints,
        bpf: Support::Yes,
        cgroup_version: CgroupVersion::V1,
        memory_root: "/sys/fs/cgroup/memory".into(),
        pids_root: Some("/sys/fs/cgroup/pids".into()),
        psi: Psi {
            system: true,
            cgroup: false,
        },
        memcg_event_control: true,
        attach_failures: BTreeMap::new(),
    }
}

/// The VM guest: Debian's Linux 6.1 on pure cgroup v2 (no memcg stat
/// tracepoints; Debian backported the two-argument `mark_victim`).
fn linux_6_1_v2() -> Capabilities {
    Capabilities {
        kernel_release: "6.1.0-56-amd64".into(),
        tracepoints: COMMON.into_iter().collect(),
        cgroup_version: CgroupVersion::V2,
        memory_root: "/sys/fs/cgroup".into(),
        pids_root: Some("/sys/fs/cgroup".into()),
        psi: Psi {
            system: true,
            cgroup: true,
        },
        memcg_event_control: false,
        ..linux_6_18_v1()
    }
}

/// The VM guest on Debian's Linux 6.12 (bookworm): the tracepoints of 6.1,
/// so no memcg stat tracepoints either.
fn linux_6_12_v2() -> Capabilities {
    Capabilities {
        kernel_release: "6.12.117+deb12-amd64".into(),
        ..linux_6_1_v2()
    }
}

/// The VM guest on Debian's Linux 7.2 (trixie-backports): cgroup v2 with
/// the memcg stat tracepoints.
fn linux_7_2_v2() -> Capabilities {
    let mut capabilities = Capabilities {
        kernel_release: "7.2.12+deb13-amd64".into(),
        ..linux_6_1_v2()
    };
    capabilities.tracepoints.insert("mod_memcg_lruvec_state", 3);
    capabilities.tracepoints.insert("mod_memcg_state", 3);
    capabilities
}

fn trigger(triggers: &Triggers, purpose: Purpose) -> Trigger {
    triggers.get(purpose).trigger
}

/// The triggers of memory, pids, OOM kills and new cgroups.
fn all(triggers: &Triggers) -> [Trigger; 4] {
    Purpose::ALL.map(|purpose| trigger(triggers, purpose))
}

#[test]
fn linux_6_18_watches_memory_through_lru_insertions_and_kernel_memory_charges() {
    let triggers = choose(&linux_6_18_v1(), Mode::Event, MemoryFalls::AtTheNextCharge);
    assert_eq!(
        all(&triggers),
        [
            Kernel(Hook::LruInsertion),
            Kernel(Hook::TaskLifetime),
            Kernel(Hook::OomVictim),
            Kernel(Hook::CgroupLifecycle)
        ]
    );
    assert_eq!(
        triggers.hooks(),
        [
            Hook::LruInsertion,
            Hook::TaskLifetime,
            Hook::OomVictim,
            Hook::CgroupLifecycle
        ]
    );
}

#[test]
fn watched_memory_scopes_take_the_hook_that_sees_falls_and_say_why() {
    let triggers = choose(&linux_6_18_v1(), Mode::Event, MemoryFalls::WhenTheyHappen);
    let memory = triggers.get(Purpose::Memory);
    assert_eq!(memory.trigger, Kernel(Hook::MemcgStat));
    assert!(
        memory.reason.contains(
            "not lru-insertion: --watch-memory reports falls when they happen; \
             it sees them at the next charge"
        ),
        "{}",
        memory.reason
    );
    assert!(!Hook::LruInsertion.sees_memory_falls());
    assert!(Hook::MemcgStat.sees_memory_falls() && Hook::PageAlloc.sees_memory_falls());
}

#[test]
fn linux_6_1_watches_memory_through_page_allocations_and_says_why() {
    let triggers = choose(&linux_6_1_v2(), Mode::Event, MemoryFalls::AtTheNextCharge);
    assert_eq!(
        all(&triggers),
        [
            Kernel(Hook::PageAlloc),
            Kernel(Hook::TaskLifetime),
            Kernel(Hook::OomVictim),
            Kernel(Hook::CgroupLifecycle)
        ]
    );
    let reason = &triggers.get(Purpose::Memory).reason;
    assert!(
        reason.contains(
            "not lru-insertion: no mod_memcg_state tracepoint; \
             not memcg-stat: no mod_memcg_lruvec_state tracepoint"
        ),
        "{reason}"
    );
}

#[test]
fn the_other_guests_choose_as_their_tracepoints_say() {
    let rest = [
        Kernel(Hook::TaskLifetime),
        Kernel(Hook::OomVictim),
        Kernel(Hook::CgroupLifecycle),
    ];
    for (capabilities, falls, memory) in [
        (
            linux_6_12_v2(),
            MemoryFalls::AtTheNextCharge,
            Hook::PageAlloc,
        ),
        (
            linux_6_12_v2(),
            MemoryFalls::WhenTheyHappen,
            Hook::PageAlloc,
        ),
        (
            linux_7_2_v2(),
            MemoryFalls::AtTheNextCharge,
            Hook::LruInsertion,
        ),
        (linux_7_2_v2(), MemoryFalls::WhenTheyHappen, Hook::MemcgStat),
    ] {
        let triggers = choose(&capabilities, Mode::Event, falls);
        let [first, others @ ..] = all(&triggers);
        assert_eq!(
            (first, others),
            (Kernel(memory), rest),
            "{} {falls:?}",
            capabilities.kernel_release
        );
    }
}

#[test]
fn an_upstream_6_1_mark_victim_with_one_argument_leaves_oom_kills_unobserved() {
    let mut capabilities = linux_6_1_v2();
    capabilities.tracepoints.insert("mark_victim", 1);
    let triggers = choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge);
    let oom = triggers.get(Purpose::OomKills);
    assert_eq!(oom.trigger, Trigger::Unobserved);
    assert!(
        oom.reason
            .contains("mark_victim takes 1 arguments here, the program expects 2"),
        "{}",
        oom.reason
    );
    assert_eq!(trigger(&triggers, Purpose::Memory), Kernel(Hook::PageAlloc));
}

#[test]
fn without_btf_everything_polls_and_says_so() {
    for mut capabilities in [linux_6_18_v1(), linux_6_1_v2()] {
        capabilities.btf = Support::No("/sys/kernel/btf/vmlinux: not found".into());
        capabilities.tracepoints.clear();
        let triggers = choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge);
        assert!(triggers.hooks().is_empty());
        let memory = triggers.get(Purpose::Memory);
        assert_eq!(
            memory.reason,
            "no kernel BTF: /sys/kernel/btf/vmlinux: not found"
        );
        assert_eq!(
            all(&triggers),
            [
                Trigger::Poll,
                Trigger::Poll,
                Trigger::Unobserved,
                Trigger::Poll
            ]
        );
    }
}

#[test]
fn unprivileged_everything_polls_with_the_load_error_as_the_reason() {
    let mut capabilities = linux_6_18_v1();
    let denied = "loading a raw tracepoint program: `bpf_prog_load` failed (loading BPF needs root, \
                  or CAP_BPF and CAP_PERFMON; CAP_SYS_ADMIN before Linux 5.8)";
    capabilities.bpf = Support::No(denied.into());
    let triggers = choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge);
    assert!(triggers.hooks().is_empty());
    for purpose in [Purpose::Memory, Purpose::Pids] {
        assert_eq!(
            triggers.get(purpose),
            &TriggerChoice {
                trigger: Trigger::Poll,
                reason: denied.into()
            }
        );
    }
}

#[test]
fn a_hook_the_kernel_refuses_falls_back_to_the_next_one_then_to_polling() {
    let mut capabilities = linux_6_18_v1();
    capabilities
        .attach_failures
        .insert(Hook::LruInsertion, "permission denied".into());
    capabilities
        .attach_failures
        .insert(Hook::MemcgStat, "permission denied".into());
    let triggers = choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge);
    let memory = triggers.get(Purpose::Memory);
    assert_eq!(memory.trigger, Trigger::Kernel(Hook::PageAlloc));
    assert!(
        memory
            .reason
            .contains("not memcg-stat: attaching failed: permission denied"),
        "{}",
        memory.reason
    );

    capabilities
        .attach_failures
        .insert(Hook::PageAlloc, "invalid argument".into());
    let memory = choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge)
        .get(Purpose::Memory)
        .clone();
    assert_eq!(memory.trigger, Trigger::Poll);
    assert_eq!(
        memory.reason,
        "not lru-insertion: attaching failed: permission denied; \
         not memcg-stat: attaching failed: permission denied; \
         not page-alloc: attaching failed: invalid argument"
    );
}

#[test]
fn poll_mode_attaches_nothing() {
    for capabilities in [linux_6_18_v1(), linux_6_1_v2()] {
        let triggers = choose(&capabilities, Mode::Poll, MemoryFalls::AtTheNextCharge);
        assert!(triggers.hooks().is_empty());
        assert_eq!(
            triggers.get(Purpose::Memory),
            &TriggerChoice {
                trigger: Trigger::Poll,
                reason: "--mode poll".into()
            }
        );
    }
}

#[test]
fn the_modes_without_bpf_attach_nothing_and_use_their_mechanism_where_the_kernel_has_it() {
    for (capabilities, memcg) in [
        (linux_6_18_v1(), Trigger::MemcgThreshold),
        (linux_6_1_v2(), Trigger::Poll),
    ] {
        for (mode, memory) in [(Mode::Psi, Trigger::Psi), (Mode::MemcgThreshold, memcg)] {
            let triggers = choose(&capabilities, mode, MemoryFalls::AtTheNextCharge);
            assert!(triggers.hooks().is_empty());
            assert_eq!(trigger(&triggers, Purpose::Memory), memory, "{mode}");
            assert_eq!(trigger(&triggers, Purpose::Pids), Trigger::Poll);
            assert_eq!(trigger(&triggers, Purpose::OomKills), Trigger::Unobserved);
        }
    }
    let no_psi = Capabilities {
        psi: Psi {
            system: false,
            cgroup: false,
        },
        ..linux_6_18_v1()
    };
    let memory = choose(&no_psi, Mode::Psi, MemoryFalls::AtTheNextCharge)
        .get(Purpose::Memory)
        .clone();
    assert_eq!(memory.trigger, Trigger::Poll);
    assert!(memory.reason.contains("no PSI"), "{}", memory.reason);
}

#[test]
fn labels_are_stable() {
    // Dashboards and the README name these.
    assert_eq!(Trigger::Kernel(Hook::PageAlloc).as_str(), "bpf");
    assert_eq!(Trigger::Poll.as_str(), "poll");
    assert_eq!(Trigger::Psi.as_str(), "psi");
    assert_eq!(Trigger::MemcgThreshold.as_str(), "memcg-threshold");
    assert_eq!(Trigger::Unobserved.as_str(), "none");
    let hooks: Vec<&str> = Hook::ALL.iter().map(|h| h.as_str()).collect();
    assert_eq!(
        hooks,
        [
            "lru-insertion",
            "memcg-stat",
            "page-alloc",
            "task-lifetime",
            "oom-victim",
            "cgroup-lifecycle"
        ]
    );
    let resources: Vec<&str> = Purpose::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(resources, ["memory", "pids", "oom_kills", "cgroups"]);
}
