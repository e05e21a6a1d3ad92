//! Each pod's containers' KEP-5986 signals ([`crate::decide::memory_high`]),
//! read with the pods' stall counters (every 10 s at most, at a timer tick,
//! never on a decision's path) and only while a threshold is set, on
//! cgroup v2 alone (v1 has no memory.high, and the KEP is a no-op there).
//!
//! A pod's containers are the cgroups directly below its own: the runtime
//! makes one per container and one for the sandbox, kubelet's MemoryQoS
//! sets memory.high on each container's. At most [`MOST_CONTAINERS`] of a
//! pod are read.
use std::collections::{BTreeMap, HashMap};

use tracing::warn;

use crate::{
    decide::memory_high::{
        ContainerReading, ContainerSignals, MemoryHighThresholds, PodPressure, Step,
    },
    node::cgroupfs::{CgroupError, CgroupFs, CgroupVersion},
};

/// The containers of one pod read at most: far more than any pod spec has
/// (sidecars and init containers included), few enough that a pod making
/// cgroups below its own costs the agent little.
pub(crate) const MOST_CONTAINERS: usize = 64;

/// A pod's step, with what it was found on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodFinding {
    pub pod_cgroup: String,
    pub step: Step,
    /// Each container past a threshold, described for a person.
    pub description: String,
}

/// The containers' last readings and where each pod stands.
#[derive(Debug)]
pub(crate) struct ContainerPressures {
    thresholds: MemoryHighThresholds,
    pods: HashMap<String, PodEntry>,
}

#[derive(Debug, Default)]
struct PodEntry {
    readings: BTreeMap<String, ContainerReading>,
    pressure: PodPressure,
    /// Containers were left out (past [`MOST_CONTAINERS`]), said once.
    told_left_out: bool,
}

impl Default for ContainerPressures {
    fn default() -> Self {
        Self {
            thresholds: MemoryHighThresholds::OFF,
            pods: HashMap::new(),
        }
    }
}

impl ContainerPressures {
    pub(crate) fn set_thresholds(&mut self, thresholds: MemoryHighThresholds) {
        self.thresholds = thresholds;
    }

    /// Whether containers are read at all: a threshold is set, on v2.
    pub(crate) fn enabled(&self, version: CgroupVersion) -> bool {
        self.thresholds.enabled() && version == CgroupVersion::V2
    }

    /// Reads the containers of every pod cgroup in `pod_cgroups` at
    /// `now_ns` and returns the pods with a step to take. A pod whose
    /// containers cannot be read keeps its last reading and is judged at
    /// the next; pods not listed are forgotten.
    pub(crate) fn read(
        &mut self,
        cgroupfs: &CgroupFs,
        pod_cgroups: &[&str],
        now_ns: u64,
    ) -> Vec<PodFinding> {
        self.pods
            .retain(|cgroup, _| pod_cgroups.contains(&cgroup.as_str()));
        let mut findings = Vec::new();
        for &pod_cgroup in pod_cgroups {
            let entry = self.pods.entry(pod_cgroup.to_owned()).or_default();
            let readings = match read_pod(cgroupfs, pod_cgroup, now_ns, entry) {
                Ok(readings) => readings,
                Err(CgroupError::Gone(_)) => continue,
                Err(e) => {
                    warn!(pod = pod_cgroup, error = %e, "cannot read a pod's containers' memory pressure");
                    continue;
                }
            };
            let mut signals = BTreeMap::new();
            for (container, now) in &readings {
                let Some(before) = entry.readings.get(container) else {
                    continue;
                };
                if let Some(found) = ContainerSignals::between(before, now, &self.thresholds) {
                    signals.insert(container.clone(), (found, *now));
                }
            }
            entry.readings = readings;
            let step = entry
                .pressure
                .judge(&signals, self.thresholds.grace, now_ns);
            if step == Step::Wait {
                continue;
            }
            let description = signals
                .iter()
                .filter(|(_, (signals, _))| signals.past())
                .map(|(container, (signals, _))| format!("{container}: {}", signals.describe()))
                .collect::<Vec<_>>()
                .join("; ");
            findings.push(PodFinding {
                pod_cgroup: pod_cgroup.to_owned(),
                step,
                description,
            });
        }
        findings
    }
}

fn read_pod(
    cgroupfs: &CgroupFs,
    pod_cgroup: &str,
    now_ns: u64,
    entry: &mut PodEntry,
) -> Result<BTreeMap<String, ContainerReading>, CgroupError> {
    let (children, left_out) = cgroupfs.child_cgroups(pod_cgroup, MOST_CONTAINERS)?;
    if left_out && !entry.told_left_out {
        entry.told_left_out = true;
        warn!(
            pod = pod_cgroup,
            most = MOST_CONTAINERS,
            "pod has more cgroups below it than containers are read; the others are not judged"
        );
    }
    let mut readings = BTreeMap::new();
    for child in children {
        let path = format!("{}/{child}", pod_cgroup.trim_end_matches('/'));
        match cgroupfs.container_pressure(&path, now_ns) {
            Ok(reading) => {
                readings.insert(child, reading);
            }
            // A container that ended between the listing and the read.
            Err(CgroupError::Gone(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(readings)
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path, time::Duration};

    use super::*;

    const SECOND_NS: u64 = 1_000_000_000;

    fn container(dir: &Path, high_events: u64) {
        fs::create_dir_all(dir).unwrap();
        let events = format!("low 0\nhigh {high_events}\nmax 0\noom 0\noom_kill 0\n");
        fs::write(dir.join("memory.events"), events).unwrap();
        fs::write(dir.join("memory.high"), "25165824\n").unwrap();
        fs::write(dir.join("memory.max"), "max\n").unwrap();
    }

    #[test]
    fn a_throttled_container_puts_its_pod_through_stage_1_and_a_vanished_pod_is_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let cgroupfs = CgroupFs::memory_only(CgroupVersion::V2, root.path());
        let app = root.path().join("kubepods/pod1/app");
        let mut pressures = ContainerPressures::default();
        pressures.set_thresholds(MemoryHighThresholds {
            high_rate: 1.0,
            grace: Duration::from_secs(10),
            ..MemoryHighThresholds::OFF
        });
        assert!(pressures.enabled(CgroupVersion::V2));
        assert!(!pressures.enabled(CgroupVersion::V1));
        let pods = ["/kubepods/pod1"];
        for (at_s, high_events) in [(0, 0), (10, 200)] {
            container(&app, high_events);
            assert!(
                pressures
                    .read(&cgroupfs, &pods, at_s * SECOND_NS)
                    .is_empty()
            );
        }
        container(&app, 400);
        let found = pressures.read(&cgroupfs, &pods, 20 * SECOND_NS);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].step, Step::Relax(vec!["app".to_owned()]));
        assert_eq!(
            found[0].description,
            "app: memory.high hit 20.0/s, memory.max hit 0.0/s"
        );
        assert!(pressures.read(&cgroupfs, &[], 30 * SECOND_NS).is_empty());
        assert!(pressures.pods.is_empty());
    }
}
