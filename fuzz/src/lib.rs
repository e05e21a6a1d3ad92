//! What each fuzz target checks. Beyond "never panics", each asserts the
//! property a user of the parser relies on, where that is cheap: a
//! quantity prints a form that parses back to its value, a configuration that
//! resolves holds only valid thresholds, every simulated decision names
//! victims from its own ranking. The binaries in `fuzz_targets/` call these
//! through the same functions `evictd` itself uses.
//!
//! The targets of what a tenant or the node shapes (cgroupfs files, the
//! runtime's CRI answers, the API's pods, the state directory's files, the
//! ring buffer's records) take bytes and live in modules of their own.
use std::{
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock, PoisonError},
};

mod cgroupfs;
mod cri;
mod pod;
mod ring_buffer;
mod state_files;

pub use cgroupfs::cgroupfs;
pub use cri::{CriAnswers, cri};
pub use pod::pod;
pub use ring_buffer::ring_buffer;
pub use state_files::state_files;

use evictd::{
    config::{ConfigError, EvictionArgs, PolicyArgs},
    decide::{
        rank::PidRanking,
        thresholds::{EvictionConfig, ThresholdValue},
    },
    quantity::Quantity,
    run::simulate,
    scopes::{levels::MAX_THRESHOLDS, spec::WatchSpec},
};

/// `Quantity::parse`, as every quantity in flags, config files, watches and
/// snapshots is read; and JSON, where manifests may write a number.
pub fn quantity(text: &str) {
    if let Ok(quantity) = Quantity::parse(text) {
        let canonical = quantity.to_string();
        let again = match Quantity::parse(&canonical) {
            Ok(again) => again,
            Err(e) => panic!("{text:?} prints as {canonical:?}, which does not parse: {e}"),
        };
        assert_eq!(again, quantity, "{text:?} -> {canonical:?}");
        // The form is stable from the second print on: a binary quantity
        // that is no whole number of Ki prints without a suffix and reads
        // back as decimal ("312.5Ki" -> "320000" -> "320k"), as in Kubernetes.
        let settled = again.to_string();
        match Quantity::parse(&settled) {
            Ok(third) => assert_eq!(third.to_string(), settled, "{text:?}"),
            Err(e) => panic!("{text:?} settles on {settled:?}, which does not parse: {e}"),
        }
        assert_eq!(
            (again.value(), again.milli_value()),
            (quantity.value(), quantity.milli_value()),
            "{text:?} -> {canonical:?}"
        );
        let json = serde_json::Value::String(canonical.clone()).to_string();
        match serde_json::from_str::<Quantity>(&json) {
            Ok(read) => assert_eq!(read, quantity, "{json}"),
            Err(e) => panic!("{json} does not read back: {e}"),
        }
    }
    let _ = serde_json::from_str::<Quantity>(text);
}

/// Go durations, as grace periods and the transition period are written.
pub fn duration(text: &str) {
    let _ = evictd::duration::parse(text);
}

/// `--watch-memory`, `--watch-pids` and `--watch-node-pids`.
pub fn watch(text: &str) {
    for spec in [
        WatchSpec::memory(text),
        WatchSpec::pids(text),
        WatchSpec::node_pids(text),
    ]
    .into_iter()
    .flatten()
    {
        let thresholds = &spec.thresholds;
        assert!(
            !thresholds.is_empty() && thresholds.len() <= MAX_THRESHOLDS,
            "{text:?}: {spec:?}"
        );
        assert!(
            thresholds.windows(2).all(|w| w[0] < w[1]),
            "{text:?}: {spec:?}"
        );
    }
}

/// kubelet's eviction flags, one per line: --eviction-hard,
/// --eviction-soft, --eviction-soft-grace-period,
/// --eviction-minimum-reclaim, --eviction-max-pod-grace-period,
/// --eviction-pressure-transition-period. A missing line is a flag not
/// given.
pub fn threshold_flags(text: &str) {
    let mut lines = text.split('\n').map(str::to_owned);
    let args = EvictionArgs {
        eviction_hard: lines.next().into_iter().collect(),
        eviction_soft: lines.next().into_iter().collect(),
        eviction_soft_grace_period: lines.next().into_iter().collect(),
        eviction_minimum_reclaim: lines.next().into_iter().collect(),
        eviction_max_pod_grace_period: lines.next(),
        eviction_pressure_transition_period: lines.next(),
        config: None,
    };
    check_config(text, args.resolve());
}

/// A KubeletConfiguration file (YAML or JSON), read from disk as `--config`
/// reads it.
pub fn kubelet_config(text: &str) {
    // One file per process, written for every input and removed after.
    static FILE: OnceLock<Mutex<PathBuf>> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        Mutex::new(std::env::temp_dir().join(format!(
            "evictd-fuzz-kubelet-config-{}.yaml",
            std::process::id()
        )))
    });
    let path = file.lock().unwrap_or_else(PoisonError::into_inner);
    if let Err(e) = std::fs::write(&*path, text) {
        panic!("writing {}: {e}", path.display());
    }
    let args = EvictionArgs {
        config: Some(path.clone()),
        ..EvictionArgs::default()
    };
    let resolved = args.resolve();
    let _ = std::fs::remove_file(&*path);
    check_config(text, resolved);
}

