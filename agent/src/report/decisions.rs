//! The decision record: every eviction decision for a threshold the agent
//! makes, or holds back, kept in `--state-dir` as it was made: the node
//! and the pods as the engine saw them, the thresholds and how long each
//! had been met, the ranking and the victims, what was done and how long
//! each step took. A threshold held before any pod is ranked (the pods'
//! disk usage unknown, the pressure outside the pods) is recorded with no
//! pods and no ranking, and why. A record is a snapshot of `evictd simulate`'s contract
//! with the thresholds and the engine's state beside it, so `evictd
//! simulate --snapshot RECORD` replays it; `evictd explain` tells the last
//! ones to a person.
//!
//! Bounded: a ring of `--decision-records` files, `decision-N.json`, each
//! written whole and at most the state directory's 1 MiB. The deciding
//! thread only hands over what it holds already (shared pods, small
//! copies); a thread of its own formats and writes, and when it falls
//! behind a record is dropped with a warning, never waited for.
use std::{
    sync::{
        Arc,
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    thread,
};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::{
    decide::snapshot::{NodeStats, PodSnapshot},
    decide::{
        engine::{Choice, MetThreshold, Starvation},
        rank::PidRanking,
        thresholds::{Signal, Threshold},
    },
    quantity::Quantity,
    state::{StateDir, StateError},
};

/// Records kept by default: a day of a busy node's decisions, a few MiB.
pub const DEFAULT_RECORDS: usize = 64;
/// Records handed over but not yet written before new ones are dropped.
const QUEUE: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum DecisionsError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("decision record {name}: {source}")]
    Malformed {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot start the decision record's thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// One decision, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Seconds on the engine's clock (the snapshot's `time`).
    pub time: f64,
    pub node: NodeStats,
    /// The pods the engine ranked, with the usage it ranked them by.
    pub pods: Vec<PodSnapshot>,
    pub thresholds: Vec<Threshold>,
    /// The thresholds met after this observation: a replay starts from
    /// them (a soft threshold's grace, minimum reclaim).
    pub thresholds_met: Vec<MetThreshold>,
    pub policy: RecordedPolicy,
    pub decision: Decided,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedPolicy {
    pub evict_set: bool,
    pub pid_ranking: String,
}

/// What was decided, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decided {
    pub at: Timestamp,
    #[serde(flatten)]
    pub facts: DecisionFacts,
    /// Every pod in eviction order.
    pub ranking: Vec<RankedPod>,
    pub victims: Vec<RecordedVictim>,
}

/// The decision as the deciding thread knows it: the threshold, how far the
/// node was past it, what was done, how long it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionFacts {
    /// What woke the engine (`kernel`, `resync`, `poll`, ...).
    pub trigger: String,
    pub signal: Signal,
    pub resource: String,
    pub hard: bool,
    pub observed: i64,
    pub threshold: i64,
    pub min_reclaim: i64,
    pub deficit: i64,
    pub outcome: Outcome,
    pub times_us: StepTimes,
}

