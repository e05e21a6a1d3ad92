//! Each threshold decision handed to the decision record
//! ([`crate::report::decisions`]): once per decision, not again on every
//! run while the same one is held or not acted on.
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use super::{Evictor, Ranking};
use crate::{
    act::{io::Io, wake::Wake},
    decide::snapshot::NodeStats,
    decide::{engine::Starvation, engine::VictimPolicy, thresholds::Threshold},
    report::decisions::{DecisionFacts, DecisionRecords, Outcome, PendingRecord, StepTimes},
};

/// The record's writer and what a record takes from the engine run.
pub(super) struct Recorder {
    sink: DecisionRecords,
    thresholds: Arc<[Threshold]>,
    /// The node as this run observed it.
    node: Option<NodeStats>,
    /// The last outcome recorded that may repeat run after run, and its
    /// victims.
    last_repeatable: Option<(Outcome, Vec<String>)>,
}

impl<I: Io> Evictor<I> {
    /// Records every threshold decision from now on into `sink`.
    pub(crate) fn set_decision_records(&mut self, sink: DecisionRecords) {
        self.recorder = Some(Recorder {
            sink,
            thresholds: self.config.thresholds.clone().into(),
            node: None,
            last_repeatable: None,
        });
    }

    /// Keeps the node this run observed, for a decision it makes.
    pub(super) fn observed_for_record(&mut self, node: &NodeStats) {
        if let Some(recorder) = &mut self.recorder {
            recorder.node = Some(node.clone());
        }
    }

    /// Hands the decision on `starvation` to the record; `ranking` is
    /// `None` for a hold before any pod was ranked.
    pub(super) fn record_decision(
        &mut self,
        wake: &Wake,
        starvation: &Starvation,
        ranking: Option<&Ranking>,
        outcome: Outcome,
    ) {
        let decision_us = self.clock.since(wake.at_ns).as_micros() as u64;
        let Some(recorder) = &mut self.recorder else {
            return;
        };
        let Some(node) = recorder.node.clone() else {
            return;
        };
        let victims: Vec<String> = ranking
            .map(|ranking| {
                ranking
                    .choice
                    .victims
                    .iter()
                    .map(|v| v.pod.clone())
                    .collect()
            })
            .unwrap_or_default();
        match outcome {
            Outcome::Evicted => recorder.last_repeatable = None,
            _ => {
                let repeat = (outcome, victims);
                if recorder.last_repeatable.as_ref() == Some(&repeat) {
                    return;
                }
                recorder.last_repeatable = Some(repeat);
            }
        }
        let us = |phase: std::time::Duration| phase.as_micros() as u64;
        let times = ranking.map(|ranking| ranking.times).unwrap_or_default();
        recorder.sink.record(PendingRecord {
            time: self.clock.now().as_secs_f64(),
            node,
            pods: ranking
                .map(|ranking| ranking.pods.clone())
                .unwrap_or_default(),
            exact: ranking
                .map(|ranking| ranking.exact.clone())
                .unwrap_or_default(),
            choice: ranking
                .map(|ranking| ranking.choice.clone())
                .unwrap_or_default(),
            thresholds: Arc::clone(&recorder.thresholds),
            thresholds_met: self.engine.thresholds_met_state(self.clock.now()),
            evict_set: self.options.policy == VictimPolicy::CoveringSet,
            pid_ranking: self.options.pid_ranking,
            at: Timestamp::now(),
            facts: DecisionFacts::of(
                starvation,
                wake.cause.as_str(),
                outcome,
                StepTimes {
                    decision: decision_us,
                    woken_to_run: us(times.woken_to_run),
                    observe: us(times.observe),
                    list: us(times.list),
                    rank: us(times.rank),
                    exact_read: us(times.exact_read),
                    exact_reads: times.exact_reads,
                },
            ),
        });
    }
}
