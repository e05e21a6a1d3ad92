//! The kernel objects one agent loaded — its programs, the links attaching
//! them and the maps they use — found from the program ids it logged, and
//! whether they are gone. Other agents run on the same kernel at the same
//! time, so only ever ids an agent reported are looked at.
use std::{collections::BTreeSet, io, time::Duration};

use aya::{
    maps::loaded_maps,
    programs::{loaded_links, loaded_programs},
};
use evictd::{
    kernel::bpf::{ProbeOptions, Probes},
    kernel::capabilities::Capabilities,
    node::cgroupfs::CgroupFs,
};
use serde_json::Value;

use crate::{Timeout, wait_until};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BpfObjects {
    pub programs: BTreeSet<u32>,
    pub links: BTreeSet<u32>,
    pub maps: BTreeSet<u32>,
}

impl BpfObjects {
    /// The programs with these ids, the maps they use, every other program
    /// using one of those maps (loaded by the same agent but not attached,
    /// where its hook is missing), and the links attaching any of them, as
    /// loaded now. Maps are never shared between agents: each loads its own.
    pub fn of_programs(ids: &[u32]) -> Self {
        let loaded: Vec<(u32, Vec<u32>)> = loaded_programs()
            .filter_map(Result::ok)
            .map(|program| {
                let maps = program.map_ids().ok().flatten().unwrap_or_default();
                (program.id(), maps)
            })
            .collect();
        let maps: BTreeSet<u32> = loaded
            .iter()
            .filter(|(id, _)| ids.contains(id))
            .flat_map(|(_, maps)| maps.iter().copied())
            .collect();
        let programs: BTreeSet<u32> = loaded
            .iter()
            .filter(|(id, uses)| ids.contains(id) || uses.iter().any(|m| maps.contains(m)))
            .map(|(id, _)| *id)
            .collect();
        let links = loaded_links()
            .filter_map(Result::ok)
            .filter(|link| programs.contains(&link.program_id()))
            .map(|link| link.id())
            .collect();
        Self {
            programs,
            links,
            maps,
        }
    }

    /// Just these programs, as an agent reported them: what is left to
    /// check once it has exited before its links and maps could be looked
    /// up.
    pub fn programs_only(ids: &[u32]) -> Self {
        Self {
            programs: ids.iter().copied().collect(),
            ..Self::default()
        }
    }

    /// Those of these objects the kernel still holds.
    pub fn still_loaded(&self) -> Self {
        Self {
            programs: loaded_programs()
                .filter_map(Result::ok)
                .map(|p| p.id())
                .filter(|id| self.programs.contains(id))
                .collect(),
            links: loaded_links()
                .filter_map(Result::ok)
                .map(|l| l.id())
                .filter(|id| self.links.contains(id))
                .collect(),
            maps: loaded_maps()
                .filter_map(Result::ok)
                .map(|m| m.id())
                .filter(|id| self.maps.contains(id))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.programs.is_empty() && self.links.is_empty() && self.maps.is_empty()
    }

    /// Waits until the kernel has freed every one of them. It frees an
    /// object once its last reference (fd, link, pin) is gone, after an RCU
    /// grace period, so this takes a moment, not an instant.
    pub fn wait_freed(&self, deadline: Duration) -> Result<(), (Timeout, Self)> {
        wait_until(deadline, "the agent's BPF objects to be freed", || {
            self.still_loaded().is_empty()
        })
        .map_err(|timeout| (timeout, self.still_loaded()))
    }
}

/// The program ids in an agent's `eBPF programs attached` log line.
pub fn program_ids(attached: &Value) -> Vec<u32> {
    attached["programs"]
        .as_str()
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// What this kernel offers, and the agent's programs loaded for it (none
/// attached yet), with memory checked every `check_step_bytes` of churn.
pub fn load_probes(check_step_bytes: u64) -> io::Result<(Capabilities, Probes)> {
    let (capabilities, btf) =
        Capabilities::detect(&CgroupFs::discover().map_err(io::Error::other)?);
    let btf = btf.ok_or_else(|| io::Error::other(format!("no kernel BTF: {capabilities}")))?;
    let options = ProbeOptions {
        check_step_bytes,
        kernel_log: false,
    };
    let probes = Probes::load(&btf, options).map_err(io::Error::other)?;
    Ok((capabilities, probes))
}
