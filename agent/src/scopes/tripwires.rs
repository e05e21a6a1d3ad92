//! Where the kernel should next wake the engine ("tripwires"): one pure
//! function of the eviction thresholds and one fresh observation of the
//! node. The same observation gives the engine its signals and each engine
//! scope its reading, so a wake-up reads every file once.
//!
//! - `memory.available < T` needs the node cgroup's usage (bytes charged)
//!   to be at least `capacity − T + 1` (the working set past `capacity −
//!   T`, strictly, as kubelet compares), since the working set never
//!   exceeds usage: the kernel's first line. Past it only a fresh read of the
//!   working set tells whether the threshold is met, so the engine looks
//!   again every 20 ms (the close watch); and the kernel watches a second
//!   line, `capacity − T + 1 + inactive_file`, where the working set crosses
//!   if the page cache stays as it was at the last reading: that crossing
//!   is then pushed by the kernel, not found by the close watch.
//! - `allocatableMemory.available < T` likewise on the pods' cgroup, with
//!   the pods' cgroup's inactive file pages.
//! - `pid.available < T` is met at exactly `max − T + 1` tasks.
//! - cgroup v1 eventfd thresholds (`--mode memcg-threshold`) are armed as
//!   kubelet arms them, `capacity − T + inactive_file`, but one byte
//!   higher: the kernel signals usage *reaching* a level, and a working set
//!   of exactly `capacity − T` leaves `T` available, not less.
use crate::{
    decide::thresholds::{EvictionConfig, Signal, Threshold},
    kernel::bpf::ScopeKind,
    node::stats::NodeObservation,
    scopes::registry::Reading,
};

/// A scope the engine has the kernel watch, and its reading now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineScope {
    pub kind: ScopeKind,
    /// `None`: every task on the node.
    pub path: Option<String>,
    /// Values (bytes charged, or tasks) at which a threshold may be met;
    /// empty when no threshold needs the scope.
    pub thresholds: Vec<u64>,
    pub reading: Reading,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tripwires {
    /// Kernel bands: scopes whose crossing wakes the engine.
    pub scopes: Vec<EngineScope>,
    /// Where the node cgroup's cgroup v1 eventfd thresholds belong.
    pub memcg_levels: MemcgLevels,
}

/// Usage levels of the node cgroup for cgroup v1 eventfd thresholds, and
/// the usage they were set from: one that usage passes before they are
/// armed is never signalled, and only this reading tells that apart from
/// one the engine already saw passed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemcgLevels {
    pub levels: Vec<u64>,
    pub read_usage: u64,
}

pub fn tripwires(config: &EvictionConfig, observation: &NodeObservation) -> Tripwires {
    let stats = &observation.stats;
    let mut node_memory = Vec::new();
    let mut kubepods_memory = Vec::new();
    let mut pids = Vec::new();
    for threshold in &config.thresholds {
        match threshold.signal {
            Signal::MemoryAvailable => {
                node_memory.push(usage_at_threshold(threshold, stats.memory.capacity_bytes));
            }
            Signal::AllocatableMemoryAvailable => {
                if let Some(allocatable) = stats.allocatable {
                    kubepods_memory.push(usage_at_threshold(threshold, allocatable.capacity_bytes));
                }
            }
            Signal::PidAvailable => {
                if let Some(pid) = stats.pid {
                    let value = threshold.value.resolve(pid.max as i64).max(0) as u64;
                    pids.push((pid.max + 1).saturating_sub(value));
                }
            }
            _ => {}
        }
    }
    let memcg_levels = MemcgLevels {
        levels: node_memory
            .iter()
            .map(|usage| usage + observation.node_memory.inactive_file_bytes)
            .collect(),
        read_usage: observation.node_memory.usage_bytes,
    };
    let node_is_root = observation.node_cgroup.trim_matches('/').is_empty();
    let mut scopes = Vec::new();
    if node_is_root {
        // The root memory cgroup has no page counter to watch: the pods'
        // cgroup stands in, offset by what the rest of the node holds.
        if let (Some(_), Some(allocatable)) = (&observation.kubepods, stats.allocatable) {
            let rest = stats
                .memory
                .working_set_bytes
                .saturating_sub(allocatable.working_set_bytes);
            kubepods_memory.extend(node_memory.iter().map(|usage| usage.saturating_sub(rest)));
        }
    } else {
        scopes.push(EngineScope {
            kind: ScopeKind::Memory,
            path: Some(observation.node_cgroup.clone()),
            thresholds: with_cache_lines(node_memory, observation.node_memory.inactive_file_bytes),
            reading: memory_reading(&observation.node_memory),
        });
    }
    if let Some(tasks) = observation.scope_tasks {
        scopes.push(EngineScope {
            kind: ScopeKind::Pids,
            path: (!node_is_root).then(|| observation.node_cgroup.clone()),
            thresholds: pids,
            reading: Reading {
                value: tasks,
                working_set: None,
            },
        });
    }
    if let Some((path, memory)) = &observation.kubepods {
        scopes.push(EngineScope {
            kind: ScopeKind::Memory,
            path: Some(path.clone()),
            thresholds: with_cache_lines(kubepods_memory, memory.inactive_file_bytes),
            reading: memory_reading(memory),
        });
    }
    Tripwires {
        scopes,
        memcg_levels,
    }
}

