//! The programs' maps as the agent uses them: the bands of the watched
//! scopes, and the per-CPU counters and run statistics the programs keep.
use std::{collections::BTreeSet, time::Duration};

use aya::maps::{Array, HashMap, MapData, MapError};
use evictd_common::{
    Band, COUNTER_MEMORY_CHECKS, COUNTER_READ_ERRORS, COUNTER_RINGBUF_DROPS, NODE_PIDS_SCOPE_ID,
    PIDS_WATCHED_CGROUPS, PIDS_WATCHED_NODE, RESOURCE_MEMORY, RESOURCE_PIDS, names,
};

use super::{BpfError, Probes};

/// What a watched scope counts, and so which scope map holds its band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScopeKind {
    /// Bytes charged to a memory cgroup.
    Memory,
    /// Tasks in a pids cgroup, or on the whole node.
    Pids,
}

impl ScopeKind {
    pub(super) fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            RESOURCE_MEMORY => Some(Self::Memory),
            RESOURCE_PIDS => Some(Self::Pids),
            _ => None,
        }
    }

    /// The `resource` label of logs and metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
        }
    }

    /// Whether it counts bytes (written "100Mi" in the text logs) rather
    /// than tasks.
    pub(crate) fn in_bytes(self) -> bool {
        self == Self::Memory
    }
}

/// The bands of the watched scopes, by cgroup id: what the programs compare
/// each scope's page counter or task count with.
pub struct ScopeMaps {
    pub(super) memory: HashMap<MapData, u64, Band>,
    pub(super) pids: HashMap<MapData, u64, Band>,
    /// The node-wide band ([`NODE_PIDS_SCOPE_ID`]): every fork and free
    /// on the node reads it, from an array rather than `pids`.
    pub(super) node_pids: Array<MapData, Band>,
    /// For the programs: how many pids cgroups `pids` holds (with none, a
    /// fork reads the node-wide count alone and walks no cgroup), and
    /// whether `node_pids` is watched.
    pub(super) pids_watched: Array<MapData, u64>,
    pub(super) pids_cgroups: BTreeSet<u64>,
    pub(super) node_pids_watched: bool,
}

impl ScopeMaps {
    /// Arms (or re-arms) the band of scope `id`.
    pub fn set_band(&mut self, kind: ScopeKind, id: u64, band: Band) -> Result<(), BpfError> {
        if is_node_pids(kind, id) {
            // The band before the flag: a fork never compares with the
            // band of an earlier watch.
            self.node_pids
                .set(0, band, 0)
                .map_err(|source| BpfError::Map {
                    map: names::NODE_PIDS_BAND,
                    source,
                })?;
            return self.watch_node_pids(true);
        }
        // Counted before the band is armed, so no fork passes over it.
        self.count_pids_cgroup(kind, id, true)?;
        let (map, name) = self.map_mut(kind);
        map.insert(id, band, 0)
            .map_err(|source| BpfError::Map { map: name, source })
    }

    /// Stops watching scope `id`; a scope that was not watched is fine.
    pub fn remove_scope(&mut self, kind: ScopeKind, id: u64) -> Result<(), BpfError> {
        if is_node_pids(kind, id) {
            return self.watch_node_pids(false);
        }
        let (map, name) = self.map_mut(kind);
        match map.remove(&id) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(source) => return Err(BpfError::Map { map: name, source }),
        }
        self.count_pids_cgroup(kind, id, false)
    }

    fn watch_node_pids(&mut self, watched: bool) -> Result<(), BpfError> {
        if self.node_pids_watched == watched {
            return Ok(());
        }
        self.set_pids_watched(PIDS_WATCHED_NODE, u64::from(watched))?;
        self.node_pids_watched = watched;
        Ok(())
    }

    fn count_pids_cgroup(
        &mut self,
        kind: ScopeKind,
        id: u64,
        watched: bool,
    ) -> Result<(), BpfError> {
        if kind != ScopeKind::Pids {
            return Ok(());
        }
        let changed = if watched {
            self.pids_cgroups.insert(id)
        } else {
            self.pids_cgroups.remove(&id)
        };
        if !changed {
            return Ok(());
        }
        self.set_pids_watched(PIDS_WATCHED_CGROUPS, self.pids_cgroups.len() as u64)
    }

    fn set_pids_watched(&mut self, index: u32, value: u64) -> Result<(), BpfError> {
        self.pids_watched
            .set(index, value, 0)
            .map_err(|source| BpfError::Map {
                map: names::PIDS_WATCHED,
                source,
            })
    }

    /// The band as the kernel holds it now (last value included).
    pub fn band(&self, kind: ScopeKind, id: u64) -> Result<Option<Band>, BpfError> {
        if is_node_pids(kind, id) {
            if !self.node_pids_watched {
                return Ok(None);
            }
            return self
                .node_pids
                .get(&0, 0)
                .map(Some)
                .map_err(|source| BpfError::Map {
                    map: names::NODE_PIDS_BAND,
                    source,
                });
        }
        let (map, name) = match kind {
            ScopeKind::Memory => (&self.memory, names::MEMORY_SCOPES),
            ScopeKind::Pids => (&self.pids, names::PIDS_SCOPES),
        };
        match map.get(&id, 0) {
            Ok(band) => Ok(Some(band)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(BpfError::Map { map: name, source }),
        }
    }

    fn map_mut(&mut self, kind: ScopeKind) -> (&mut HashMap<MapData, u64, Band>, &'static str) {
        match kind {
            ScopeKind::Memory => (&mut self.memory, names::MEMORY_SCOPES),
            ScopeKind::Pids => (&mut self.pids, names::PIDS_SCOPES),
        }
    }
}

fn is_node_pids(kind: ScopeKind, id: u64) -> bool {
    kind == ScopeKind::Pids && id == NODE_PIDS_SCOPE_ID
}

/// Sums of the per-CPU counters the programs keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub ringbuf_drops: u64,
    pub memory_checks: u64,
    pub read_errors: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramStats {
    pub program: &'static str,
    pub runs: u64,
    pub run_time: Duration,
}

impl Probes {
    pub fn counters(&self) -> Result<KernelCounters, BpfError> {
        Ok(KernelCounters {
            ringbuf_drops: self.counter(COUNTER_RINGBUF_DROPS)?,
            memory_checks: self.counter(COUNTER_MEMORY_CHECKS)?,
            read_errors: self.counter(COUNTER_READ_ERRORS)?,
        })
    }

    /// Records lost to a full ring buffer since the programs loaded: one
    /// map read, cheap enough to check after every batch of records.
    pub(crate) fn ringbuf_drops(&self) -> Result<u64, BpfError> {
        self.counter(COUNTER_RINGBUF_DROPS)
    }

    /// One counter summed over every CPU.
    fn counter(&self, index: u32) -> Result<u64, BpfError> {
        self.counters
            .get(&index, 0)
            .map(|values| values.iter().sum::<u64>())
            .map_err(|source| BpfError::Map {
                map: names::COUNTERS,
                source,
            })
    }

    /// Run count and total run time of each attached program. The kernel
    /// counts only while `kernel.bpf_stats_enabled` is 1 (it costs a clock
    /// read per run), so both stay 0 otherwise.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.attached_programs()
            .filter_map(|program| {
                let info = self.ebpf.program(program.name)?.info().ok()?;
                Some(ProgramStats {
                    program: program.name,
                    runs: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }
}
