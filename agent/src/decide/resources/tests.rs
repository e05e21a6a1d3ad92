use rstest::rstest;
use serde_json::{Value, json};

use super::*;

const MI: i64 = 1 << 20;

/// A pod from the fields of its spec, as a snapshot file spells them.
fn pod(spec: Value) -> PodSnapshot {
    let mut fields = json!({"namespace": "default", "name": "p", "containers": []});
    for (key, value) in spec.as_object().unwrap() {
        fields[key] = value.clone();
    }
    serde_json::from_value(fields).unwrap()
}

fn memory(spec: Value) -> i64 {
    pod(spec).request("memory")
}

#[rstest]
#[case::containers_sum(
    json!({"containers": [
        {"name": "a", "requests": {"memory": "100Mi"}},
        {"name": "b", "limits": {"memory": "50Mi"}}]}),
    150
)]
#[case::an_init_container_above_the_sum_is_the_request(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "init_containers": [{"name": "migrate", "requests": {"memory": "300Mi"}}]}),
    300
)]
#[case::init_containers_run_one_at_a_time(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "init_containers": [
               {"name": "one", "requests": {"memory": "80Mi"}},
               {"name": "two", "limits": {"memory": "90Mi"}}]}),
    100
)]
#[case::sidecars_run_beside_the_containers(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "init_containers": [
               {"name": "proxy", "restart_policy": "Always", "requests": {"memory": "50Mi"}}]}),
    150
)]
#[case::an_init_container_after_a_sidecar_runs_beside_it(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "init_containers": [
               {"name": "proxy", "restart_policy": "Always", "requests": {"memory": "50Mi"}},
               {"name": "migrate", "requests": {"memory": "200Mi"}}]}),
    250
)]
#[case::an_init_container_before_a_sidecar_runs_alone(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "init_containers": [
               {"name": "migrate", "requests": {"memory": "200Mi"}},
               {"name": "proxy", "restart_policy": "Always", "requests": {"memory": "50Mi"}}]}),
    200
)]
#[case::other_restart_policies_are_plain_init_containers(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "init_containers": [
               {"name": "once", "restart_policy": "Never", "requests": {"memory": "50Mi"}}]}),
    100
)]
#[case::overhead_is_added(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "overhead": {"memory": "20Mi", "cpu": "100m"}}),
    120
)]
#[case::overhead_is_not_added_to_no_request(
    json!({"containers": [{"name": "app"}], "overhead": {"memory": "20Mi"}}),
    0
)]
#[case::pod_level_requests_replace_the_containers(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "resources": {"requests": {"memory": "400Mi"}},
           "overhead": {"memory": "20Mi"}}),
    420
)]
#[case::pod_level_limits_default_requests_to_the_containers(
    json!({"containers": [
               {"name": "a", "requests": {"memory": "100Mi"}},
               {"name": "b", "requests": {"memory": "60Mi"}}],
           "resources": {"limits": {"memory": "1Gi"}}}),
    160
)]
#[case::pod_level_limits_alone_are_the_requests(
    json!({"containers": [{"name": "app"}],
           "resources": {"limits": {"memory": "1Gi", "cpu": "2"}}}),
    1024
)]
#[case::pod_level_resources_for_cpu_hide_the_containers_memory(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "resources": {"requests": {"cpu": "1"}}}),
    0
)]
#[case::pod_level_resources_for_other_resources_are_not_pod_level(
    json!({"containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
           "resources": {"requests": {"ephemeral-storage": "1Gi"}}}),
    100
)]
fn memory_request_as_kubelet_ranks_by_it(#[case] spec: Value, #[case] mebibytes: i64) {
    assert_eq!(memory(spec), mebibytes * MI);
}

#[test]
fn pod_level_resources_hide_every_container_request() {
    // kubelet's PodRequests skips container-level resources altogether, so
    // the containers' ephemeral-storage is not requested either.
    let pod = pod(json!({
        "containers": [{"name": "app", "requests": {"ephemeral-storage": "1Gi"}}],
        "init_containers": [{"name": "init", "requests": {"ephemeral-storage": "2Gi"}}],
        "resources": {"requests": {"memory": "100Mi"}}
    }));
    assert_eq!(pod.request("ephemeral-storage"), 0);
    assert_eq!(request(&pod, "ephemeral-storage"), None);
    let without = PodSnapshot {
        resources: None,
        ..pod
    };
    assert_eq!(without.request("ephemeral-storage"), 2 << 30);
}

