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
//! - On the hierarchy's root (a real node: `--node-cgroup /`) the kernel
//!   compares the machine's working set itself (kubelet's `anon + file −
//!   inactive_file`, from the kernel's per-NUMA-node counters), not a page
//!   counter: the root's leaves out tasks in the root cgroup and holds
//!   kernel memory and page cache, so on a node whose cache fills its
//!   memory it would sit past every line. The lines are the working sets
//!   themselves, shifted by what those counters and the root's memory.stat
//!   (kubelet's reading, flushed from per-CPU counts) differ by.
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
pub(crate) struct EngineScope {
    pub kind: ScopeKind,
    /// `None`: every task on the node.
    pub path: Option<String>,
    /// Values (bytes charged, or tasks) at which a threshold may be met;
    /// empty when no threshold needs the scope.
    pub thresholds: Vec<u64>,
    pub reading: Reading,
    /// What the scope's usage file read at the same time, which a cgroup
    /// v1 eventfd threshold compares: the reading's value, except on the
    /// hierarchy's root, whose file is kubelet's usage and not the page
    /// counter.
    pub file_value: u64,
}

impl EngineScope {
    /// A value of this scope's page counter as its usage file would
    /// show it, as of the reading.
    pub(crate) fn as_file_value(&self, value: u64) -> u64 {
        let shifted =
            i128::from(value) - i128::from(self.reading.value) + i128::from(self.file_value);
        u64::try_from(shifted.max(0)).unwrap_or(u64::MAX)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tripwires {
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
pub(crate) struct MemcgLevels {
    pub levels: Vec<u64>,
    pub read_usage: u64,
}

pub(crate) fn tripwires(config: &EvictionConfig, observation: &NodeObservation) -> Tripwires {
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
    // What the node's usage holds beyond the working set the engine
    // decides on: its inactive file pages (as kubelet arms its levels),
    // and with `--memory-signal reclaimable` its cold active file pages.
    let node_working_set = stats.memory.working_set_bytes;
    let counted_available = observation
        .node_memory
        .working_set_bytes()
        .saturating_sub(node_working_set);
    let beyond_working_set = observation.node_memory.inactive_file_bytes + counted_available;
    let memcg_levels = MemcgLevels {
        levels: node_memory
            .iter()
            .map(|usage| usage + beyond_working_set)
            .collect(),
        read_usage: observation.node_memory.usage_bytes,
    };
    let node_is_root = observation.node_cgroup.trim_matches('/').is_empty();
    let mut scopes = Vec::new();
    // A root whose working set the programs cannot add up has no line.
    if let Some(band_value) = observation.node_band_value {
        scopes.push(memory_scope(
            observation.node_cgroup.clone(),
            node_memory,
            node_working_set,
            &observation.node_memory,
            band_value,
            node_is_root,
        ));
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
            file_value: tasks,
        });
    }
    if let Some((path, memory)) = &observation.kubepods {
        scopes.push(memory_scope(
            path.clone(),
            kubepods_memory,
            memory.working_set_bytes(),
            memory,
            memory.usage_bytes,
            false,
        ));
    }
    Tripwires {
        scopes,
        memcg_levels,
    }
}

/// What a memory scope's band compares beyond kubelet's working set.
#[derive(Debug, Clone, Copy)]
enum Beyond {
    /// A cgroup's page counter, its usage: its inactive file pages more.
    Cache(u64),
    /// The root's working set as the kernel's running counters add it up:
    /// what they and the root's flushed memory.stat differ by (a few pages
    /// per CPU, either way).
    Drift(i128),
}

/// The memory scope at `path`, whose kernel band compares a value that
/// reads `band_value` now, with the band's lines for `lines` (working sets
/// at which a threshold is met, `working_set` the engine's now).
fn memory_scope(
    path: String,
    lines: Vec<u64>,
    working_set: u64,
    memory: &crate::node::cgroupfs::MemoryReading,
    band_value: u64,
    is_root: bool,
) -> EngineScope {
    let beyond = if is_root {
        Beyond::Drift(i128::from(band_value) - i128::from(working_set))
    } else {
        Beyond::Cache(band_value.saturating_sub(working_set))
    };
    EngineScope {
        kind: ScopeKind::Memory,
        path: Some(path),
        thresholds: band_lines(lines, beyond),
        reading: Reading {
            value: band_value,
            working_set: Some(working_set),
        },
        file_value: memory.usage_bytes,
    }
}

/// The band's lines for `lines`, working sets at which thresholds are met.
/// A cgroup's page counter gets two per line: the line itself, where the
/// working set could reach it had all the inactive file turned into
/// working set, and the line + the inactive file, where it reaches it if
/// the cache stays (kubelet's memcg threshold level). The upper one makes
/// the kernel push the crossing of an allocation that leaves the cache
/// alone (the OOM case); cache turning into working set at a constant
/// counter is the close watch's, past the lower one. Both are one without
/// inactive file. The root's value is the working set itself: one line,
/// shifted by the drift (never to 0). The count of lines stays the same
/// from one reading to the next, so a level keeps its meaning.
fn band_lines(lines: Vec<u64>, beyond: Beyond) -> Vec<u64> {
    let mut all: Vec<u64> = match beyond {
        Beyond::Cache(cache) => lines
            .iter()
            .flat_map(|&line| [line, line.saturating_add(cache)])
            .collect(),
        Beyond::Drift(drift) => lines
            .iter()
            .map(|&line| u64::try_from((i128::from(line) + drift).max(1)).unwrap_or(u64::MAX))
            .collect(),
    };
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
        decide::snapshot::{MemoryStats, NodeStats, PidStats},
        decide::thresholds::ThresholdValue,
        node::cgroupfs::MemoryReading,
    };

