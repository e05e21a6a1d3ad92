//! Eviction reports not yet made final in the API, kept on disk
//! (`reports.json` in the state directory) so that an API outage or an
//! agent restart loses none: every change is written through before the
//! reporter goes on, and a restarted agent replays what is left. Each
//! report remembers how far it got (the status patch or delete, then the
//! node event, then the pod event), so a replay repeats no step that the
//! API already confirmed. The file names the node it was written on: a
//! state directory moved to another node (or a renamed node) must not
//! replay reports about pods that are not this node's.
use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{EvictionAction, EvictionMessage, EvictionNotice, StarvedSignal};
use crate::{
    decide::thresholds::Resource,
    state::{StateDir, StateError},
};

const FILE: &str = "reports.json";
/// Bumped when the file's meaning changes; a journal of another version is
/// set aside, not misread. 2: the node it belongs to.
const FORMAT: u32 = 2;

/// Reports kept at most. A node evicts a few pods a minute at most; 256
/// outlasts an API outage of hours, and keeps the file far below the state
/// directory's per-file bound.
pub const CAPACITY: usize = 256;

/// The next step a report needs, in the order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// The pod's status patch (or its deletion), which stops it being
    /// restarted in place.
    MakeFinal,
    NodeEvent,
    PodEvent,
}

/// One pending report.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub id: u64,
    pub notice: EvictionNotice,
    /// The --eviction-action in force when the pod was evicted.
    pub action: EvictionAction,
    /// When the kill was reported: the events' and the status condition's
    /// time, whenever they are sent.
    pub evicted_at: Timestamp,
    pub stage: Stage,
}

/// The file's representation of a report: plain strings where the agent's
/// types have no serde of their own.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    id: u64,
    namespace: String,
    name: String,
    uid: String,
    resource: String,
    threshold: i64,
    available: i64,
    message: String,
    annotations: BTreeMap<String, String>,
    evicted_by_api: bool,
    /// Absent from journals written before local-storage evictions.
    #[serde(default)]
    pod_limit: bool,
    action: String,
    /// RFC 3339.
    evicted_at: String,
    stage: Stage,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JournalFile {
    format: u32,
    /// The node whose reports these are.
    node: String,
    reports: Vec<Record>,
}

/// The journal holds [`CAPACITY`] reports already.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

pub struct Journal {
    /// None: no usable state directory; reports live in memory only.
    dir: Option<StateDir>,
    node: String,
    reports: Vec<Pending>,
    next_id: u64,
    /// A failed write is warned about once, not on every change.
    write_failed: bool,
}

impl Journal {
    /// Reads what a previous agent on `node` left in `dir`. A file that
    /// cannot be understood, or another node's, is set aside with a
    /// warning.
    pub fn open(dir: Option<StateDir>, node: &str) -> Self {
        let reports = dir.as_ref().map(|dir| load(dir, node)).unwrap_or_default();
        let next_id = reports.iter().map(|r| r.id + 1).max().unwrap_or(0);
        if !reports.is_empty() {
            info!(
                reports = reports.len(),
                "eviction reports left by the previous agent are replayed"
            );
        }
        Self {
            dir,
            node: node.to_owned(),
            reports,
            next_id,
            write_failed: false,
        }
    }

    pub fn len(&self) -> usize {
        self.reports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reports.is_empty()
    }

    /// The oldest pending report.
    pub fn first(&self) -> Option<&Pending> {
        self.reports.first()
    }

    /// Adds a report, unless the journal is full.
    pub fn add(
        &mut self,
        notice: EvictionNotice,
        action: EvictionAction,
        evicted_at: Timestamp,
    ) -> Result<(), Full> {
        if self.reports.len() >= CAPACITY {
            return Err(Full);
        }
        // The Eviction API already removed the pod: only the events remain.
        let stage = if notice.evicted_by_api {
            Stage::NodeEvent
        } else {
            Stage::MakeFinal
        };
        self.reports.push(Pending {
            id: self.next_id,
            notice,
            action,
            evicted_at,
            stage,
        });
        self.next_id += 1;
        self.save();
        Ok(())
    }

    /// Puts report `id` behind every other: its step failed, and the
    /// others are tried before it is again.
    pub fn defer(&mut self, id: u64) {
        if let Some(at) = self.reports.iter().position(|r| r.id == id) {
            let report = self.reports.remove(at);
            self.reports.push(report);
            self.save();
        }
    }

    /// Records that report `id` is through `stage`; removes it after its
    /// last one.
    pub(crate) fn advance(&mut self, id: u64, next: Option<Stage>) {
        match next {
            Some(stage) => {
                if let Some(report) = self.reports.iter_mut().find(|r| r.id == id) {
                    report.stage = stage;
                }
            }
            None => self.reports.retain(|r| r.id != id),
        }
        self.save();
    }

