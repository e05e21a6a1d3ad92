//! The last known metadata of this node's pods, kept on disk
//! (`pod-metadata.json` in the state directory) so that an agent started
//! while the API server is away still knows which pods are critical, what
//! they request and their priority: not knowing a pod must never make it
//! more likely to die. The watch writes the file after its first list and
//! then at most every [`SAVE_PERIOD`] while pods change; a restarted agent
//! loads it before its first decision, and the first list from the API
//! replaces it.
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::pods::{KnownPod, PodStore};
use crate::state::{StateDir, StateError};

const FILE: &str = "pod-metadata.json";
/// Bumped when the file's meaning changes; a cache of another version is
/// ignored, not misread.
const FORMAT: u32 = 1;
/// The most often the cache is rewritten while pods change.
pub(crate) const SAVE_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    format: u32,
    /// The node the pods were bound to: a state directory moved to another
    /// node (or a renamed node) must not lend its pods' metadata.
    node: String,
    pods: Vec<KnownPod>,
}

/// The cache of one node's pods in one state directory.
#[derive(Debug)]
pub struct PodCache {
    state: StateDir,
    node: String,
    /// The store's generation last written (or loaded).
    saved: Option<u64>,
}

impl PodCache {
    pub fn new(state: StateDir, node: &str) -> Self {
        Self {
            state,
            node: node.to_owned(),
            saved: None,
        }
    }

    /// Fills `store`, which has not listed yet, with the pods a previous
    /// agent knew. A cache that cannot be used is a warning (set aside when
    /// unreadable), never a reason not to start.
    pub fn load_into(&mut self, store: &PodStore) {
        let bytes = match self.state.read(FILE) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return,
            Err(e) => return self.set_aside(&e.to_string()),
        };
        let file: CacheFile = match serde_json::from_slice(&bytes) {
            Ok(file) => file,
            Err(e) => return self.set_aside(&e.to_string()),
        };
        if file.format != FORMAT || file.node != self.node {
            warn!(
                format = file.format,
                node = file.node,
                "the pod metadata cache is of another format or node; not used"
            );
            return;
        }
        let pods = file.pods.len();
        self.saved = Some(store.preload(file.pods));
        info!(
            pods,
            "pod metadata from the last agent's cache, until the API lists the pods"
        );
    }

    /// Writes the store's pods when they changed since the last write.
    /// Failures are warnings: the previous file stays whole.
    pub fn save(&mut self, store: &PodStore) {
        let (generation, pods) = store.pods();
        if self.saved == Some(generation) {
            return;
        }
        let file = CacheFile {
            format: FORMAT,
            node: self.node.clone(),
            pods,
        };
        let result = serde_json::to_vec(&file)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                self.state
                    .write(FILE, &bytes)
                    .map_err(|e: StateError| e.to_string())
            });
        match result {
            Ok(()) => self.saved = Some(generation),
            Err(error) => warn!(
                error,
                "pod metadata cache not written; a restart during an API outage would use an older one"
            ),
        }
    }

    fn set_aside(&self, error: &str) {
        match self.state.set_aside(FILE) {
            Ok(kept) => warn!(
                error,
                kept = %kept.display(),
                "the pod metadata cache cannot be read; set aside, starting without it"
            ),
            Err(e) => warn!(
                error,
                set_aside = %e,
                "the pod metadata cache cannot be read; starting without it"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn known(name: &str, uid: &str, priority: i32) -> KnownPod {
        KnownPod {
            snapshot: serde_json::from_value(json!({
                "namespace": "kube-system", "name": name, "uid": uid,
                "priority": priority, "containers": [],
            }))
            .unwrap(),
            container_ids: vec![("c".into(), "containerd://abc".into())],
            mirror_of: None,
        }
    }

    fn state() -> (tempfile::TempDir, StateDir) {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("evictd")).unwrap();
        (dir, state)
    }

    #[test]
    fn a_restarted_agent_knows_the_pods_the_last_one_saved() {
        let (_dir, state) = state();
        let store = PodStore::default();
        store.preload(vec![
            known("cni", "u1", 2_000_001_000),
            known("app", "u2", 0),
        ]);
        PodCache::new(state.clone(), "node-a").save(&store);

        let restarted = PodStore::default();
        PodCache::new(state, "node-a").load_into(&restarted);
        let cni = restarted.get("u1").unwrap();
        assert_eq!(cni.snapshot.priority, 2_000_001_000);
        assert!(cni.snapshot.is_critical());
        assert_eq!(cni.container_ids, [("c".into(), "containerd://abc".into())]);
        assert_eq!(restarted.len(), 2);
        assert!(!restarted.listed(), "a cache is no list from the API");
    }

    #[test]
    fn another_nodes_cache_is_not_used() {
        let (_dir, state) = state();
        let store = PodStore::default();
        store.preload(vec![known("cni", "u1", 2_000_001_000)]);
        PodCache::new(state.clone(), "node-a").save(&store);

        let restarted = PodStore::default();
        PodCache::new(state, "node-b").load_into(&restarted);
        assert!(restarted.is_empty());
    }

    #[test]
    fn an_unreadable_cache_is_set_aside_and_the_agent_starts_without_it() {
        let (_dir, state) = state();
        state.write(FILE, b"{\"format\": 1, \"node\": ").unwrap();
        let store = PodStore::default();
        PodCache::new(state.clone(), "node-a").load_into(&store);
        assert!(store.is_empty());
        assert!(state.path().join("pod-metadata.json.corrupt").exists());
        assert!(state.read(FILE).unwrap().is_none());
    }

    #[test]
    fn an_unchanged_store_is_not_written_again() {
        let (_dir, state) = state();
        let store = PodStore::default();
        store.preload(vec![known("app", "u2", 0)]);
        let mut cache = PodCache::new(state.clone(), "node-a");
        cache.save(&store);
        std::fs::remove_file(state.path().join(FILE)).unwrap();
        cache.save(&store);
        assert!(state.read(FILE).unwrap().is_none());
        store.preload(vec![known("cni", "u1", 2_000_001_000)]);
        cache.save(&store);
        assert!(state.read(FILE).unwrap().is_some());
    }
}
