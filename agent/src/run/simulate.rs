//! `evictd simulate`: replays recorded snapshots through the engine and
//! prints each decision as one JSON line (shared/contracts/simulate.md).
//! Touches nothing on the machine.
use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    io::{self, Write},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize, Serializer};

use crate::{
    config::PolicyArgs,
    decide::snapshot::Snapshot,
    decide::{
        engine::{Engine, MetThreshold},
        rank::PidRanking,
        thresholds::{EvictionConfig, NodeCondition, Resource, Signal, Threshold},
    },
    report::decisions::RecordedPolicy,
};

/// Why a simulation stopped. Input errors come before anything is printed.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("cannot read snapshot file {path:?}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("snapshot file {path:?}: {source}")]
    InFile { path: PathBuf, source: InputError },
    #[error("snapshot: {0}")]
    Input(#[from] InputError),
    #[error("cannot write the decisions: {0}")]
    Write(#[source] io::Error),
}

impl SimulateError {
    /// Whether the input was at fault (a usage error, exit 2) rather than
    /// the output.
    pub fn is_input_error(&self) -> bool {
        !matches!(self, SimulateError::Write(_))
    }
}

/// What is wrong with the snapshot text.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{source} near {excerpt:?}")]
    Json {
        source: serde_json::Error,
        /// The offending line, shortened.
        excerpt: String,
    },
    #[error("snapshot [{index}]: time {time} {problem}")]
    Time {
        index: usize,
        time: f64,
        problem: &'static str,
    },
}

/// Reads `path` and runs [`run`] on it.
pub fn run_file(
    config: &EvictionConfig,
    policy: PolicyArgs,
    replay: Replay,
    path: &Path,
    out: &mut impl Write,
) -> Result<(), SimulateError> {
    let text = std::fs::read_to_string(path).map_err(|source| SimulateError::Read {
        path: path.to_owned(),
        source,
    })?;
    run(config, policy, replay, &text, out).map_err(|error| match error {
        SimulateError::Input(source) => SimulateError::InFile {
            path: path.to_owned(),
            source,
        },
        other => other,
    })
}

/// Whether a decision record's own thresholds decide its replay: where the
/// command line gives none (no threshold flag, no --config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    RecordedThresholds,
    CommandLineThresholds,
}

/// What a decision record (report/decisions.rs) carries beside its
/// snapshot: the agent's thresholds and policy, and the thresholds met
/// before it decided.
#[derive(Deserialize)]
struct Recorded {
    thresholds: Vec<Threshold>,
    policy: RecordedPolicy,
    #[serde(default)]
    thresholds_met: Vec<MetThreshold>,
}

/// Decides on every snapshot of `snapshot_json` (one object, or an array
/// replayed in order) and writes one JSON line per snapshot. The whole
/// input is validated before the first line is written. A decision record
/// is replayed with its engine state, and with its own thresholds and
/// policy as `replay` says.
pub fn run(
    config: &EvictionConfig,
    mut policy: PolicyArgs,
    replay: Replay,
    snapshot_json: &str,
    out: &mut impl Write,
) -> Result<(), SimulateError> {
    let snapshots = parse(snapshot_json)?;
    let clock = clock(&snapshots)?;
    let recorded = match snapshots.as_slice() {
        [_] => serde_json::from_str::<Recorded>(snapshot_json).ok(),
        _ => None,
    };
    // The record's state means something only with its own thresholds.
    let recorded = recorded.filter(|_| replay == Replay::RecordedThresholds);
    let mut config = Cow::Borrowed(config);
    if let Some(recorded) = &recorded {
        config.to_mut().thresholds = recorded.thresholds.clone();
        policy.evict_set |= recorded.policy.evict_set;
        if policy.pid_ranking == PidRanking::default()
            && let Ok(ranking) = recorded.policy.pid_ranking.parse()
        {
            policy.pid_ranking = ranking;
        }
    }
    let mut engine = Engine::new(config.into_owned()).with_pid_ranking(policy.pid_ranking);
    if let (Some(recorded), [snapshot], [now]) = (&recorded, snapshots.as_slice(), clock.as_slice())
    {
        engine = engine.resume(*now, snapshot.node.disk_layout(), &recorded.thresholds_met);
    }
    for (snapshot, now) in snapshots.iter().zip(clock) {
        let assessment = engine.observe(now, &snapshot.node);
        let choice = engine.choose(&assessment, &snapshot.pods, policy.into());
        let starved = assessment.starvation.as_ref();
        let line = Decision {
            time: snapshot.time,
            observations: assessment
                .observations
                .iter()
                .map(|(&signal, observation)| (signal, observation.available))
                .collect(),
            thresholds_met: assessment.signals_met(),
            node_conditions: &assessment.node_conditions,
            starved_resource: starved.map(|s| s.resource),
            ranking: choice
                .ranking
                .iter()
                .map(|r| snapshot.pods[r.index].key())
                .collect(),
            victims: choice.victims.iter().map(|v| v.pod.as_str()).collect(),
            starved_signal: starved.map(|s| s.threshold.signal),
            deficit: choice.deficit,
            victim_grace_period_seconds: choice
                .victims
                .iter()
                .map(|v| v.grace_period.as_secs())
                .collect(),
        };
        serde_json::to_writer(&mut *out, &line)
            .map_err(|e| SimulateError::Write(io::Error::from(e)))?;
        writeln!(out).map_err(SimulateError::Write)?;
    }
    out.flush().map_err(SimulateError::Write)
}

