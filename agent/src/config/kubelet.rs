//! kubelet's eviction flags and KubeletConfiguration fields into an
//! [`EvictionConfig`], as kubelet's `ParseThresholdConfig` reads them.
//! Flags override the file field by field, as kubelet's flags override its
//! config file.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Args;
use serde::Deserialize;

use crate::{
    decide::thresholds::{
        DEFAULT_PRESSURE_TRANSITION_PERIOD, EvictionConfig, Operator, Signal, Threshold,
        ThresholdValue, UnknownSignal,
    },
    duration::{self, DurationError},
    quantity::{Quantity, QuantityError},
};

/// kubelet's Linux `DefaultEvictionHard`
/// (pkg/kubelet/apis/config/v1beta1/defaults_linux.go).
const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];
/// kubelet's default `enforceNodeAllocatable`: ["pods"].
const NODE_ALLOCATABLE_PODS: &str = "pods";

/// Invalid eviction configuration. Every message names where the text came
/// from (flag or file field) and quotes it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{origin}: {text:?} is not SIGNAL{separator}VALUE")]
    Statement {
        origin: String,
        text: String,
        separator: char,
    },
    #[error("{origin}: {source}")]
    UnknownSignal {
        origin: String,
        #[source]
        source: UnknownSignal,
    },
    #[error("{origin}: {signal}={text:?}: {source}")]
    Quantity {
        origin: String,
        signal: Signal,
        text: String,
        #[source]
        source: QuantityError,
    },
    #[error("{origin}: {signal}={text:?} must not be negative")]
    Negative {
        origin: String,
        signal: Signal,
        text: String,
    },
    #[error("{origin}: {signal}={text:?}: a threshold quantity must be positive")]
    NotPositive {
        origin: String,
        signal: Signal,
        text: String,
    },
    #[error("{origin}: {signal}={text:?}: a percentage must be a number from 0% to 100%")]
    Percentage {
        origin: String,
        signal: Signal,
        text: String,
    },
    #[error(
        "{origin}: {signal}={text:?}: a minimum reclaim percentage must be above 0% and at most 100%"
    )]
    MinReclaimPercentage {
        origin: String,
        signal: Signal,
        text: String,
    },
    #[error("{origin}: {signal}={text:?}: {source}")]
    GracePeriod {
        origin: String,
        signal: Signal,
        text: String,
        #[source]
        source: DurationError,
    },
    #[error(
        "{origin}: soft eviction threshold {signal}<{value} has no grace period: add --eviction-soft-grace-period={signal}=DURATION (evictionSoftGracePeriod in a config file)"
    )]
    NoGracePeriod {
        origin: String,
        signal: Signal,
        value: String,
    },
    #[error("{origin}: {text:?} is not a whole number of seconds >= 0")]
    MaxPodGracePeriod { origin: String, text: String },
    #[error("{origin}: {source}")]
    TransitionPeriod {
        origin: String,
        #[source]
        source: DurationError,
    },
    #[error("{origin}: {source}")]
    ImageMinimumGcAge {
        origin: String,
        #[source]
        source: DurationError,
    },
    #[error("--config {path}: {source}")]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--config {path}: not a KubeletConfiguration: {source}")]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
}

/// Configuration kubelet accepts but that is probably not what was meant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigWarning {
    #[error(
        "{origin}: signal {signal} is given twice; the last value, {kept:?}, replaces {replaced:?}, as in kubelet"
    )]
    Duplicate {
        origin: String,
        signal: String,
        replaced: String,
        kept: String,
    },
}

/// The eviction fields of a KubeletConfiguration (YAML or JSON); every
/// other field of a real kubelet config is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfigFile {
    eviction_hard: Option<Entries>,
    eviction_soft: Option<Entries>,
    eviction_soft_grace_period: Option<Entries>,
    eviction_minimum_reclaim: Option<Entries>,
    eviction_max_pod_grace_period: Option<Scalar>,
    eviction_pressure_transition_period: Option<Scalar>,
    merge_default_eviction_settings: Option<bool>,
    enforce_node_allocatable: Option<Vec<String>>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<Scalar>,
}

/// A map of signal to value as written in the file, in order and with any
/// key given twice kept, so that [`push`] warns of the duplicate as it does
/// on the command line; a plain map would silently keep the last one.
#[derive(Debug)]
struct Entries(Vec<(String, Scalar)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Entries;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of eviction signal to value")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A YAML scalar read as text: `pid.available: 100` is as good as "100".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Integer(i64),
    Float(f64),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Text(text) => text.clone(),
            Scalar::Integer(n) => n.to_string(),
            Scalar::Float(x) => x.to_string(),
        }
    }
}