    fn save(&mut self) {
        let Some(dir) = &self.dir else {
            return;
        };
        let file = JournalFile {
            format: FORMAT,
            node: self.node.clone(),
            reports: self.reports.iter().map(record).collect(),
        };
        let result = serde_json::to_vec(&file)
            .map_err(|e| StateError::Io {
                path: dir.path().join(FILE),
                source: e.into(),
            })
            .and_then(|bytes| dir.write(FILE, &bytes));
        match result {
            Ok(()) if self.write_failed => {
                info!(path = %dir.path().join(FILE).display(), "eviction report journal written again");
                self.write_failed = false;
            }
            Ok(()) => {}
            Err(e) if !self.write_failed => {
                warn!(error = %e, "cannot write the eviction report journal; pending reports would not survive a restart");
                self.write_failed = true;
            }
            Err(_) => {}
        }
    }
}

fn record(report: &Pending) -> Record {
    let notice = &report.notice;
    Record {
        id: report.id,
        namespace: notice.namespace.clone(),
        name: notice.name.clone(),
        uid: notice.uid.clone(),
        resource: notice.signal.resource.as_str().to_owned(),
        threshold: notice.signal.threshold,
        available: notice.signal.available,
        message: notice.message.text.clone(),
        annotations: notice.message.annotations.clone(),
        evicted_by_api: notice.evicted_by_api,
        pod_limit: notice.pod_limit,
        action: report.action.as_str().to_owned(),
        evicted_at: report.evicted_at.to_string(),
        stage: report.stage,
    }
}

fn pending(record: Record) -> Option<Pending> {
    let resource = [
        Resource::Memory,
        Resource::Pids,
        Resource::EphemeralStorage,
        Resource::Inodes,
    ]
    .into_iter()
    .find(|r| r.as_str() == record.resource)?;
    let action = EvictionAction::from_name(&record.action)?;
    let evicted_at = record.evicted_at.parse().ok()?;
    Some(Pending {
        id: record.id,
        notice: EvictionNotice {
            namespace: record.namespace,
            name: record.name,
            uid: record.uid,
            signal: StarvedSignal {
                resource,
                threshold: record.threshold,
                available: record.available,
            },
            message: EvictionMessage {
                text: record.message,
                annotations: record.annotations,
            },
            evicted_by_api: record.evicted_by_api,
            pod_limit: record.pod_limit,
        },
        action,
        evicted_at,
        stage: record.stage,
    })
}

/// The reports in `dir`'s journal; none (with a warning, the file set
/// aside) when it cannot be understood or is another node's.
fn load(dir: &StateDir, node: &str) -> Vec<Pending> {
    let bytes = match dir.read(FILE) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Vec::new(),
        Err(e @ (StateError::TooLarge { .. } | StateError::NotRegular { .. })) => {
            return set_aside(dir, &e.to_string());
        }
        Err(e) => {
            warn!(error = %e, "cannot read the eviction report journal; starting without it");
            return Vec::new();
        }
    };
    let file: JournalFile = match serde_json::from_slice(&bytes) {
        Ok(file) => file,
        Err(e) => return set_aside(dir, &e.to_string()),
    };
    if file.format != FORMAT {
        return set_aside(
            dir,
            &format!("format {} (this agent reads {FORMAT})", file.format),
        );
    }
    if file.node != node {
        return set_aside(
            dir,
            &format!(
                "written on node {:?}, not this one ({node:?}): its pods are not this node's",
                file.node
            ),
        );
    }
    let total = file.reports.len();
    let reports: Vec<Pending> = file.reports.into_iter().filter_map(pending).collect();
    if reports.len() < total {
        warn!(
            skipped = total - reports.len(),
            "eviction reports with an unknown resource, action or time are skipped"
        );
    }
    // Ids only tell this agent's reports apart: numbered afresh in the
    // journal's order, so that no id a file holds (one repeated, the
    // largest u64) makes two reports one or the next id overflow.
    reports
        .into_iter()
        .take(CAPACITY)
        .zip(0..)
        .map(|(report, id)| Pending { id, ..report })
        .collect()
}