/// One line of output. The first seven fields are the contract's.
#[derive(Serialize)]
struct Decision<'a> {
    #[serde(serialize_with = "seconds")]
    time: f64,
    observations: BTreeMap<Signal, i64>,
    thresholds_met: BTreeSet<Signal>,
    node_conditions: &'a [NodeCondition],
    starved_resource: Option<Resource>,
    ranking: Vec<String>,
    victims: Vec<&'a str>,
    /// The threshold's signal the victims are chosen for.
    starved_signal: Option<Signal>,
    /// What must come back to reach threshold + minimum reclaim.
    deficit: Option<i64>,
    /// Per victim, in the order of `victims`.
    victim_grace_period_seconds: Vec<u64>,
}

/// Whole seconds print as integers, as they were most likely written.
fn seconds<S: Serializer>(time: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0; // 2^53
    if time.fract() == 0.0 && *time < EXACT_INTEGERS {
        serializer.serialize_u64(*time as u64)
    } else {
        serializer.serialize_f64(*time)
    }
}

fn parse(text: &str) -> Result<Vec<Snapshot>, InputError> {
    let json_error = |source: serde_json::Error| {
        // Up to 80 characters of the offending line, ending just past the
        // column serde_json points at.
        let line = text
            .lines()
            .nth(source.line().saturating_sub(1))
            .unwrap_or("");
        let skip = source.column().saturating_sub(60);
        let excerpt: String = line.chars().skip(skip).take(80).collect();
        let excerpt = excerpt.trim().to_owned();
        InputError::Json { source, excerpt }
    };
    if text.trim_start().starts_with('[') {
        serde_json::from_str(text).map_err(json_error)
    } else {
        serde_json::from_str(text)
            .map(|snapshot| vec![snapshot])
            .map_err(json_error)
    }
}

/// The engine's clock at each snapshot: its `time`, which must be a finite,
/// non-negative number of seconds that never decreases.
fn clock(snapshots: &[Snapshot]) -> Result<Vec<Duration>, InputError> {
    let mut clock = Vec::with_capacity(snapshots.len());
    let mut previous = 0.0;
    for (index, snapshot) in snapshots.iter().enumerate() {
        let time = snapshot.time;
        let problem = if !time.is_finite() {
            "is not a finite number of seconds"
        } else if time < 0.0 {
            "is negative"
        } else if time < previous {
            "is earlier than the snapshot before it"
        } else {
            match Duration::try_from_secs_f64(time) {
                Ok(now) => {
                    clock.push(now);
                    previous = time;
                    continue;
                }
                Err(_) => "is too large",
            }
        };
        return Err(InputError::Time {
            index,
            time,
            problem,
        });
    }
    Ok(clock)
}

#[cfg(test)]
mod tests;