/// `signal -> value text`, in the order given, with where it came from.
struct Statements {
    origin: String,
    entries: Vec<(Signal, String)>,
    /// Signals given twice.
    warnings: Vec<ConfigWarning>,
}

impl Statements {
    fn get(&self, signal: Signal) -> Option<&str> {
        self.entries
            .iter()
            .find(|(s, _)| *s == signal)
            .map(|(_, text)| text.as_str())
    }
}

/// kubelet's eviction flags, with kubelet's names, formats and meanings.
/// Kept as text here: [`EvictionArgs::resolve`] validates them together
/// with --config, where flags override the file as in kubelet.
#[derive(Debug, Clone, Default, Args)]
pub struct EvictionArgs {
    /// Hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%.
    /// Replaces kubelet's Linux defaults (memory.available<100Mi,
    /// nodefs.available<10%, nodefs.inodesFree<5%, imagefs.available<15%,
    /// imagefs.inodesFree<5%); an empty value clears them. Repeatable.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_hard: Vec<String>,

    /// Soft eviction thresholds, same form; each needs a grace period.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_soft: Vec<String>,

    /// How long a soft threshold must stay met before it evicts, e.g.
    /// memory.available=1m30s.
    #[arg(long, value_name = "SIGNAL=DURATION,...")]
    pub eviction_soft_grace_period: Vec<String>,

    /// Longest grace period, in seconds, a soft eviction gives a pod; the
    /// pod gets min(its terminationGracePeriodSeconds, this). kubelet's
    /// default: 0.
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub eviction_max_pod_grace_period: Option<String>,

    /// How much to reclaim past a threshold once it is met, e.g.
    /// memory.available=0Mi,nodefs.available=500Mi.
    #[arg(long, value_name = "SIGNAL=QUANTITY,...")]
    pub eviction_minimum_reclaim: Vec<String>,

    /// How long a node condition stays after its last threshold stopped
    /// being met. kubelet's default: 5m.
    #[arg(long, value_name = "DURATION")]
    pub eviction_pressure_transition_period: Option<String>,

    /// A KubeletConfiguration file (YAML or JSON); its eviction fields are
    /// read, the flags above override them.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl EvictionArgs {
    /// Whether any threshold comes from the command line (a threshold flag
    /// or --config), rather than kubelet's defaults.
    pub fn sets_thresholds(&self) -> bool {
        !(self.eviction_hard.is_empty()
            && self.eviction_soft.is_empty()
            && self.eviction_soft_grace_period.is_empty()
            && self.eviction_minimum_reclaim.is_empty()
            && self.config.is_none())
    }

    /// Validates the flags and --config together into the engine's
    /// configuration. What deserves a warning is dropped: for callers that
    /// report nothing (tests, fuzzing); the commands use
    /// [`EvictionArgs::resolve_with_warnings`].
    pub fn resolve(&self) -> Result<EvictionConfig, ConfigError> {
        self.resolve_with_warnings().map(|(config, _)| config)
    }