fn memory_reading(memory: &crate::node::cgroupfs::MemoryReading) -> Reading {
    Reading {
        value: memory.usage_bytes,
        working_set: Some(memory.working_set_bytes()),
    }
}

/// A memory scope's `lines` (usage where the working set could reach each
/// threshold), each joined by the usage where it does reach it if the
/// scope's `inactive_file` pages stay: kubelet's memcg threshold level. The
/// second line makes the kernel push the crossing of an allocation that
/// does not turn cache into working set (the OOM case); cache that does,
/// at constant usage, is the close watch's. Both lines of a scope with no
/// inactive file are one.
fn with_cache_lines(lines: Vec<u64>, inactive_file: u64) -> Vec<u64> {
    let with_cache: Vec<u64> = lines
        .iter()
        .map(|line| line.saturating_add(inactive_file))
        .collect();
    let mut all = lines;
    all.extend(with_cache);
    all.sort_unstable();
    all.dedup();
    all
}

/// The usage at which a memory threshold is met on `capacity` bytes, were
/// all of it working set: available below T, strictly. A line at exactly
/// `capacity − T` woke the engine with T still available (the page counter
/// moves in 64-page steps, so it lands on a page-aligned line about once in
/// 64 crossings), and with no line left above, only the close watch found
/// the crossing, 20 ms later.
fn usage_at_threshold(threshold: &Threshold, capacity: u64) -> u64 {
    let value = threshold.value.resolve(capacity as i64).max(0) as u64;
    capacity.saturating_sub(value).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::EvictionArgs,
        node::{
            cgroupfs::MemoryReading,
            snapshot::{MemoryStats, NodeStats, PidStats},
        },
    };

    const MIB: u64 = 1 << 20;

    fn config(hard: &str) -> EvictionConfig {
        EvictionArgs {
            eviction_hard: vec![hard.into()],
            ..EvictionArgs::default()
        }
        .resolve()
        .unwrap()
    }

    fn observation(node_cgroup: &str) -> NodeObservation {
        NodeObservation {
            stats: NodeStats {
                memory: MemoryStats {
                    capacity_bytes: 1024 * MIB,
                    working_set_bytes: 600 * MIB,
                },
                allocatable: Some(MemoryStats {
                    capacity_bytes: 900 * MIB,
                    working_set_bytes: 500 * MIB,
                }),
                pid: Some(PidStats {
                    max: 1000,
                    in_use: 300,
                }),
                nodefs: None,
                imagefs: None,
                containerfs: None,
            },
            node_cgroup: node_cgroup.into(),
            node_memory: MemoryReading {
                usage_bytes: 700 * MIB,
                inactive_file_bytes: 100 * MIB,
            },
            kubepods: Some((
                format!("{}/kubepods", node_cgroup.trim_end_matches('/')),
                MemoryReading {
                    usage_bytes: 550 * MIB,
                    inactive_file_bytes: 50 * MIB,
                },
            )),
            scope_tasks: Some(300),
        }
    }

    #[test]
    fn a_node_cgroup_is_watched_at_capacity_minus_each_threshold() {
        let config =
            config("memory.available<100Mi,allocatableMemory.available<50Mi,pid.available<100");
        let wires = tripwires(&config, &observation("/node"));
        assert_eq!(
            wires.scopes,
            [
                EngineScope {
                    kind: ScopeKind::Memory,
                    path: Some("/node".into()),
                    // capacity − T + 1, then + the node's 100 MiB of
                    // inactive file.
                    thresholds: vec![924 * MIB + 1, 1024 * MIB + 1],
                    reading: Reading {
                        value: 700 * MIB,
                        working_set: Some(600 * MIB)
                    },
                },
                EngineScope {
                    kind: ScopeKind::Pids,
                    path: Some("/node".into()),
                    thresholds: vec![901],
                    reading: Reading {
                        value: 300,
                        working_set: None
                    },
                },
                EngineScope {
                    kind: ScopeKind::Memory,
                    path: Some("/node/kubepods".into()),
                    // The copy of memory.available<100Mi that
                    // enforceNodeAllocatable adds (800), allocatableMemory.
                    // available<50Mi (850), each + the pods' 50 MiB of
                    // inactive file (850, 900).
                    thresholds: vec![800 * MIB + 1, 850 * MIB + 1, 900 * MIB + 1],
                    reading: Reading {
                        value: 550 * MIB,
                        working_set: Some(500 * MIB)
                    },
                },
            ]
        );
        assert_eq!(
            wires.memcg_levels,
            MemcgLevels {
                levels: vec![1024 * MIB + 1],
                read_usage: 700 * MIB,
            },
            "capacity − T + 1 + inactive_file, from the node's usage"
        );
    }

    #[test]
    fn on_the_machine_the_pods_cgroup_stands_in_for_the_root() {
        let config = config("memory.available<100Mi,pid.available<100");
        let wires = tripwires(&config, &observation("/"));
        let paths: Vec<_> = wires
            .scopes
            .iter()
            .map(|s| (s.kind, s.path.clone()))
            .collect();
        assert_eq!(
            paths,
            [
                (ScopeKind::Pids, None),
                (ScopeKind::Memory, Some("/kubepods".into()))
            ]
        );
        // The allocatable copy of the threshold (900 − 100 MiB), then
        // 924 MiB less what the node holds outside the pods (600 − 500),
        // each + the pods' 50 MiB of inactive file.
        assert_eq!(
            wires.scopes[1].thresholds,
            [800 * MIB + 1, 824 * MIB + 1, 850 * MIB + 1, 874 * MIB + 1]
        );
    }

    #[test]
    fn without_inactive_file_the_cache_line_is_the_threshold_line() {
        let mut observation = observation("/node");
        observation.node_memory.inactive_file_bytes = 0;
        let wires = tripwires(&config("memory.available<100Mi"), &observation);
        assert_eq!(wires.scopes[0].thresholds, [924 * MIB + 1]);
    }

    #[test]
    fn usage_on_capacity_minus_t_leaves_t_available_and_trips_nothing() {
        // kubelet evicts when available < T: a working set of exactly
        // capacity − T (here all usage, no cache) is not past it, and the
        // kernel's line must not fire there, or the engine wakes to nothing
        // and no line is left above. The next page is past it.
        let mut observation = observation("/node");
        observation.node_memory.inactive_file_bytes = 0;
        let wires = tripwires(&config("memory.available<100Mi"), &observation);
        let line = wires.scopes[0].thresholds[0];
        let exactly_t_available = 1024 * MIB - 100 * MIB;
        assert!(exactly_t_available < line);
        assert!(exactly_t_available + 4096 >= line);
        assert_eq!(wires.memcg_levels.levels, [line]);
    }

    #[test]
    fn a_scope_no_threshold_needs_is_named_empty() {
        let wires = tripwires(&config("nodefs.available<10%"), &observation("/node"));
        assert!(wires.scopes.iter().all(|scope| scope.thresholds.is_empty()));
        assert!(wires.memcg_levels.levels.is_empty());
    }
}
