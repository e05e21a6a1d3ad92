//! A pod as the Kubernetes API serves it (JSON, as the pod watch decodes
//! it), through the agent's conversion into what it ranks by
//! ([`known_pod`]), Kubernetes' arithmetic on its resources, and the pod
//! store's lookups by cgroup uid.
use evictd::{
    decide::{resources, snapshot::QosClass},
    node::runtime::local_storage,
    report::kubernetes::{KnownPod, PodStore, known_pod},
};
use k8s_openapi::api::core::v1::Pod;

pub fn pod(data: &[u8]) {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let Some(known) = known_pod(&pod) else {
        assert!(pod.metadata.uid.is_none());
        return;
    };
    let snapshot = &known.snapshot;
    assert_eq!(Some(&snapshot.uid), pod.metadata.uid.as_ref());
    // Only the API's own copy of a static pod is critical by origin.
    assert_eq!(snapshot.is_static, known.mirror_of.is_some());
    for resource in [
        "memory",
        "cpu",
        "ephemeral-storage",
        "pods",
        "hugepages-2Mi",
    ] {
        let _ = resources::request(snapshot, resource);
        let _ = snapshot.request(resource);
    }
    let _ = resources::ephemeral_storage_limit(snapshot);
    let _ = local_storage::has_limit(snapshot);
    // A pod of BestEffort containers requests no memory; with pod-level
    // resources set at all (even empty), the class is theirs alone, as in
    // Kubernetes' ComputePodQOS, while the containers' requests still count.
    if snapshot.qos_class() == QosClass::BestEffort && snapshot.resources.is_none() {
        assert_eq!(snapshot.request("memory"), 0, "{snapshot:?}");
    }
    let _ = (snapshot.key(), snapshot.is_evictable());

    // The pod cache keeps pods as JSON: what it writes reads back equal.
    let json = match serde_json::to_vec(&known) {
        Ok(json) => json,
        Err(e) => panic!("{known:?} does not serialize: {e}"),
    };
    match serde_json::from_slice::<KnownPod>(&json) {
        Ok(again) => assert_eq!(again, known),
        Err(e) => panic!("{known:?} does not read back: {e}"),
    }

    // The store finds it by its uid, and a mirror pod by the static pod's.
    let store = PodStore::default();
    store.preload(vec![known.clone()]);
    assert_eq!(store.get(&snapshot.uid).as_ref(), Some(&known));
    if let Some(static_uid) = &known.mirror_of {
        assert!(store.get(static_uid).is_some(), "{known:?}");
    }
}