    /// [`EvictionArgs::resolve`], with what the user should be told about
    /// configuration kubelet accepts (a signal given twice).
    pub fn resolve_with_warnings(
        &self,
    ) -> Result<(EvictionConfig, Vec<ConfigWarning>), ConfigError> {
        let file = match &self.config {
            Some(path) => read_config_file(path)?,
            None => KubeletConfigFile::default(),
        };
        let file_origin = |field: &str| match &self.config {
            Some(path) => format!("{field} in {}", path.display()),
            None => field.to_owned(),
        };
        let pick = |flag: &[String],
                    flag_name: &str,
                    field: &Option<Entries>,
                    field_name: &str,
                    separator: char|
         -> Result<Option<Statements>, ConfigError> {
            if !flag.is_empty() {
                return flag_statements(flag, flag_name, separator).map(Some);
            }
            match field {
                Some(map) => file_statements(map, &file_origin(field_name)).map(Some),
                None => Ok(None),
            }
        };
        let hard = pick(
            &self.eviction_hard,
            "--eviction-hard",
            &file.eviction_hard,
            "evictionHard",
            '<',
        )?;
        let soft = pick(
            &self.eviction_soft,
            "--eviction-soft",
            &file.eviction_soft,
            "evictionSoft",
            '<',
        )?
        .unwrap_or_else(|| empty("--eviction-soft"));
        let grace = pick(
            &self.eviction_soft_grace_period,
            "--eviction-soft-grace-period",
            &file.eviction_soft_grace_period,
            "evictionSoftGracePeriod",
            '=',
        )?
        .unwrap_or_else(|| empty("--eviction-soft-grace-period"));
        let reclaim = pick(
            &self.eviction_minimum_reclaim,
            "--eviction-minimum-reclaim",
            &file.eviction_minimum_reclaim,
            "evictionMinimumReclaim",
            '=',
        )?
        .unwrap_or_else(|| empty("--eviction-minimum-reclaim"));

        let warnings: Vec<ConfigWarning> = hard
            .iter()
            .chain([&soft, &grace, &reclaim])
            .flat_map(|statements| statements.warnings.iter().cloned())
            .collect();
        let merge_defaults = file.merge_default_eviction_settings.unwrap_or(false);
        let hard = match hard {
            None => defaults(),
            Some(mut given) if merge_defaults => {
                for (signal, text) in defaults().entries {
                    if given.get(signal).is_none() {
                        given.entries.push((signal, text));
                    }
                }
                given
            }
            Some(given) => given,
        };

        let min_reclaims = reclaim
            .entries
            .iter()
            .map(|(signal, text)| Ok((*signal, parse_min_reclaim(&reclaim.origin, *signal, text)?)))
            .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
        let grace_periods = grace
            .entries
            .iter()
            .map(|(signal, text)| {
                duration::parse(text)
                    .map(|period| (*signal, period))
                    .map_err(|source| ConfigError::GracePeriod {
                        origin: grace.origin.clone(),
                        signal: *signal,
                        text: text.clone(),
                        source,
                    })
            })
            .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
        let min_reclaim_of = |signal| {
            min_reclaims
                .get(&signal)
                .copied()
                .unwrap_or(ThresholdValue::Quantity(0))
        };

        let mut hard_thresholds = Vec::new();
        for (signal, text) in &hard.entries {
            if let Some(value) = parse_value(&hard.origin, *signal, text)? {
                hard_thresholds.push(Threshold {
                    signal: *signal,
                    operator: Operator::LessThan,
                    value,
                    grace_period: Duration::ZERO,
                    min_reclaim: min_reclaim_of(*signal),
                    hard: true,
                });
            }
        }

        let mut soft_thresholds = Vec::new();
        for (signal, text) in &soft.entries {
            let Some(value) = parse_value(&soft.origin, *signal, text)? else {
                continue;
            };
            let grace_period =
                *grace_periods
                    .get(signal)
                    .ok_or_else(|| ConfigError::NoGracePeriod {
                        origin: soft.origin.clone(),
                        signal: *signal,
                        value: text.clone(),
                    })?;
            soft_thresholds.push(Threshold {
                signal: *signal,
                operator: Operator::LessThan,
                value,
                grace_period,
                min_reclaim: min_reclaim_of(*signal),
                // kubelet's isHardEvictionThreshold: no grace period is hard.
                hard: grace_period.is_zero(),
            });
        }
        soft_thresholds.sort_by_key(|t| t.signal);
        // kubelet's addAllocatableThresholds: with pods' allocatable
        // enforced, each hard memory.available threshold also guards the
        // pods' cgroup, with the same value and minimum reclaim (the
        // memory.available one, not one given for allocatableMemory.available).
        // An explicit allocatableMemory.available threshold does not stop
        // the copy: kubelet then has both.
        let enforce_pods = file
            .enforce_node_allocatable
            .as_ref()
            .is_none_or(|list| list.iter().any(|item| item == NODE_ALLOCATABLE_PODS));
        if enforce_pods {
            let copies: Vec<Threshold> = hard_thresholds
                .iter()
                .chain(&soft_thresholds)
                .filter(|t| t.hard && t.signal == Signal::MemoryAvailable)
                .map(|t| Threshold {
                    signal: Signal::AllocatableMemoryAvailable,
                    ..t.clone()
                })
                .collect();
            hard_thresholds.extend(copies);
        }
        hard_thresholds.sort_by_key(|t| t.signal);

        let max_pod_grace_period = match (
            &self.eviction_max_pod_grace_period,
            &file.eviction_max_pod_grace_period,
        ) {
            (Some(text), _) => parse_seconds("--eviction-max-pod-grace-period", text)?,
            (None, Some(value)) => {
                parse_seconds(&file_origin("evictionMaxPodGracePeriod"), &value.text())?
            }
            (None, None) => Duration::ZERO,
        };
        let pressure_transition_period = match (
            &self.eviction_pressure_transition_period,
            &file.eviction_pressure_transition_period,
        ) {
            (Some(text), _) => parse_period("--eviction-pressure-transition-period", text)?,
            // kubelet's v1beta1 defaulting (SetDefaults_KubeletConfiguration)
            // gives a zero period in the file the default; a zero flag
            // stays, since flags are applied after defaulting.
            (None, Some(value)) => Some(parse_period(
                &file_origin("evictionPressureTransitionPeriod"),
                &value.text(),
            )?)
            .filter(|period| !period.is_zero())
            .unwrap_or(DEFAULT_PRESSURE_TRANSITION_PERIOD),
            (None, None) => DEFAULT_PRESSURE_TRANSITION_PERIOD,
        };
        hard_thresholds.extend(soft_thresholds);
        let config = EvictionConfig {
            thresholds: hard_thresholds,
            max_pod_grace_period,
            pressure_transition_period,
        };
        Ok((config, warnings))
    }
}

