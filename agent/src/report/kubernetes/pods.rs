//! The node's pods as the API server knows them, kept in memory by a watch
//! on `spec.nodeName=<node>` and looked up by the uid in a pod's cgroup
//! name. Lookups never touch the network: when the API is slow or down the
//! store answers with what it last saw (after a restart, what the last
//! agent saw: pod_cache.rs), and a pod it has never seen gets the
//! cgroup-derived defaults (inventory.rs), ranked after every pod it knows.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, PoisonError, RwLock},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::{
    ApiErrors,
    pod_cache::{PodCache, SAVE_PERIOD},
};
use crate::{
    decide::snapshot::{ContainerSpec, EmptyDirVolume, PodSnapshot, ResourceList, Resources},
    metrics::Metrics,
    node::inventory::{InventoryError, PodMetadataSource},
    quantity::Quantity,
};

/// On a mirror pod, the API server's copy of a static pod: the uid of the
/// static pod it mirrors, which is the uid in the static pod's cgroup name.
/// Every other pod from the API server is an ordinary one, whatever its
/// `kubernetes.io/config.source` annotation says: kubelet sets that
/// annotation on its own copy of a pod, but anyone who may create a pod may
/// write it into the pod's metadata too.
const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A pod from the API: what the engine ranks by, and what the eviction
/// report needs (also the pod metadata cache's record of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnownPod {
    pub snapshot: PodSnapshot,
    /// (container name, runtime id) from `status.containerStatuses`, to find
    /// each container's cgroup.
    pub container_ids: Vec<(String, String)>,
    /// On a mirror pod: the static pod's uid, which its cgroup carries.
    pub mirror_of: Option<String>,
}

#[derive(Debug, Default)]
struct StoredPods {
    /// By API uid.
    pods: HashMap<String, KnownPod>,
    /// Static pod uid (its cgroup's) -> API uid of its mirror pod.
    mirrors: HashMap<String, String>,
    /// Whether a full list has arrived since the agent started.
    listed: bool,
    /// Counts changes, so the metadata cache is written only after one, and
    /// a listing knows when the pods it built from the store are stale.
    generation: u64,
}

impl StoredPods {
    /// The pod whose cgroup carries `uid`. A pod's own uid wins over a
    /// mirror annotation naming it, which anyone may write.
    fn get(&self, uid: &str) -> Option<&KnownPod> {
        self.pods
            .get(uid)
            .or_else(|| self.pods.get(self.mirrors.get(uid)?))
    }

    fn insert(&mut self, pod: KnownPod) {
        self.generation += 1;
        if let Some(mirrored) = &pod.mirror_of {
            self.mirrors
                .insert(mirrored.clone(), pod.snapshot.uid.clone());
        }
        self.pods.insert(pod.snapshot.uid.clone(), pod);
    }

    fn remove(&mut self, uid: &str) {
        self.generation += 1;
        if let Some(pod) = self.pods.remove(uid)
            && let Some(mirrored) = &pod.mirror_of
        {
            self.mirrors.remove(mirrored);
        }
    }
}

/// Shared handle: the watch task writes, the engine reads.
#[derive(Debug, Clone, Default)]
pub struct PodStore {
    state: Arc<RwLock<StoredPods>>,
}

impl PodStore {
    /// The pod whose cgroup carries `uid`: an API pod, or the mirror pod of
    /// a static pod.
    pub fn get(&self, uid: &str) -> Option<KnownPod> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.get(uid).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first full list has arrived.
    pub(crate) fn listed(&self) -> bool {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.listed
    }

    /// Fills a store no list has reached yet with the pods a previous agent
    /// knew (the metadata cache); returns the store's generation after.
    pub fn preload(&self, pods: Vec<KnownPod>) -> u64 {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if !state.listed {
            for pod in pods {
                state.insert(pod);
            }
        }
        state.generation
    }

    /// Every pod, with the store's generation.
    pub fn pods(&self) -> (u64, Vec<KnownPod>) {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        (state.generation, state.pods.values().cloned().collect())
    }

    fn apply(&self, pod: &Pod) {
        let Some(known) = known_pod(pod) else {
            return;
        };
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.insert(known);
    }

    fn delete(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.remove(uid);
    }

