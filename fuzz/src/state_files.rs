//! The files of `--state-dir` as a crash, a disk or another writer may
//! leave them, read at startup as the agent reads them: the report journal
//! (`reports.json`), the pod metadata cache (`pod-metadata.json`), the
//! eviction budget (`budget.json`) and the images' first sightings
//! (`images-first-seen.json`). The input is each file's contents in turn:
//! what one loader accepts the others refuse. A file accepted holds within
//! its bounds and what the agent writes back from it reads back the same;
//! a file refused is set aside, never lost and never read again.
use std::{
    fs,
    path::Path,
    time::{Duration, SystemTime},
};

use evictd::{
    act::evictor::{REMEMBERED_EVICTIONS, SpentBudget},
    decide::thresholds::Resource,
    node::runtime::reclaim::images::{DEFAULT_MINIMUM_AGE, ImageTracker},
    report::kubernetes::{
        EvictionAction, EvictionMessage, EvictionNotice, JOURNAL_CAPACITY, Journal, PodCache,
        PodStore, StarvedSignal,
    },
    state::StateDir,
};
use k8s_openapi::jiff::Timestamp;

use crate::scratch_dir;

/// The node the agent runs on; seeds name it.
const NODE: &str = "node-a";

pub fn state_files(data: &[u8]) {
    let scratch = scratch_dir("state-files");
    let path = scratch.path().join("state");
    let state = match StateDir::open(&path) {
        Ok(state) => state,
        Err(e) => panic!("{e}"),
    };
    journal(&state, data);
    pod_cache(&state, data);
    budget(&path, data);
    images(&state, data);
}

/// Writes `data` as the file `name` a previous agent left.
fn leave(state: &StateDir, name: &str, data: &[u8]) {
    let path = state.path().join(name);
    if let Err(e) = fs::write(&path, data) {
        panic!("writing {}: {e}", path.display());
    }
}

/// Whether `name` is still there, or was set aside as unusable.
fn kept(state: &StateDir, name: &str) -> (bool, bool) {
    let exists = |name: &str| state.path().join(name).exists();
    (exists(name), exists(&format!("{name}.corrupt")))
}

fn journal(state: &StateDir, data: &[u8]) {
    const FILE: &str = "reports.json";
    leave(state, FILE, data);
    let mut journal = Journal::open(Some(state.clone()), NODE);
    let loaded = journal.len();
    assert!(loaded <= JOURNAL_CAPACITY);
    let (there, aside) = kept(state, FILE);
    assert!(there != aside, "{FILE} neither kept nor set aside");
    if !journal.is_empty() {
        assert!(there, "{loaded} reports replayed from a file set aside");
    }
    // A report evictd adds after a replay gets an id of its own, and the
    // journal it writes reads back whole.
    let added = journal.add(notice(), EvictionAction::Status, Timestamp::UNIX_EPOCH);
    assert_eq!(added.is_ok(), loaded < JOURNAL_CAPACITY);
    let again = Journal::open(Some(state.clone()), NODE);
    assert_eq!(
        again.len(),
        journal.len(),
        "the journal written does not read back"
    );
    // Each report is taken by its id: going round the journal meets each
    // id once.
    let mut ids = Vec::new();
    for _ in 0..journal.len() {
        let Some(first) = journal.first() else {
            break;
        };
        let id = first.id;
        assert!(!ids.contains(&id), "two reports with id {id}");
        ids.push(id);
        journal.defer(id);
    }
}

fn notice() -> EvictionNotice {
    EvictionNotice {
        namespace: "default".to_owned(),
        name: "hog".to_owned(),
        uid: "2c1f9a5e-0000-4000-8000-000000000001".to_owned(),
        signal: StarvedSignal {
            resource: Resource::Memory,
            threshold: 100 << 20,
            available: 50 << 20,
        },
        message: EvictionMessage {
            text: "The node was low on resource: memory. ".to_owned(),
            annotations: Default::default(),
        },
        evicted_by_api: false,
        pod_limit: false,
    }
}

fn pod_cache(state: &StateDir, data: &[u8]) {
    const FILE: &str = "pod-metadata.json";
    leave(state, FILE, data);
    let store = PodStore::default();
    PodCache::new(state.clone(), NODE).load_into(&store);
    if !store.is_empty() {
        assert!(kept(state, FILE).0, "pods loaded from a file set aside");
    }
    // What the agent writes from the pods it loaded loads back the same.
    let (_, mut pods) = store.pods();
    let mut cache = PodCache::new(state.clone(), NODE);
    cache.save(&store);
    let again = PodStore::default();
    PodCache::new(state.clone(), NODE).load_into(&again);
    let (_, mut pods_again) = again.pods();
    let by_uid = |a: &evictd::report::kubernetes::KnownPod,
                  b: &evictd::report::kubernetes::KnownPod| {
        a.snapshot.uid.cmp(&b.snapshot.uid)
    };
    pods.sort_by(by_uid);
    pods_again.sort_by(by_uid);
    assert_eq!(pods, pods_again, "the pod cache written does not read back");
}

fn budget(dir: &Path, data: &[u8]) {
    const FILE: &str = "budget.json";
    let state = match StateDir::open(dir) {
        Ok(state) => state,
        Err(e) => panic!("{e}"),
    };
    leave(&state, FILE, data);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let Some(budget) = SpentBudget::new(dir, NODE) else {
        panic!("the budget's thread did not start");
    };
    let ago = budget.load(now);
    assert!(ago.len() <= REMEMBERED_EVICTIONS);
    assert!(ago.windows(2).all(|w| w[0] >= w[1]), "not oldest first");
    let since_epoch = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    assert!(ago.iter().all(|ago| *ago <= since_epoch), "{ago:?}");
    if !ago.is_empty() {
        assert!(
            kept(&state, FILE).0,
            "a budget loaded from a file set aside"
        );
    }
    // Written back (the thread writes before it stops), it loads the same,
    // to the millisecond the file keeps.
    budget.save(ago.iter().copied(), now);
    drop(budget);
    let Some(again) = SpentBudget::new(dir, NODE) else {
        panic!("the budget's thread did not start");
    };
    assert_eq!(
        again.load(now),
        ago,
        "the budget written does not read back"
    );
}

fn images(state: &StateDir, data: &[u8]) {
    const FILE: &str = "images-first-seen.json";
    leave(state, FILE, data);
    let mut tracker = ImageTracker::persisted(DEFAULT_MINIMUM_AGE, state.clone());
    let (there, aside) = kept(state, FILE);
    assert!(there != aside, "{FILE} neither kept nor set aside");
    // Forgetting every image writes a file the next agent reads.
    tracker.observe(
        &[],
        &[],
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    );
    let before = kept(state, FILE);
    ImageTracker::persisted(DEFAULT_MINIMUM_AGE, state.clone());
    assert_eq!(
        kept(state, FILE),
        before,
        "what the tracker wrote was set aside"
    );
}