#[test]
fn requests_sum_exactly_before_rounding_to_whole_units() {
    let pod = pod(json!({"containers": [
        {"name": "a", "requests": {"memory": "0.4"}},
        {"name": "b", "requests": {"memory": "0.4"}}]}));
    assert_eq!(pod.request("memory"), 1);
    assert_eq!(request(&pod, "memory"), Some("800m".parse().unwrap()));
}

#[rstest]
#[case::nothing(json!({"containers": [{"name": "a"}]}), QosClass::BestEffort)]
#[case::guaranteed_containers(
    json!({"containers": [{"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}}]}),
    QosClass::Guaranteed
)]
#[case::an_init_container_without_resources(
    json!({"containers": [{"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}}],
           "init_containers": [{"name": "init"}]}),
    QosClass::Burstable
)]
#[case::a_guaranteed_init_container(
    json!({"containers": [{"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}}],
           "init_containers": [{"name": "init", "limits": {"cpu": "2", "memory": "64Mi"}}]}),
    QosClass::Guaranteed
)]
#[case::a_burstable_sidecar(
    json!({"containers": [{"name": "a"}],
           "init_containers": [
               {"name": "proxy", "restart_policy": "Always", "requests": {"memory": "64Mi"}}]}),
    QosClass::Burstable
)]
#[case::pod_level_requests_at_their_limits(
    json!({"containers": [{"name": "a"}, {"name": "b", "requests": {"memory": "64Mi"}}],
           "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                         "limits": {"cpu": "1", "memory": "1Gi"}}}),
    QosClass::Guaranteed
)]
#[case::pod_level_limits_default_the_requests(
    json!({"containers": [{"name": "a"}],
           "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}),
    QosClass::Guaranteed
)]
#[case::pod_level_limits_with_smaller_container_requests(
    json!({"containers": [{"name": "a", "requests": {"memory": "64Mi"}}],
           "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}),
    QosClass::Burstable
)]
#[case::pod_level_memory_alone(
    json!({"containers": [{"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}}],
           "resources": {"limits": {"memory": "1Gi"}}}),
    QosClass::Burstable
)]
#[case::empty_pod_level_resources_decide_alone(
    json!({"containers": [{"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}}],
           "resources": {}}),
    QosClass::BestEffort
)]
fn qos_class_counts_init_containers_and_pod_level_resources(
    #[case] spec: Value,
    #[case] qos: QosClass,
) {
    assert_eq!(pod(spec).qos_class(), qos);
}

#[test]
fn the_new_fields_round_trip_and_stay_out_of_json_when_unset() {
    let spec = json!({
        "containers": [{"name": "app", "requests": {"memory": "100Mi"}, "limits": {}}],
        "init_containers": [{"name": "proxy", "requests": {}, "limits": {"memory": "64Mi"},
                             "restart_policy": "Always"}],
        "overhead": {"memory": "20Mi"},
        "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}
    });
    let full = pod(spec.clone());
    let json = serde_json::to_value(&full).unwrap();
    for key in ["init_containers", "overhead", "resources"] {
        assert_eq!(json[key], spec[key], "{key}");
    }
    assert_eq!(serde_json::from_value::<PodSnapshot>(json).unwrap(), full);
    let plain = serde_json::to_value(pod(json!({"containers": [{"name": "app"}]}))).unwrap();
    for key in ["init_containers", "overhead", "resources"] {
        assert!(plain.get(key).is_none(), "{key}: {plain}");
    }
    assert!(plain["containers"][0].get("restart_policy").is_none());
}

/// A container's memory: request and limit, each absent or a quantity in
/// units that sum exactly or round.
fn container_memory() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let quantity = prop_oneof![
        (0u32..4096).prop_map(|mib| format!("{mib}Mi")),
        (0u32..4000).prop_map(|m| format!("{m}M")),
        (1u32..999).prop_map(|m| format!("{m}m")),
    ];
    (
        proptest::option::of(quantity.clone()),
        proptest::option::of(quantity),
    )
        .prop_map(|(request, limit)| {
            let mut container = json!({"name": "c", "requests": {}, "limits": {}});
            if let Some(request) = request {
                container["requests"]["memory"] = json!(request);
            }
            if let Some(limit) = limit {
                container["limits"]["memory"] = json!(limit);
            }
            container
        })
}

proptest::proptest! {
    /// The shortcut for pods of regular containers only is the defaulted
    /// arithmetic, exactly (value and format).
    #[test]
    fn regular_containers_take_the_shortcut_to_the_same_request(
        containers in proptest::collection::vec(container_memory(), 0..6),
    ) {
        let pod = pod(json!({"containers": containers}));
        proptest::prop_assert_eq!(
            regular_containers_request(&pod, MEMORY),
            defaulted_request(&pod, MEMORY)
        );
    }
}