    const MIB: u64 = 1 << 20;

    /// memory.available<`mib`Mi, and kubelet's copy of it for the pods'
    /// allocatable memory.
    fn memory(mib: i64) -> Vec<Threshold> {
        Threshold::hard_memory_available(mib << 20).to_vec()
    }

    /// [`memory`]`(100)` and pid.available<100.
    fn memory_and_pids() -> Vec<Threshold> {
        let mut thresholds = memory(100);
        thresholds.push(Threshold::hard(
            Signal::PidAvailable,
            ThresholdValue::Quantity(100),
        ));
        thresholds
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
            node_band_value: (node_cgroup != "/").then_some(700 * MIB),
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
        let config = EvictionConfig::of(vec![
            Threshold::hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 << 20)),
            Threshold::hard(
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(50 << 20),
            ),
            // kubelet's copy of memory.available for the pods' allocatable
            // memory.
            Threshold::hard(
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(100 << 20),
            ),
            Threshold::hard(Signal::PidAvailable, ThresholdValue::Quantity(100)),
        ]);
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
                    file_value: 700 * MIB,
                },
                EngineScope {
                    kind: ScopeKind::Pids,
                    path: Some("/node".into()),
                    thresholds: vec![901],
                    reading: Reading {
                        value: 300,
                        working_set: None
                    },
                    file_value: 300,
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
                    file_value: 550 * MIB,
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
    fn on_the_machine_the_root_compares_the_working_set_itself() {
        let config = EvictionConfig::of(memory_and_pids());
        let mut observation = observation("/");
        // The kernel's running counters show 2 MiB more working set than
        // the root's memory.stat (600 MiB) last flushed.
        observation.node_band_value = Some(602 * MIB);
        let wires = tripwires(&config, &observation);
        let paths: Vec<_> = wires
            .scopes
            .iter()
            .map(|s| (s.kind, s.path.clone()))
            .collect();
        assert_eq!(
            paths,
            [
                (ScopeKind::Memory, Some("/".into())),
                (ScopeKind::Pids, None),
                (ScopeKind::Memory, Some("/kubepods".into()))
            ]
        );
        let root = &wires.scopes[0];
        // capacity − T + 1 where the kernel's count is then; not + the
        // 100 MiB of inactive file, which the root's value leaves out.
        assert_eq!(root.thresholds, [926 * MIB + 1]);
        assert_eq!(
            root.reading,
            Reading {
                value: 602 * MIB,
                working_set: Some(600 * MIB)
            }
        );
        // A cgroup v1 eventfd on the root compares kubelet's usage (700).
        assert_eq!(root.file_value, 700 * MIB);
        assert_eq!(root.as_file_value(902 * MIB), 1000 * MIB);
        // The pods' cgroup keeps its own lines: the allocatable copy of
        // the threshold (900 − 100 MiB), + its 50 MiB of inactive file.
        assert_eq!(wires.scopes[2].thresholds, [800 * MIB + 1, 850 * MIB + 1]);
    }

    #[test]
    fn a_kernel_count_below_the_reading_lowers_the_line_and_none_is_at_0() {
        let mut observation = observation("/");
        observation.node_band_value = Some(598 * MIB);
        let wires = tripwires(&EvictionConfig::of(memory(100)), &observation);
        assert_eq!(wires.scopes[0].thresholds, [922 * MIB + 1]);
        // Even with a working set past the threshold and a kernel count
        // of nothing, no line is at 0.
        observation.node_band_value = Some(0);
        let wires = tripwires(&EvictionConfig::of(memory(1000)), &observation);
        assert_eq!(wires.scopes[0].thresholds, [1]);
    }

    #[test]
    fn a_root_whose_working_set_the_kernel_cannot_add_up_has_no_line_and_lends_none_to_the_pods() {
        let wires = tripwires(&EvictionConfig::of(memory_and_pids()), &observation("/"));
        let memory: Vec<_> = wires
            .scopes
            .iter()
            .filter(|s| s.kind == ScopeKind::Memory)
            .map(|s| (s.path.clone(), s.thresholds.clone()))
            .collect();
        assert_eq!(
            memory,
            [(Some("/kubepods".into()), vec![800 * MIB + 1, 850 * MIB + 1])]
        );
    }

    #[test]
    fn without_inactive_file_the_cache_line_is_the_threshold_line() {
        let mut observation = observation("/node");
        observation.node_memory.inactive_file_bytes = 0;
        observation.stats.memory.working_set_bytes = 700 * MIB;
        let wires = tripwires(&EvictionConfig::of(memory(100)), &observation);
        assert_eq!(wires.scopes[0].thresholds, [924 * MIB + 1]);
    }

    #[test]
    fn cold_active_file_left_out_of_the_working_set_raises_the_cache_line_by_as_much() {
        // --memory-signal reclaimable counted 200 MiB of active file as
        // available: the engine's working set is 400 MiB of the 700 used.
        let mut observation = observation("/node");
        observation.stats.memory.working_set_bytes = 400 * MIB;
        let wires = tripwires(&EvictionConfig::of(memory(100)), &observation);
        let line = 924 * MIB + 1;
        assert_eq!(wires.scopes[0].thresholds, [line, line + 300 * MIB]);
        assert_eq!(wires.memcg_levels.levels, [line + 300 * MIB]);
    }

    #[test]
    fn usage_on_capacity_minus_t_leaves_t_available_and_trips_nothing() {
        // kubelet evicts when available < T: a working set of exactly
        // capacity − T (here all usage, no cache) is not past it, and the
        // kernel's line must not fire there, or the engine wakes to nothing
        // and no line is left above. The next page is past it.
        let mut observation = observation("/node");
        observation.node_memory.inactive_file_bytes = 0;
        observation.stats.memory.working_set_bytes = 700 * MIB;
        let wires = tripwires(&EvictionConfig::of(memory(100)), &observation);
        let line = wires.scopes[0].thresholds[0];
        let exactly_t_available = 1024 * MIB - 100 * MIB;
        assert!(exactly_t_available < line);
        assert!(exactly_t_available + 4096 >= line);
        assert_eq!(wires.memcg_levels.levels, [line]);
    }

    #[test]
    fn a_scope_no_threshold_needs_is_named_empty() {
        let wires = tripwires(
            &EvictionConfig::of(vec![Threshold::hard(
                Signal::NodeFsAvailable,
                ThresholdValue::Percentage(0.1),
            )]),
            &observation("/node"),
        );
        assert!(wires.scopes.iter().all(|scope| scope.thresholds.is_empty()));
        assert!(wires.memcg_levels.levels.is_empty());
    }
}