fn set_aside(dir: &StateDir, problem: &str) -> Vec<Pending> {
    match dir.set_aside(FILE) {
        Ok(aside) => {
            warn!(problem, kept = %aside.display(), "the eviction report journal cannot be read; set aside, starting without it");
        }
        Err(e) => {
            warn!(problem, error = %e, "the eviction report journal cannot be read, nor set aside; starting without it");
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(name: &str) -> EvictionNotice {
        EvictionNotice {
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            signal: StarvedSignal {
                resource: Resource::Memory,
                threshold: 100 << 20,
                available: 50 << 20,
            },
            message: EvictionMessage {
                text: "The node was low on resource: memory. ".into(),
                annotations: BTreeMap::from([("starved_resource".into(), "memory".into())]),
            },
            evicted_by_api: false,
            pod_limit: false,
        }
    }

    /// A journal of node-a in a fresh state directory, holding a status
    /// report for each of `pods`.
    fn journal_of(pods: &[&str]) -> (tempfile::TempDir, StateDir, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let mut journal = Journal::open(Some(state.clone()), "node-a");
        for pod in pods {
            journal
                .add(notice(pod), EvictionAction::Status, Timestamp::now())
                .unwrap();
        }
        (dir, state, journal)
    }

    #[test]
    fn reports_and_their_progress_survive_a_restart() {
        let (_dir, state, mut journal) = journal_of(&["web"]);
        let over_its_limit = EvictionNotice {
            pod_limit: true,
            ..notice("db")
        };
        journal
            .add(over_its_limit, EvictionAction::Delete, Timestamp::now())
            .unwrap();
        let web = journal.first().unwrap().id;
        journal.advance(web, Some(Stage::PodEvent));

        let reopened = Journal::open(Some(state.clone()), "node-a");
        assert_eq!(reopened.reports, journal.reports);
        assert_eq!(reopened.reports[0].stage, Stage::PodEvent);
        assert_eq!(reopened.reports[1].action, EvictionAction::Delete);
        assert_eq!(reopened.reports[1].stage, Stage::MakeFinal);

        let mut reopened = reopened;
        reopened.advance(web, None);
        let db = reopened.first().unwrap().id;
        reopened.advance(db, None);
        assert!(Journal::open(Some(state), "node-a").first().is_none());
    }

    #[test]
    fn a_report_the_eviction_api_made_final_needs_only_its_events() {
        let mut journal = Journal::open(None, "node-a");
        let evicted = EvictionNotice {
            evicted_by_api: true,
            ..notice("web")
        };
        journal
            .add(evicted, EvictionAction::Evict, Timestamp::now())
            .unwrap();
        assert_eq!(journal.first().unwrap().stage, Stage::NodeEvent);
    }

    #[test]
    fn a_corrupt_journal_is_set_aside_and_the_agent_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        state
            .write(
                FILE,
                br#"{"format": 2, "node": "node-a", "reports": [{"id": 0, "namesp"#,
            )
            .unwrap();
        let journal = Journal::open(Some(state.clone()), "node-a");
        assert!(journal.first().is_none());
        assert!(dir.path().join("reports.json.corrupt").is_file());
        assert_eq!(state.read(FILE).unwrap(), None);
    }

    #[test]
    fn a_deferred_report_goes_behind_the_others_also_after_a_restart() {
        let (_dir, state, mut journal) = journal_of(&["hog", "batch"]);
        let hog = journal.first().unwrap().id;
        journal.defer(hog);
        assert_eq!(journal.first().unwrap().notice.name, "batch");
        let reopened = Journal::open(Some(state), "node-a");
        assert_eq!(reopened.first().unwrap().notice.name, "batch");
        assert_eq!(reopened.len(), 2);
    }

    #[test]
    fn another_nodes_journal_is_not_replayed() {
        let (dir, state, _journal) = journal_of(&["web"]);
        // The state directory moved, or the node was renamed.
        let moved = Journal::open(Some(state.clone()), "node-b");
        assert!(moved.first().is_none());
        assert!(dir.path().join("reports.json.corrupt").is_file());
        assert_eq!(state.read(FILE).unwrap(), None);
    }

    #[test]
    fn the_ids_a_file_holds_neither_merge_reports_nor_overflow() {
        let (_dir, state, _) = journal_of(&["web", "db"]);
        let mut file: serde_json::Value =
            serde_json::from_slice(&state.read(FILE).unwrap().unwrap()).unwrap();
        for report in file["reports"].as_array_mut().unwrap() {
            report["id"] = u64::MAX.into();
        }
        state
            .write(FILE, &serde_json::to_vec(&file).unwrap())
            .unwrap();

        let mut journal = Journal::open(Some(state), "node-a");
        journal
            .add(notice("hog"), EvictionAction::Status, Timestamp::now())
            .unwrap();
        let ids: std::collections::BTreeSet<u64> = journal.reports.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 3, "{ids:?}");
        let web = journal.first().unwrap().id;
        journal.advance(web, None);
        assert_eq!(journal.first().unwrap().notice.name, "db");
        assert_eq!(journal.len(), 2);
    }

    #[test]
    fn the_journal_is_bounded() {
        let mut journal = Journal::open(None, "node-a");
        for n in 0..CAPACITY {
            journal
                .add(
                    notice(&format!("pod-{n}")),
                    EvictionAction::Status,
                    Timestamp::now(),
                )
                .unwrap();
        }
        let refused = journal.add(
            notice("one-too-many"),
            EvictionAction::Status,
            Timestamp::now(),
        );
        assert_eq!(refused, Err(Full));
        assert_eq!(journal.len(), CAPACITY);
    }
}
