//! Where node-level reclaim stands, one round per signal. kubelet reclaims
//! for the threshold it is about to evict for, with that signal's steps; a
//! round done for one signal says nothing of another's (a split layout's
//! imagefs round removes only images, and must not let a nodefs decision
//! skip the dead containers).
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use super::ReclaimStep;
use crate::decide::thresholds::Signal;

/// What node-level reclaim means for a disk decision now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeReclaim {
    /// Nothing to reclaim for this signal and layout, or no runtime to
    /// reclaim through: decide now.
    Unavailable,
    /// Under way, or just finished: look at the node again before
    /// deciding.
    Pending,
    /// Done for this signal, and the node was looked at again since:
    /// decide on what it shows now.
    Done,
}

/// A round a decision asked for, as the runtime's thread takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReclaimRequest {
    pub signal: Signal,
    pub steps: &'static [ReclaimStep],
    /// Only log what would be removed (`--dry-run`).
    pub dry_run: bool,
    /// The pods evictd sees alive, by uid: each keeps its newest dead
    /// container of each name ([`super::dead_containers`]).
    pub live_pods: BTreeSet<String>,
}

#[derive(Debug)]
enum Round {
    Requested(ReclaimRequest),
    Running,
    /// Finished at `at`; `seen` once a decision has been told, after which
    /// it looked at the node again.
    Done {
        at: Instant,
        seen: bool,
    },
}

/// Every signal's round.
#[derive(Debug, Default)]
pub(crate) struct ReclaimRounds {
    rounds: BTreeMap<Signal, Round>,
}

impl ReclaimRounds {
    /// Where `signal`'s round stands for a decision at `now`; `None` when a
    /// new round is due, none having been done for the signal in the last
    /// `fresh_for` (kubelet reclaims on every synchronize round under
    /// pressure): [`request`](Self::request) it.
    pub(crate) fn status(
        &mut self,
        signal: Signal,
        now: Instant,
        fresh_for: Duration,
    ) -> Option<NodeReclaim> {
        match self.rounds.get_mut(&signal)? {
            Round::Requested(_) | Round::Running => Some(NodeReclaim::Pending),
            Round::Done { seen, .. } if !*seen => {
                *seen = true;
                Some(NodeReclaim::Pending)
            }
            Round::Done { at, .. } if now.saturating_duration_since(*at) <= fresh_for => {
                Some(NodeReclaim::Done)
            }
            Round::Done { .. } => None,
        }
    }

    /// Asks for a round, which the thread takes next.
    pub(crate) fn request(&mut self, request: ReclaimRequest) {
        self.rounds
            .insert(request.signal, Round::Requested(request));
    }

    /// A requested round, now running.
    pub(crate) fn take(&mut self) -> Option<ReclaimRequest> {
        let signal = self
            .rounds
            .iter()
            .find_map(|(signal, round)| matches!(round, Round::Requested(_)).then_some(*signal))?;
        match self.rounds.insert(signal, Round::Running) {
            Some(Round::Requested(request)) => Some(request),
            _ => None,
        }
    }

    /// `signal`'s round finished at `at`: the next decision looks at the
    /// node again before it evicts.
    pub(crate) fn finish(&mut self, signal: Signal, at: Instant) {
        self.rounds.insert(signal, Round::Done { at, seen: false });
    }

    /// Whether a round waits for the thread.
    pub(crate) fn requested(&self) -> bool {
        self.rounds
            .values()
            .any(|round| matches!(round, Round::Requested(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(signal: Signal, steps: &'static [ReclaimStep]) -> ReclaimRequest {
        ReclaimRequest {
            signal,
            steps,
            dry_run: false,
            live_pods: BTreeSet::new(),
        }
    }

    const FRESH: Duration = Duration::from_secs(10);

    /// A split layout: imagefs removes images only, nodefs dead containers
    /// only. An imagefs round just done does not stand for nodefs.
    #[test]
    fn each_signal_has_its_own_round() {
        let now = Instant::now();
        let mut rounds = ReclaimRounds::default();
        assert_eq!(rounds.status(Signal::ImageFsAvailable, now, FRESH), None);
        rounds.request(request(
            Signal::ImageFsAvailable,
            &[ReclaimStep::UnusedImages],
        ));
        assert!(rounds.requested());
        assert_eq!(
            rounds.status(Signal::ImageFsAvailable, now, FRESH),
            Some(NodeReclaim::Pending)
        );
        let taken = rounds.take().unwrap();
        assert_eq!(taken.steps, [ReclaimStep::UnusedImages]);
        rounds.finish(Signal::ImageFsAvailable, now);
        assert!(!rounds.requested());
        // Looked at again, then done for imagefs...
        assert_eq!(
            rounds.status(Signal::ImageFsAvailable, now, FRESH),
            Some(NodeReclaim::Pending)
        );
        assert_eq!(
            rounds.status(Signal::ImageFsAvailable, now, FRESH),
            Some(NodeReclaim::Done)
        );
        // ...not for nodefs: its dead containers are asked for.
        assert_eq!(rounds.status(Signal::NodeFsAvailable, now, FRESH), None);
        rounds.request(request(
            Signal::NodeFsAvailable,
            &[ReclaimStep::DeadContainers],
        ));
        assert_eq!(rounds.take().unwrap().steps, [ReclaimStep::DeadContainers]);
        assert_eq!(rounds.take(), None, "taken once");
        // Stale: due again.
        let later = now + FRESH + Duration::from_secs(1);
        assert_eq!(rounds.status(Signal::ImageFsAvailable, later, FRESH), None);
    }
}