    /// A fresh list replaces everything: pods deleted while the watch was
    /// down disappear.
    fn replace(&self, pods: &[Pod]) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let mut fresh = StoredPods {
            listed: true,
            generation: state.generation + 1,
            ..StoredPods::default()
        };
        for known in pods.iter().filter_map(known_pod) {
            fresh.insert(known);
        }
        *state = fresh;
    }
}

impl PodMetadataSource for PodStore {
    fn lookup(&mut self, uid: &str) -> Result<Option<PodSnapshot>, InventoryError> {
        Ok(self.get(uid).map(|pod| pod.snapshot))
    }

    fn generation(&self) -> u64 {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.generation
    }
}

/// Keeps `store` in step with the API server's pods bound to `node_name`
/// until the task is dropped. The watcher resumes from its last resource
/// version after an error, relisting when the server says it is too old,
/// with kube-runtime's backoff between attempts (no retry storm).
/// The pods are written to `cache` after the first list and then at most
/// every [`SAVE_PERIOD`] while they change.
pub(crate) async fn watch(
    client: Client,
    node_name: String,
    store: PodStore,
    mut cache: Option<PodCache>,
    metrics: Arc<Metrics>,
    errors: ApiErrors,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listing: Vec<Pod> = Vec::new();
    let mut failing = false;
    let mut save = tokio::time::interval(SAVE_PERIOD);
    save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let event = tokio::select! {
            event = events.next() => match event {
                Some(event) => event,
                None => break,
            },
            _ = save.tick() => {
                if let Some(cache) = cache.as_mut() {
                    cache.save(&store);
                }
                continue;
            }
        };
        match event {
            // The watcher says Init before it sends any request, so it is
            // no sign that the API answers.
            Ok(watcher::Event::Init) => {
                listing.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(pod)) => listing.push(pod),
            Ok(watcher::Event::InitDone) => {
                let first = !store.listed();
                store.replace(&listing);
                listing.clear();
                if first && let Some(cache) = cache.as_mut() {
                    cache.save(&store);
                }
                if first {
                    info!(
                        node = node_name,
                        pods = store.len(),
                        "pods listed from the Kubernetes API"
                    );
                } else {
                    debug!(pods = store.len(), "pods relisted");
                }
            }
            Ok(watcher::Event::Apply(pod)) => store.apply(&pod),
            Ok(watcher::Event::Delete(pod)) => store.delete(&pod),
            Err(error) => {
                let status = match &error {
                    watcher::Error::InitialListFailed(e)
                    | watcher::Error::WatchStartFailed(e)
                    | watcher::Error::WatchFailed(e) => errors.failed("watch", "pods", e),
                    watcher::Error::WatchError(status) => {
                        errors.status("watch", "pods", status.code, &status.reason)
                    }
                    watcher::Error::NoResourceVersion => errors.status("watch", "pods", 0, ""),
                };
                // One warning per outage; the 403 case was already logged
                // once, naming the missing permission.
                if !failing && !status.forbidden {
                    warn!(error = %error, "pod watch failed; evictd keeps the pods it knows and protects the node with cgroup metadata for new ones, retrying with backoff");
                }
                failing = true;
                continue;
            }
        }
        if failing {
            info!("pod watch restored");
            failing = false;
        }
        metrics.kube_pods.set(store.len() as i64);
    }
}