impl EvictionArgs {
    /// `imageMinimumGCAge` in --config, when the file sets it. kubelet's
    /// defaulting gives a zero one the default, as `None` does here.
    pub fn config_image_minimum_gc_age(&self) -> Result<Option<Duration>, ConfigError> {
        let Some(path) = &self.config else {
            return Ok(None);
        };
        let Some(value) = read_config_file(path)?.image_minimum_gc_age else {
            return Ok(None);
        };
        let age = duration::parse(value.text().trim()).map_err(|source| {
            ConfigError::ImageMinimumGcAge {
                origin: format!("imageMinimumGCAge in {}", path.display()),
                source,
            }
        })?;
        Ok(Some(age).filter(|age| !age.is_zero()))
    }
}

fn empty(origin: &str) -> Statements {
    Statements {
        origin: origin.to_owned(),
        entries: Vec::new(),
        warnings: Vec::new(),
    }
}

fn defaults() -> Statements {
    Statements {
        origin: "kubelet's default evictionHard".into(),
        entries: DEFAULT_EVICTION_HARD
            .iter()
            .filter_map(|(signal, value)| Some((signal.parse().ok()?, (*value).to_owned())))
            .collect(),
        warnings: Vec::new(),
    }
}

fn read_config_file(path: &Path) -> Result<KubeletConfigFile, ConfigError> {
    let text = fs::read_to_string(path).map_err(|source| ConfigError::ConfigRead {
        path: path.to_owned(),
        source,
    })?;
    // JSON is YAML, so one parser reads both. An empty file is no settings.
    if text.trim().is_empty() {
        return Ok(KubeletConfigFile::default());
    }
    serde_yaml_ng::from_str(&text).map_err(|source| ConfigError::ConfigParse {
        path: path.to_owned(),
        source,
    })
}

/// Statements from repeated flags, each `s1<v1,s2<v2` (or `s=v`). A flag
/// given empty (`--eviction-hard=`) is an empty map, as in kubelet.
fn flag_statements(
    values: &[String],
    origin: &str,
    separator: char,
) -> Result<Statements, ConfigError> {
    let mut statements = empty(origin);
    for statement in values.iter().flat_map(|v| v.split(',')) {
        let statement = statement.trim();
        if statement.is_empty() {
            continue;
        }
        let (signal, value) =
            statement
                .split_once(separator)
                .ok_or_else(|| ConfigError::Statement {
                    origin: origin.to_owned(),
                    text: statement.to_owned(),
                    separator,
                })?;
        push(&mut statements, signal.trim(), value.trim())?;
    }
    Ok(statements)
}

fn file_statements(map: &Entries, origin: &str) -> Result<Statements, ConfigError> {
    let mut statements = empty(origin);
    for (signal, value) in &map.0 {
        push(&mut statements, signal.trim(), value.text().trim())?;
    }
    Ok(statements)
}

fn push(statements: &mut Statements, signal: &str, value: &str) -> Result<(), ConfigError> {
    let parsed: Signal = signal
        .parse()
        .map_err(|source| ConfigError::UnknownSignal {
            origin: statements.origin.clone(),
            source,
        })?;
    // kubelet's map flags (LangleSeparatedMapStringString,
    // MapStringString) and its config file's maps keep a key's last value.
    // The signal keeps its first place: kubelet's order is a map's.
    match statements.entries.iter_mut().find(|(s, _)| *s == parsed) {
        Some((_, text)) => {
            statements.warnings.push(ConfigWarning::Duplicate {
                origin: statements.origin.clone(),
                signal: signal.to_owned(),
                replaced: std::mem::replace(text, value.to_owned()),
                kept: value.to_owned(),
            });
        }
        None => statements.entries.push((parsed, value.to_owned())),
    }
    Ok(())
}