impl DecisionFacts {
    /// The decision on `starvation`, woken by `trigger`.
    pub(crate) fn of(
        starvation: &Starvation,
        trigger: &str,
        outcome: Outcome,
        times_us: StepTimes,
    ) -> Self {
        Self {
            trigger: trigger.to_owned(),
            signal: starvation.threshold.signal,
            resource: starvation.resource.to_string(),
            hard: starvation.threshold.hard,
            observed: starvation.observation.available,
            threshold: starvation.threshold_quantity,
            min_reclaim: starvation.min_reclaim_quantity,
            deficit: starvation.deficit(),
            outcome,
            times_us,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankedPod {
    pub pod: String,
    /// Why it stands there: usage against request, priority, protection.
    pub standing: String,
    /// Whether its usage was read exactly (memory: else the bytes charged,
    /// an upper bound of its working set).
    pub exact: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedVictim {
    pub pod: String,
    pub reason: String,
    pub usage: i64,
    pub grace_seconds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The victims' evictions started.
    Evicted,
    /// `--dry-run`: decided, nothing killed.
    DryRun,
    /// No pod may be evicted (all critical, running evictd, backing off,
    /// or none running).
    NotActed,
    /// The eviction budget is spent: held until it has room.
    HeldBudget,
    /// A disk threshold, with the runtime unable to say what the pods use:
    /// held, not ranked on no usage.
    HeldDiskUsageUnknown,
    /// The last kill gave back less than its pod held: the pressure is
    /// outside the pods, and the signal is held, not ranked.
    HeldOutsidePods,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Evicted => "evicted",
            Outcome::DryRun => "dry run: nothing killed",
            Outcome::NotActed => "not acted on: no pod may be evicted",
            Outcome::HeldBudget => "held: the eviction budget is spent",
            Outcome::HeldDiskUsageUnknown => {
                "held: the container runtime cannot say what the pods use on disk"
            }
            Outcome::HeldOutsidePods => {
                "held: the last kill gave back less than its pod held (the pressure is outside the pods)"
            }
        }
    }

    /// Whether the pods were ranked for it: a hold before ranking has no
    /// ranking to show.
    pub fn ranked(self) -> bool {
        !matches!(
            self,
            Outcome::HeldDiskUsageUnknown | Outcome::HeldOutsidePods
        )
    }
}

/// Microseconds from the trigger to the decision, and where they went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTimes {
    pub decision: u64,
    pub woken_to_run: u64,
    pub observe: u64,
    pub list: u64,
    pub rank: u64,
    pub exact_read: u64,
    pub exact_reads: usize,
}

/// What the deciding thread hands over: what it holds already, shared or
/// copied small; the writer formats the rest.
pub(crate) struct PendingRecord {
    pub time: f64,
    pub node: NodeStats,
    pub pods: Vec<Arc<PodSnapshot>>,
    pub exact: Vec<bool>,
    pub choice: Choice,
    pub thresholds: Arc<[Threshold]>,
    pub thresholds_met: Vec<MetThreshold>,
    pub evict_set: bool,
    pub pid_ranking: PidRanking,
    /// When it was decided (the wall clock, for a person).
    pub at: Timestamp,
    pub facts: DecisionFacts,
}

impl PendingRecord {
    pub(crate) fn into_record(self) -> DecisionRecord {
        let key = |index: usize| self.pods[index].key();
        let ranking = self
            .choice
            .ranking
            .iter()
            .map(|ranked| RankedPod {
                pod: key(ranked.index),
                standing: ranked.reason(),
                exact: self.exact.get(ranked.index).copied().unwrap_or(true),
            })
            .collect();
        let victims = self
            .choice
            .victims
            .iter()
            .map(|victim| RecordedVictim {
                pod: victim.pod.clone(),
                reason: victim.reason.as_str().to_owned(),
                usage: victim.usage,
                grace_seconds: victim.grace_period.as_secs(),
            })
            .collect();
        DecisionRecord {
            time: self.time,
            node: self.node,
            pods: self.pods.iter().map(|pod| (**pod).clone()).collect(),
            thresholds: self.thresholds.to_vec(),
            thresholds_met: self.thresholds_met,
            policy: RecordedPolicy {
                evict_set: self.evict_set,
                pid_ranking: self.pid_ranking.to_string(),
            },
            decision: Decided {
                at: self.at,
                facts: self.facts,
                ranking,
                victims,
            },
        }
    }
}

/// The deciding thread's end of the record.
pub(crate) struct DecisionRecords {
    sender: SyncSender<PendingRecord>,
}

impl DecisionRecords {
    /// Starts the thread that writes records into `dir`, keeping the last
    /// `keep` (at least 1).
    pub(crate) fn start(dir: StateDir, keep: usize) -> Result<Self, DecisionsError> {
        let (sender, receiver) = mpsc::sync_channel(QUEUE);
        thread::Builder::new()
            .name("evictd-records".into())
            .spawn(move || write_records(&dir, keep.max(1), &receiver))
            .map_err(DecisionsError::Thread)?;
        Ok(Self { sender })
    }

    /// Hands `record` to the writer; drops it with a warning when the
    /// writer is behind.
    pub(crate) fn record(&self, record: PendingRecord) {
        match self.sender.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(record)) => warn!(
                signal = %record.facts.signal,
                "decision record dropped: its writer is behind (the state directory is slow)"
            ),
            Err(TrySendError::Disconnected(_)) => {
                warn!("decision record dropped: its writer has stopped");
            }
        }
    }
}

fn slot_name(slot: usize) -> String {
    format!("decision-{slot}.json")
}