/// What the engine needs of an API pod; `None` for an object without uid,
/// which the API server never sends.
pub fn known_pod(pod: &Pod) -> Option<KnownPod> {
    let meta = &pod.metadata;
    let uid = meta.uid.clone()?;
    let annotations = meta.annotations.as_ref();
    let mirror_of = annotations
        .and_then(|a| a.get(CONFIG_MIRROR_ANNOTATION))
        .cloned();
    let spec = pod.spec.as_ref();
    let containers = spec
        .map(|spec| spec.containers.iter().map(container_spec).collect())
        .unwrap_or_default();
    let init_containers = spec
        .and_then(|spec| spec.init_containers.as_ref())
        .map(|init| init.iter().map(container_spec).collect())
        .unwrap_or_default();
    let context = format!("pod {}", meta.name.as_deref().unwrap_or(&uid));
    let container_ids = pod
        .status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .map(|statuses| {
            statuses
                .iter()
                .filter_map(|status| {
                    let id = status.container_id.as_deref()?;
                    // "containerd://<id>": the runtime's scheme, then the id.
                    let id = id.split_once("://").map_or(id, |(_, id)| id);
                    Some((status.name.clone(), id.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(KnownPod {
        snapshot: PodSnapshot {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid,
            priority: spec.and_then(|spec| spec.priority).unwrap_or(0),
            // A mirror pod stands for the static pod whose cgroup looks it
            // up; no other API pod is static (kubelet's IsStaticPod is true
            // of its own copies only, never of what the API server serves).
            is_static: mirror_of.is_some(),
            mirror: mirror_of.is_some(),
            containers,
            init_containers,
            overhead: quantities(&context, spec.and_then(|spec| spec.overhead.as_ref())),
            resources: spec
                .and_then(|spec| spec.resources.as_ref())
                .map(|resources| Resources {
                    requests: quantities(&context, resources.requests.as_ref()),
                    limits: quantities(&context, resources.limits.as_ref()),
                }),
            empty_dirs: spec
                .and_then(|spec| spec.volumes.as_ref())
                .map(|volumes| empty_dirs(&context, volumes))
                .unwrap_or_default(),
            termination_grace_period_seconds: spec
                .and_then(|spec| spec.termination_grace_period_seconds),
            usage: Default::default(),
            cgroup: None,
            unknown: Vec::new(),
            cgroup_qos: None,
            hosts_evictd: false,
        },
        container_ids,
        mirror_of,
    })
}

fn container_spec(container: &Container) -> ContainerSpec {
    let resources = container.resources.as_ref();
    let context = format!("container {}", container.name);
    ContainerSpec {
        name: container.name.clone(),
        requests: quantities(&context, resources.and_then(|r| r.requests.as_ref())),
        limits: quantities(&context, resources.and_then(|r| r.limits.as_ref())),
        restart_policy: container.restart_policy.clone(),
    }
}

/// The emptyDir volumes of a pod spec and their `sizeLimit`s.
fn empty_dirs(context: &str, volumes: &[Volume]) -> Vec<EmptyDirVolume> {
    volumes
        .iter()
        .filter_map(|volume| {
            let source = volume.empty_dir.as_ref()?;
            let size_limit = source.size_limit.as_ref().and_then(|limit| {
                Quantity::parse(&limit.0)
                    .map_err(|e| warn!(context, volume = volume.name, error = %e, "unreadable sizeLimit ignored"))
                    .ok()
            });
            Some(EmptyDirVolume {
                name: volume.name.clone(),
                size_limit,
            })
        })
        .collect()
}

/// A resource map of the API, in evictd's quantities; `context` names the
/// container or pod in the warning about a quantity that does not parse.
fn quantities(
    context: &str,
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> ResourceList {
    map.into_iter()
        .flatten()
        .filter_map(|(resource, quantity)| match Quantity::parse(&quantity.0) {
            Ok(parsed) => Some((resource.clone(), parsed)),
            Err(e) => {
                // The API server validates quantities; this is a bug
                // somewhere, not a reason to drop the pod.
                warn!(context, error = %e, "unreadable quantity ignored");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_api_pod_carries_what_the_engine_ranks_by() {
        let store = PodStore::default();
        store.replace(&[pod(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1",
                         "annotations": {"kubernetes.io/config.source": "api"}},
            "spec": {"priority": 100, "terminationGracePeriodSeconds": 45, "containers": [
                {"name": "app", "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "1Gi"}}}]},
            "status": {"containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "containerID": "containerd://abc123"}]}
        }))]);
        let known = store.get("u-1").unwrap();
        assert_eq!(known.snapshot.key(), "shop/web");
        assert_eq!(known.snapshot.priority, 100);
        assert!(!known.snapshot.is_critical());
        assert_eq!(known.snapshot.termination_grace_period_seconds, Some(45));
        let app = &known.snapshot.containers[0];
        assert_eq!(app.requests["memory"], Quantity::parse("64Mi").unwrap());
        assert_eq!(app.limits["memory"], Quantity::parse("1Gi").unwrap());
        assert_eq!(
            known.container_ids,
            [("app".to_owned(), "abc123".to_owned())]
        );
        assert!(store.listed());
    }

    #[test]
    fn an_api_pod_carries_its_empty_dirs_and_their_size_limits() {
        let store = PodStore::default();
        store.apply(&pod(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {
                "containers": [{"name": "app"}],
                "volumes": [
                    {"name": "scratch", "emptyDir": {"sizeLimit": "4Mi"}},
                    {"name": "cache", "emptyDir": {}},
                    {"name": "config", "configMap": {"name": "web"}}]
            }
        })));
        let pod = store.get("u-1").unwrap().snapshot;
        assert_eq!(
            pod.empty_dirs,
            [
                EmptyDirVolume {
                    name: "scratch".into(),
                    size_limit: Some(Quantity::parse("4Mi").unwrap()),
                },
                EmptyDirVolume {
                    name: "cache".into(),
                    size_limit: None,
                },
            ]
        );
    }

    #[test]
    fn an_api_pod_carries_init_containers_overhead_and_pod_level_resources() {
        let store = PodStore::default();
        store.apply(&pod(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {
                "containers": [{"name": "app", "resources": {"requests": {"memory": "100Mi"}}}],
                "initContainers": [
                    {"name": "proxy", "restartPolicy": "Always",
                     "resources": {"requests": {"memory": "50Mi"}}},
                    {"name": "migrate", "resources": {"limits": {"memory": "300Mi"}}}],
                "overhead": {"memory": "10Mi"},
                "resources": {"limits": {"cpu": "2"}}
            }
        })));
        let pod = store.get("u-1").unwrap().snapshot;
        let names: Vec<_> = pod
            .init_containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["proxy", "migrate"]);
        assert_eq!(
            pod.init_containers[0].restart_policy.as_deref(),
            Some("Always")
        );
        assert_eq!(pod.init_containers[1].restart_policy, None);
        assert_eq!(pod.overhead["memory"], Quantity::parse("10Mi").unwrap());
        let resources = pod.resources.as_ref().unwrap();
        assert_eq!(resources.limits["cpu"], Quantity::parse("2").unwrap());
        assert!(resources.requests.is_empty());
        // Pod-level cpu limits: memory's pod-level request defaults to the
        // containers' aggregate, max(100Mi + 50Mi, 50Mi + 300Mi), plus
        // the overhead.
        assert_eq!(pod.request("memory"), 360 << 20);
    }

    #[test]
    fn a_forged_config_source_annotation_does_not_make_a_pod_static() {
        let store = PodStore::default();
        store.replace(&[pod(json!({
            "metadata": {"name": "sneaky", "namespace": "default", "uid": "u-2",
                         "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"containers": [{"name": "app"}]}
        }))]);
        let known = store.get("u-2").unwrap();
        assert!(!known.snapshot.is_static && !known.snapshot.mirror);
        assert!(known.snapshot.is_evictable());
    }

    #[test]
    fn a_forged_mirror_annotation_does_not_shield_another_pod() {
        let store = PodStore::default();
        let victim = pod(json!({
            "metadata": {"name": "victim", "namespace": "default", "uid": "u-3"},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let shield = pod(json!({
            "metadata": {"name": "shield", "namespace": "default", "uid": "u-4",
                         "annotations": {"kubernetes.io/config.mirror": "u-3"}},
            "spec": {"containers": [{"name": "app"}]}
        }));
        store.replace(&[victim.clone(), shield.clone()]);
        let found = store.get("u-3").unwrap().snapshot;
        assert_eq!(found.key(), "default/victim");
        assert!(found.is_evictable());
        store.replace(&[shield, victim]);
        assert_eq!(store.get("u-3").unwrap().snapshot.key(), "default/victim");
    }

    #[test]
    fn a_static_pods_cgroup_finds_its_mirror_pod_and_stays_protected() {
        let store = PodStore::default();
        let mirror = pod(json!({
            "metadata": {"name": "etcd-node-a", "namespace": "kube-system", "uid": "mirror-uid",
                         "annotations": {"kubernetes.io/config.source": "file",
                                         "kubernetes.io/config.mirror": "0123456789abcdef0123456789abcdef"}},
            "spec": {"containers": [{"name": "etcd"}]}
        }));
        store.apply(&mirror);
        let known = store.get("0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(known.snapshot.key(), "kube-system/etcd-node-a");
        assert!(known.snapshot.is_static && known.snapshot.mirror);
        assert!(known.snapshot.is_critical());
        store.delete(&mirror);
        assert!(store.get("0123456789abcdef0123456789abcdef").is_none());
        assert!(store.is_empty());
    }
}