/// A threshold value, as kubelet's `parseThresholdStatement`. `None`: a
/// percentage of 0% or 100%, which disables the threshold in kubelet.
/// kubelet matches the text "0%" and "100%"; the number is compared here, so
/// "0.0%" disables too rather than leaving a threshold that is never met.
fn parse_value(
    origin: &str,
    signal: Signal,
    text: &str,
) -> Result<Option<ThresholdValue>, ConfigError> {
    if let Some(number) = text.strip_suffix('%') {
        let fraction = parse_percentage(number)
            .filter(|fraction| (0.0..=1.0).contains(fraction))
            .ok_or_else(|| percentage_error(origin, signal, text))?;
        if fraction == 0.0 || fraction == 1.0 {
            return Ok(None);
        }
        return Ok(Some(ThresholdValue::Percentage(fraction)));
    }
    let quantity = parse_quantity(origin, signal, text)?;
    // parseThresholdStatement: "eviction threshold ... must be positive".
    if matches!(quantity, ThresholdValue::Quantity(0)) {
        return Err(ConfigError::NotPositive {
            origin: origin.to_owned(),
            signal,
            text: text.to_owned(),
        });
    }
    Ok(Some(quantity))
}

/// A minimum reclaim, as kubelet's `parseMinimumReclaims`: a percentage
/// must be above 0% (kubelet refuses 0%); above 100% is refused too, since
/// no eviction could ever reclaim it.
fn parse_min_reclaim(
    origin: &str,
    signal: Signal,
    text: &str,
) -> Result<ThresholdValue, ConfigError> {
    if let Some(number) = text.strip_suffix('%') {
        return parse_percentage(number)
            .filter(|fraction| *fraction > 0.0 && *fraction <= 1.0)
            .map(ThresholdValue::Percentage)
            .ok_or_else(|| ConfigError::MinReclaimPercentage {
                origin: origin.to_owned(),
                signal,
                text: text.to_owned(),
            });
    }
    parse_quantity(origin, signal, text)
}

/// kubelet's `parsePercentage`: the number read as a float32 (Go's
/// `ParseFloat(s, 32)`; Rust's `f32` parsing rounds the same way, once),
/// divided by 100 in float32. `None` for text that is not a finite number.
fn parse_percentage(number: &str) -> Option<f32> {
    let value: f32 = number.parse().ok()?;
    value.is_finite().then_some(value / 100.0)
}

/// A quantity's exact integer value; negative is refused, 0 is left to the
/// caller (a minimum reclaim of 0 is valid, a threshold of 0 is not).
fn parse_quantity(origin: &str, signal: Signal, text: &str) -> Result<ThresholdValue, ConfigError> {
    let quantity = Quantity::parse(text).map_err(|source| ConfigError::Quantity {
        origin: origin.to_owned(),
        signal,
        text: text.to_owned(),
        source,
    })?;
    if quantity.is_negative() {
        return Err(ConfigError::Negative {
            origin: origin.to_owned(),
            signal,
            text: text.to_owned(),
        });
    }
    Ok(ThresholdValue::Quantity(quantity.value()))
}

fn percentage_error(origin: &str, signal: Signal, text: &str) -> ConfigError {
    ConfigError::Percentage {
        origin: origin.to_owned(),
        signal,
        text: text.to_owned(),
    }
}

/// `evictionMaxPodGracePeriod` is an int32 in kubelet; negative is refused.
fn parse_seconds(origin: &str, text: &str) -> Result<Duration, ConfigError> {
    text.trim()
        .parse::<i32>()
        .ok()
        .and_then(|seconds| u64::try_from(seconds).ok())
        .map(Duration::from_secs)
        .ok_or_else(|| ConfigError::MaxPodGracePeriod {
            origin: origin.to_owned(),
            text: text.to_owned(),
        })
}

fn parse_period(origin: &str, text: &str) -> Result<Duration, ConfigError> {
    duration::parse(text.trim()).map_err(|source| ConfigError::TransitionPeriod {
        origin: origin.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests;