/// The writer: each record into the slot after the last one written (the
/// newest file at start), around the ring.
fn write_records(dir: &StateDir, keep: usize, records: &Receiver<PendingRecord>) {
    let newest = (0..keep)
        .filter_map(|slot| {
            let modified = dir.modified(&slot_name(slot)).ok().flatten()?;
            Some((modified, slot))
        })
        .max();
    let mut slot = newest.map_or(0, |(_, slot)| (slot + 1) % keep);
    let mut failing = false;
    for pending in records {
        let record = pending.into_record();
        let written = serde_json::to_vec(&record)
            .map_err(std::io::Error::from)
            .map_err(|source| StateError::Io {
                path: dir.path().join(slot_name(slot)),
                source,
            })
            .and_then(|bytes| dir.write(&slot_name(slot), &bytes));
        match written {
            Ok(()) => {
                failing = false;
                slot = (slot + 1) % keep;
            }
            // Once per run of failures: a full disk fails every record.
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "cannot write the decision record");
            }
            Err(_) => {}
        }
    }
}

/// The records in `dir`, oldest first; one that cannot be read or parsed is
/// an error naming it.
pub fn read_records(dir: &StateDir) -> Result<Vec<DecisionRecord>, DecisionsError> {
    let mut records = Vec::new();
    let mut slot = 0;
    // Slots run from 0 without a gap up to the most ever kept; a smaller
    // --decision-records later leaves the higher ones to be read too.
    while let Some(bytes) = dir.read(&slot_name(slot))? {
        let record: DecisionRecord =
            serde_json::from_slice(&bytes).map_err(|source| DecisionsError::Malformed {
                name: slot_name(slot),
                source,
            })?;
        records.push(record);
        slot += 1;
    }
    records.sort_by_key(|record| record.decision.at);
    Ok(records)
}

/// Ranked pods shown by [`explain`]; the rest are counted.
const RANKING_SHOWN: usize = 10;

/// `record` for a person: the threshold and how far the node was past it,
/// what was done to whom, the ranking and why each pod stood where it did,
/// and where the time went.
pub fn explain(record: &DecisionRecord) -> String {
    let decided = &record.decision.facts;
    let bytes = matches!(decided.resource.as_str(), "memory" | "ephemeral-storage");
    let amount = |value: i64| Quantity::from_units(value, bytes).to_string();
    let kind = if decided.hard { "hard" } else { "soft" };
    let mut text = format!(
        "{at}  {signal}: {observed} available, {kind} threshold {threshold} \
         (minimum reclaim {min_reclaim}): {deficit} to reclaim\n",
        at = record.decision.at,
        signal = decided.signal,
        observed = amount(decided.observed),
        threshold = amount(decided.threshold),
        min_reclaim = amount(decided.min_reclaim),
        deficit = amount(decided.deficit),
    );
    let ms = |us: u64| us as f64 / 1000.0;
    let times = &decided.times_us;
    if !decided.outcome.ranked() {
        text += &format!(
            "  trigger {}: {:.3} ms after it\n  {}\n",
            decided.trigger,
            ms(times.decision),
            decided.outcome.as_str()
        );
        return text;
    }
    text += &format!(
        "  trigger {}: decided in {:.3} ms (to the engine run {:.3}, node read {:.3}, \
         pods listed {:.3}, ranked {:.3}, {} exact reads {:.3})\n",
        decided.trigger,
        ms(times.decision),
        ms(times.woken_to_run),
        ms(times.observe),
        ms(times.list),
        ms(times.rank),
        times.exact_reads,
        ms(times.exact_read),
    );
    let victims: Vec<String> = record
        .decision
        .victims
        .iter()
        .map(|victim| {
            format!(
                "{} ({}, {} {}, grace {} s)",
                victim.pod,
                victim.reason,
                decided.resource,
                amount(victim.usage),
                victim.grace_seconds
            )
        })
        .collect();
    text += &format!("  {}", decided.outcome.as_str());
    if !victims.is_empty() {
        text += &format!(": {}", victims.join(", "));
    }
    let ranking = &record.decision.ranking;
    text += &format!(
        "\n  ranking for {} ({} pods):\n",
        decided.resource,
        ranking.len()
    );
    for (place, ranked) in ranking.iter().take(RANKING_SHOWN).enumerate() {
        let victim = record.decision.victims.iter().any(|v| v.pod == ranked.pod);
        text += &format!(
            "    {}. {}: {}{}{}\n",
            place + 1,
            ranked.pod,
            ranked.standing,
            if ranked.exact {
                ""
            } else {
                " (bytes charged: at most this working set)"
            },
            if victim { "  <- victim" } else { "" }
        );
    }
    if ranking.len() > RANKING_SHOWN {
        text += &format!("    (+{} more)\n", ranking.len() - RANKING_SHOWN);
    }
    text
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