/// A configuration that resolves holds only thresholds the engine can use,
/// and prints as `evictd thresholds` prints it; one that does not says why.
fn check_config(text: &str, resolved: Result<EvictionConfig, ConfigError>) {
    let config = match resolved {
        Ok(config) => config,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    for threshold in &config.thresholds {
        let valid_value = match threshold.value {
            // kubelet's parseThresholdStatement: a quantity must be positive.
            ThresholdValue::Quantity(value) => value > 0,
            ThresholdValue::Percentage(share) => share > 0.0 && share < 1.0,
        };
        let valid_reclaim = match threshold.min_reclaim {
            ThresholdValue::Quantity(value) => value >= 0,
            ThresholdValue::Percentage(share) => share > 0.0 && share <= 1.0,
        };
        assert!(valid_value && valid_reclaim, "{text:?}: {threshold:?}");
        assert_eq!(
            threshold.hard,
            threshold.grace_period.is_zero(),
            "{text:?}: {threshold:?}"
        );
    }
    if let Err(e) = serde_json::to_string(&config.thresholds) {
        panic!("{text:?}: thresholds do not print: {e}");
    }
}

/// `evictd simulate` on a snapshot file's text, under kubelet's defaults
/// and under a configuration with every kind of threshold, with both
/// victim policies and both PID rankings.
pub fn simulate(text: &str) {
    let policies = [false, true].into_iter().flat_map(|evict_set| {
        [PidRanking::Kubelet, PidRanking::ForkRate]
            .into_iter()
            .map(move |pid_ranking| PolicyArgs {
                evict_set,
                pid_ranking,
            })
    });
    for config in configs() {
        for policy in policies.clone() {
            let mut out = Vec::new();
            match simulate::run(
                config,
                policy,
                simulate::Replay::CommandLineThresholds,
                text,
                &mut out,
            ) {
                Ok(()) => check_decisions(text, &out),
                Err(e) => {
                    assert!(e.is_input_error(), "{e}");
                    return;
                }
            }
        }
    }
}

fn configs() -> &'static [EvictionConfig] {
    static CONFIGS: OnceLock<Vec<EvictionConfig>> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let flags = |values: [&str; 6]| EvictionArgs {
            eviction_hard: vec![values[0].to_owned()],
            eviction_soft: vec![values[1].to_owned()],
            eviction_soft_grace_period: vec![values[2].to_owned()],
            eviction_minimum_reclaim: vec![values[3].to_owned()],
            eviction_max_pod_grace_period: Some(values[4].to_owned()),
            eviction_pressure_transition_period: Some(values[5].to_owned()),
            config: None,
        };
        let every_kind = flags([
            "memory.available<10%,nodefs.available<1Gi,nodefs.inodesFree<5%,imagefs.available<15%,\
             containerfs.available<2Gi,pid.available<100",
            "memory.available<30%,imagefs.inodesFree<10%,allocatableMemory.available<500Mi",
            "memory.available=30s,imagefs.inodesFree=1m,allocatableMemory.available=0s",
            "memory.available=5%,nodefs.available=500Mi,pid.available=10",
            "60",
            "10s",
        ]);
        [EvictionArgs::default(), every_kind]
            .iter()
            .map(|args| match args.resolve() {
                Ok(config) => config,
                Err(e) => panic!("fuzzing configuration: {e}"),
            })
            .collect()
    })
}

/// Every line is one JSON decision whose victims come from its ranking,
/// each with a grace period.
fn check_decisions(text: &str, out: &[u8]) {
    let out = String::from_utf8_lossy(out);
    for line in out.lines() {
        let decision: serde_json::Value = match serde_json::from_str(line) {
            Ok(decision) => decision,
            Err(e) => panic!("{text:?}: decision {line:?} is not JSON: {e}"),
        };
        let names = |field: &str| -> Vec<String> {
            decision[field]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let ranking = names("ranking");
        let victims = names("victims");
        assert!(
            victims.iter().all(|v| ranking.contains(v)),
            "{text:?}: {line}"
        );
        let graces = decision["victim_grace_period_seconds"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(graces, victims.len(), "{text:?}: {line}");
    }
}

/// A directory of its own for one input, removed after it: in memory
/// (`/dev/shm`) where there is one, since targets write files for every
/// input.
fn scratch_dir(target: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    match tempfile::Builder::new()
        .prefix(&format!("evictd-fuzz-{target}-"))
        .tempdir_in(&base)
    {
        Ok(dir) => dir,
        Err(e) => panic!("a scratch directory in {}: {e}", base.display()),
    }
}
