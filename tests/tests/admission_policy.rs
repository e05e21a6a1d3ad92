//! deploy/admission.yaml, evaluated offline: the policies' own CEL
//! expressions (read from the file, not restated here) run in a CEL
//! interpreter against admission requests shaped as the API server builds
//! them (AdmissionRequest attributes, the Pod, the Event, the Eviction), the
//! way a ValidatingAdmissionPolicy is applied: match constraints, match
//! conditions, then for each param its binding selects (or once, for a
//! policy without params) variables in order and every validation. For
//! each verb evictd uses there is a request the policies allow and one they
//! deny.
//!
//! What the interpreter does not model, and why it does not matter here:
//! Kubernetes declares `request` as a typed object, so an unset string field
//! reads as "" and an unset map as {}; the requests below set every field
//! the expressions read, as the API server's typed object would.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::sync::Arc;

use cel::{Context, Env, Program, Value as CelValue};
use serde::Deserialize as _;
use serde_json::{Value, json};

const POLICY_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/admission.yaml");
const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";
const EVICTD: &str = "system:serviceaccount:evictd-system:evictd";

/// What the policies decided about one request.
#[derive(Debug, PartialEq)]
enum Decision {
    /// No policy matched the request.
    NotMatched,
    Allowed,
    /// Denied, with every failed validation's message.
    Denied(Vec<String>),
}

impl Decision {
    fn denied_with(&self, text: &str) -> bool {
        matches!(self, Decision::Denied(messages) if messages.iter().any(|m| m.contains(text)))
    }
}

/// The objects of deploy/admission.yaml, and the pods the cluster stores
/// (what a binding with a Pod `paramKind` selects from).
struct Policies {
    objects: Vec<Value>,
    pods: Vec<Value>,
}

impl Policies {
    fn load() -> Self {
        let text = std::fs::read_to_string(POLICY_FILE).unwrap();
        let objects = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|document| Value::deserialize(document).unwrap())
            .filter(|object| !object.is_null())
            .collect();
        Self {
            objects,
            pods: Vec::new(),
        }
    }

    /// The same policies in a cluster that stores `pods`.
    fn with_pods(self, pods: Vec<Value>) -> Self {
        Self { pods, ..self }
    }

    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }

    /// Every policy that has a Deny binding, applied to `attributes` as the
    /// API server applies it; the request is denied when any denies it.
    fn decide(&self, attributes: &Value) -> Decision {
        let mut matched = false;
        let mut messages = Vec::new();
        for policy in self.of_kind("ValidatingAdmissionPolicy") {
            let name = &policy["metadata"]["name"];
            let binding = self
                .of_kind("ValidatingAdmissionPolicyBinding")
                .find(|binding| {
                    binding["spec"]["policyName"] == *name
                        && binding["spec"]["validationActions"] == json!(["Deny"])
                });
            let Some(binding) = binding else {
                panic!("policy {name} has no Deny binding");
            };
            let spec = &policy["spec"];
            if !matches(spec, attributes) {
                continue;
            }
            matched = true;
            let params = if spec["paramKind"].is_null() {
                vec![Value::Null]
            } else {
                self.params(spec, &binding["spec"]["paramRef"], attributes)
            };
            if params.is_empty() {
                match binding["spec"]["paramRef"]["parameterNotFoundAction"].as_str() {
                    Some("Allow") => continue,
                    _ => messages.push(format!("{name}: no params found")),
                }
            }
            for param in &params {
                messages.extend(validate(spec, attributes, param));
            }
        }
        match (matched, messages.is_empty()) {
            (false, _) => Decision::NotMatched,
            (true, true) => Decision::Allowed,
            (true, false) => Decision::Denied(messages),
        }
    }
}

impl Policies {
    /// The pods a binding's `paramRef` selects for a request: those of the
    /// request's namespace (`namespace` unset) or of its `namespace`, with
    /// every label of its selector's `matchLabels`.
    fn params(&self, spec: &Value, param_ref: &Value, attributes: &Value) -> Vec<Value> {
        assert_eq!(
            spec["paramKind"],
            json!({"apiVersion": "v1", "kind": "Pod"})
        );
        let selector = &param_ref["selector"];
        assert!(
            selector["matchExpressions"].is_null(),
            "only matchLabels is modelled"
        );
        let namespace = param_ref["namespace"]
            .as_str()
            .unwrap_or_else(|| attributes["request"]["namespace"].as_str().unwrap());
        self.pods
            .iter()
            .filter(|pod| pod["metadata"]["namespace"] == namespace)
            .filter(|pod| {
                selector["matchLabels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .all(|(key, value)| pod["metadata"]["labels"][key] == *value)
            })
            .cloned()
            .collect()
    }
}

fn run(env: &Env, expression: &str, context: &Context) -> Result<CelValue, String> {
    let program: Program = env
        .compile(expression)
        .map_err(|e| format!("{expression}: {e}"))?;
    program
        .execute(context)
        .map_err(|e| format!("{expression}: {e}"))
}

/// The request, its object and old object, and `params`, as variables.
fn request_context(
    env: &Arc<Env>,
    attributes: &Value,
    params: &Value,
) -> Context<'static, 'static> {
    let mut context = Context::with_env(env.clone());
    for name in ["request", "object", "oldObject"] {
        context.add_variable(name, &attributes[name]).unwrap();
    }
    context.add_variable("params", params).unwrap();
    context
}

/// Whether a policy applies to the request: its match constraints and
/// every match condition.
fn matches(spec: &Value, attributes: &Value) -> bool {
    assert_eq!(spec["failurePolicy"], "Fail");
    if !matches_rules(
        &spec["matchConstraints"]["resourceRules"],
        &attributes["request"],
    ) {
        return false;
    }
    let env = Arc::new(Env::stdlib());
    let context = request_context(&env, attributes, &Value::Null);
    spec["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|condition| {
            let expression = condition["expression"].as_str().unwrap();
            run(&env, expression, &context) == Ok(CelValue::Bool(true))
        })
}

/// One evaluation of a policy that matches, with `params` (null for a
/// policy without): the messages of the validations that failed (an
/// expression that errors fails, as `failurePolicy: Fail` has it).
fn validate(spec: &Value, attributes: &Value, params: &Value) -> Vec<String> {
    let env = Arc::new(Env::stdlib());
    let mut context = request_context(&env, attributes, params);
    let run = |expression: &str, context: &Context| run(&env, expression, context);
    // Variables are evaluated in order; each may use the ones before it.
    let mut variables = serde_json::Map::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let name = variable["name"].as_str().unwrap();
        let expression = variable["expression"].as_str().unwrap();
        let mut scope = request_context(&env, attributes, params);
        scope
            .add_variable("variables", Value::Object(variables.clone()))
            .unwrap();
        let value = run(expression, &scope).unwrap_or_else(|e| panic!("variable {name}: {e}"));
        variables.insert(name.to_owned(), cel_to_json(&value));
    }
    context
        .add_variable("variables", Value::Object(variables))
        .unwrap();
    let mut failed = Vec::new();
    for validation in spec["validations"].as_array().unwrap() {
        let expression = validation["expression"].as_str().unwrap();
        match run(expression, &context) {
            Ok(CelValue::Bool(true)) => continue,
            Ok(CelValue::Bool(false)) => {}
            Ok(other) => panic!("{expression} gave {other:?}, not a bool"),
            Err(error) => {
                failed.push(format!("expression failed: {error}"));
                continue;
            }
        }
        let message = match validation["messageExpression"].as_str() {
            Some(message) => match run(message, &context) {
                Ok(CelValue::String(text)) => text.to_string(),
                other => panic!("messageExpression {message} gave {other:?}"),
            },
            None => validation["message"].as_str().unwrap().to_owned(),
        };
        failed.push(message);
    }
    failed
}

/// The variables the policies define are strings and bools.
fn cel_to_json(value: &CelValue) -> Value {
    match value {
        CelValue::Bool(b) => json!(b),
        CelValue::String(s) => json!(s.as_str()),
        other => panic!("unexpected variable value {other:?}"),
    }
}

/// `matchConstraints.resourceRules`: group, version, resource (with its
/// subresource as `pods/status`) and operation.
fn matches_rules(rules: &Value, request: &Value) -> bool {
    let resource = match request["subResource"].as_str().unwrap() {
        "" => request["resource"]["resource"].as_str().unwrap().to_owned(),
        sub => format!(
            "{}/{sub}",
            request["resource"]["resource"].as_str().unwrap()
        ),
    };
    let listed = |list: &Value, value: &Value| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|item| item == "*" || item == value)
    };
    rules.as_array().unwrap().iter().any(|rule| {
        listed(&rule["apiGroups"], &request["resource"]["group"])
            && listed(&rule["apiVersions"], &request["resource"]["version"])
            && listed(&rule["resources"], &json!(resource))
            && listed(&rule["operations"], &request["operation"])
    })
}

/// An admission request as the API server builds it for a service account
/// whose bound token names `node` (None: no node claim), with the object
/// before and after.
struct Request {
    operation: &'static str,
    group: &'static str,
    resource: &'static str,
    sub_resource: &'static str,
    kind: (&'static str, &'static str),
    namespace: String,
    name: String,
    object: Value,
    old_object: Value,
}

impl Request {
    fn by(&self, username: &str, node: Option<&str>) -> Value {
        let mut extra = json!({
            "authentication.kubernetes.io/pod-name": ["evictd-x7k2p"],
            "authentication.kubernetes.io/pod-uid": ["9d0c2f3e-1111-4a4a-8b8b-000000000001"],
            "authentication.kubernetes.io/credential-id": ["JTI=2f1e0d9c-aaaa-4bbb-8ccc-000000000002"],
        });
        if let Some(node) = node {
            extra[NODE_NAME_KEY] = json!([node]);
            extra["authentication.kubernetes.io/node-uid"] =
                json!(["5b6c7d8e-2222-4c4c-9d9d-000000000003"]);
        }
        let options_kind = match self.operation {
            "CREATE" => "CreateOptions",
            "UPDATE" => "UpdateOptions",
            _ => "DeleteOptions",
        };
        let request = json!({
            "uid": "0f1e2d3c-4b5a-4968-8778-695a4b3c2d1e",
            "kind": {"group": self.kind.0, "version": "v1", "kind": self.kind.1},
            "resource": {"group": self.group, "version": "v1", "resource": self.resource},
            "subResource": self.sub_resource,
            "requestKind": {"group": self.kind.0, "version": "v1", "kind": self.kind.1},
            "requestResource": {"group": self.group, "version": "v1", "resource": self.resource},
            "requestSubResource": self.sub_resource,
            "name": self.name,
            "namespace": self.namespace,
            "operation": self.operation,
            "userInfo": {
                "username": username,
                "uid": "3c2b1a09-3333-4d4d-8e8e-000000000004",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:evictd-system",
                           "system:authenticated"],
                "extra": extra,
            },
            "dryRun": false,
            "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
        });
        json!({"request": request, "object": self.object, "oldObject": self.old_object})
    }

    fn by_evictd_on(&self, node: &str) -> Value {
        self.by(EVICTD, Some(node))
    }
}

/// A running pod bound to `node`, as the API server stores it.
fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                     "resourceVersion": "4711"},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "shop/app:1"}]},
        "status": {"phase": "Running", "podIP": "10.0.3.7",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// The pod after evictd's strategic-merge status patch.
fn evicted(pod: &Value) -> Value {
    let mut pod = pod.clone();
    pod["status"]["phase"] = json!("Failed");
    pod["status"]["reason"] = json!("Evicted");
    pod["status"]["message"] = json!("The node was low on resource: memory. ");
    pod
}

fn status_patch(before: Value, after: Value) -> Request {
    Request {
        operation: "UPDATE",
        group: "",
        resource: "pods",
        sub_resource: "status",
        kind: ("", "Pod"),
        namespace: "shop".into(),
        name: before["metadata"]["name"].as_str().unwrap().into(),
        object: after,
        old_object: before,
    }
}

fn delete(pod: Value) -> Request {
    Request {
        operation: "DELETE",
        group: "",
        resource: "pods",
        sub_resource: "",
        kind: ("", "Pod"),
        namespace: "shop".into(),
        name: pod["metadata"]["name"].as_str().unwrap().into(),
        // A delete has no new object.
        object: Value::Null,
        old_object: pod,
    }
}

fn eviction(name: &str) -> Request {
    Request {
        operation: "CREATE",
        group: "",
        resource: "pods",
        sub_resource: "eviction",
        kind: ("policy", "Eviction"),
        namespace: "shop".into(),
        name: name.into(),
        object: json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "shop"},
            "deleteOptions": {"gracePeriodSeconds": 0,
                              "preconditions": {"uid": format!("uid-{name}")}},
        }),
        old_object: Value::Null,
    }
}

/// An event as evictd's recorder writes it (report.rs): `reporter` is the
/// node in source.host and reportingInstance.
fn event(namespace: &str, involved: Value, reason: &str, reporter: &str) -> Request {
    let name = format!(
        "{}.18a2b3c4d5e6f708",
        involved["name"].as_str().unwrap_or_default()
    );
    Request {
        operation: "CREATE",
        group: "",
        resource: "events",
        sub_resource: "",
        kind: ("", "Event"),
        namespace: namespace.into(),
        name: String::new(),
        object: json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": "Attempting to reclaim memory",
            "type": "Warning",
            "source": {"component": "evictd", "host": reporter},
            "reportingComponent": "evictd",
            "reportingInstance": reporter,
            "firstTimestamp": "2026-11-23T14:00:00Z",
            "lastTimestamp": "2026-11-23T14:00:00Z",
            "count": 1,
        }),
        old_object: Value::Null,
    }
}

fn node_ref(node: &str) -> Value {
    json!({"kind": "Node", "name": node, "uid": node})
}

fn pod_ref(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": name,
           "uid": format!("uid-{name}")})
}

#[test]
fn a_status_patch_is_allowed_only_for_a_pod_on_the_tokens_node() {
    let policies = Policies::load();
    let own = pod("web", "node-a");
    let allowed = policies.decide(&status_patch(own.clone(), evicted(&own)).by_evictd_on("node-a"));
    assert_eq!(allowed, Decision::Allowed);

    let other = pod("db", "node-b");
    let denied =
        policies.decide(&status_patch(other.clone(), evicted(&other)).by_evictd_on("node-a"));
    assert!(
        denied.denied_with("evictd on node node-a may write only pods bound to it, not shop/db"),
        "{denied:?}"
    );
}

#[test]
fn a_status_patch_may_only_mark_the_pod_failed_and_evicted() {
    let policies = Policies::load();
    let own = pod("web", "node-a");
    let mut ready = own.clone();
    ready["status"]["podIP"] = json!("10.9.9.9");
    let denied = policies.decide(&status_patch(own, ready).by_evictd_on("node-a"));
    assert!(
        denied.denied_with("may only set a pod's status to phase Failed, reason Evicted"),
        "{denied:?}"
    );
}

/// Every field of PodStatus in Kubernetes 1.35's API, with a value each,
/// as a running pod's status could hold them.
fn full_status() -> Value {
    json!({
        "allocatedResources": {"cpu": "500m"},
        "conditions": [{"type": "Ready", "status": "True"},
                       {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0,
                               "image": "shop/app:1", "imageID": "", "started": true}],
        "ephemeralContainerStatuses": [],
        "extendedResourceClaimStatus": {"resourceClaimName": "web-extended",
                                        "requestMappings": []},
        "hostIP": "192.168.1.10",
        "hostIPs": [{"ip": "192.168.1.10"}],
        "initContainerStatuses": [],
        "message": "",
        "nominatedNodeName": "",
        "observedGeneration": 1,
        "phase": "Running",
        "podIP": "10.0.3.7",
        "podIPs": [{"ip": "10.0.3.7"}],
        "qosClass": "Burstable",
        "reason": "",
        "resize": "",
        "resourceClaimStatuses": [],
        "resources": {"requests": {"memory": "64Mi"}},
        "startTime": "2026-11-23T13:00:00Z",
    })
}

/// `pod` with KEP-5986's condition, as evictd's strategic-merge patch
/// leaves it.
fn with_pressure_condition(pod: &Value, status: &str) -> Value {
    let mut pod = pod.clone();
    let conditions = pod["status"]["conditions"].as_array_mut().unwrap();
    conditions.retain(|c| c["type"] != "ContainerMemoryPressure");
    conditions.push(json!({"type": "ContainerMemoryPressure", "status": status,
                           "reason": "MemoryHighRelaxed",
                           "lastTransitionTime": "2026-11-23T14:00:00Z"}));
    pod
}

#[test]
fn a_status_patch_may_change_the_container_memory_pressure_condition_alone() {
    let policies = Policies::load();
    let mut own = pod("web", "node-a");
    own["status"] = full_status();
    let set = with_pressure_condition(&own, "True");
    assert_eq!(
        policies.decide(&status_patch(own.clone(), set.clone()).by_evictd_on("node-a")),
        Decision::Allowed
    );
    let cleared = with_pressure_condition(&set, "False");
    assert_eq!(
        policies.decide(&status_patch(set.clone(), cleared).by_evictd_on("node-a")),
        Decision::Allowed
    );
    // Not on another node's pod.
    let mut other = pod("db", "node-b");
    other["status"] = full_status();
    let denied = policies.decide(
        &status_patch(other.clone(), with_pressure_condition(&other, "True"))
            .by_evictd_on("node-a"),
    );
    assert!(denied.denied_with("not shop/db"), "{denied:?}");
    // Another condition changed with it (the pod marked not Ready).
    let mut unready = with_pressure_condition(&own, "True");
    unready["status"]["conditions"][0]["status"] = json!("False");
    let denied = policies.decide(&status_patch(own.clone(), unready).by_evictd_on("node-a"));
    assert!(
        denied.denied_with("or change its ContainerMemoryPressure condition alone"),
        "{denied:?}"
    );
    // Any other field of the status changed, added or removed with it.
    for (field, _) in full_status().as_object().unwrap() {
        if field == "conditions" {
            continue;
        }
        let mut changed = with_pressure_condition(&own, "True");
        changed["status"][field] = json!("changed");
        let mut removed = with_pressure_condition(&own, "True");
        removed["status"].as_object_mut().unwrap().remove(field);
        let mut absent_before = own.clone();
        absent_before["status"]
            .as_object_mut()
            .unwrap()
            .remove(field);
        for (before, after) in [
            (&own, changed),
            (&own, removed),
            (&absent_before, set.clone()),
        ] {
            let decision =
                policies.decide(&status_patch(before.clone(), after).by_evictd_on("node-a"));
            assert!(
                decision.denied_with("or change its ContainerMemoryPressure condition alone"),
                "{field}: {decision:?}"
            );
        }
    }
}

#[test]
fn a_delete_is_allowed_only_for_a_pod_on_the_tokens_node() {
    let policies = Policies::load();
    assert_eq!(
        policies.decide(&delete(pod("web", "node-a")).by_evictd_on("node-a")),
        Decision::Allowed
    );
    let denied = policies.decide(&delete(pod("db", "node-b")).by_evictd_on("node-a"));
    assert!(denied.denied_with("not shop/db"), "{denied:?}");
    // A pod not yet scheduled has no node: not evictd's either.
    let mut pending = pod("queued", "");
    pending["spec"].as_object_mut().unwrap().remove("nodeName");
    let denied = policies.decide(&delete(pending).by_evictd_on("node-a"));
    assert!(denied.denied_with("not shop/queued"), "{denied:?}");
}

#[test]
fn an_eviction_is_refused_because_it_names_no_node() {
    let policies = Policies::load();
    // Even for a pod on evictd's own node: the request cannot show that.
    let denied = policies.decide(&eviction("web").by_evictd_on("node-a"));
    assert!(
        denied.denied_with("evictd may not use the Eviction API"),
        "{denied:?}"
    );
    // Anyone else's evictions (kubectl drain, the descheduler) are not
    // evictd's policies' business.
    let drain = eviction("web").by("system:serviceaccount:kube-system:descheduler", None);
    assert_eq!(policies.decide(&drain), Decision::NotMatched);
}

#[test]
fn events_are_allowed_about_the_tokens_node_and_reported_by_it() {
    let policies = Policies::load().with_pods(vec![pod("web", "node-a"), pod("db", "node-a")]);
    let node_event = event(
        "default",
        node_ref("node-a"),
        "EvictionThresholdMet",
        "node-a",
    );
    assert_eq!(
        policies.decide(&node_event.by_evictd_on("node-a")),
        Decision::Allowed
    );
    let pod_event = event("shop", pod_ref("web"), "Evicted", "node-a");
    assert_eq!(
        policies.decide(&pod_event.by_evictd_on("node-a")),
        Decision::Allowed
    );
    // KEP-5986's stage 1.
    let relaxed = event("shop", pod_ref("web"), "MemoryHighRelaxed", "node-a");
    assert_eq!(
        policies.decide(&relaxed.by_evictd_on("node-a")),
        Decision::Allowed
    );

    let other_node = event(
        "default",
        node_ref("node-b"),
        "EvictionThresholdMet",
        "node-a",
    );
    let denied = policies.decide(&other_node.by_evictd_on("node-a"));
    assert!(
        denied.denied_with("may post only EvictionThresholdMet on its node"),
        "{denied:?}"
    );
    // An Evicted event claiming another node as its reporter.
    let forged = event("shop", pod_ref("db"), "Evicted", "node-b");
    let denied = policies.decide(&forged.by_evictd_on("node-a"));
    assert!(denied.denied_with("reported by its node"), "{denied:?}");
    // Any other event, e.g. one that could page someone.
    let other_reason = event("shop", pod_ref("web"), "BackOff", "node-a");
    assert!(matches!(
        policies.decide(&other_reason.by_evictd_on("node-a")),
        Decision::Denied(_)
    ));
}

#[test]
fn an_evicted_event_is_allowed_only_about_a_pod_bound_to_the_tokens_node() {
    let policies = Policies::load().with_pods(vec![pod("web", "node-a"), pod("db", "node-b")]);
    let own = event("shop", pod_ref("web"), "Evicted", "node-a");
    assert_eq!(
        policies.decide(&own.by_evictd_on("node-a")),
        Decision::Allowed
    );
    // A pod on another node: as its status may not be written, no event
    // may say it was evicted.
    let other = event("shop", pod_ref("db"), "Evicted", "node-a");
    let denied = policies.decide(&other.by_evictd_on("node-a"));
    assert!(
        denied.denied_with(
            "evictd on node node-a may post events only about pods bound to it, not shop/db"
        ),
        "{denied:?}"
    );
    // Nor that it was relaxed (KEP-5986's stage 1).
    let relaxed = event("shop", pod_ref("db"), "MemoryHighRelaxed", "node-a");
    let denied = policies.decide(&relaxed.by_evictd_on("node-a"));
    assert!(
        denied.denied_with("may post events only about pods bound to it, not shop/db"),
        "{denied:?}"
    );
    // Posted in another namespace, where the pod cannot be looked up, or
    // naming no uid (it would attach to any pod of that name): refused.
    let elsewhere = event("kube-system", pod_ref("db"), "Evicted", "node-a");
    let no_uid = {
        let mut reference = pod_ref("db");
        reference.as_object_mut().unwrap().remove("uid");
        event("shop", reference, "Evicted", "node-a")
    };
    for request in [elsewhere, no_uid] {
        let denied = policies.decide(&request.by_evictd_on("node-a"));
        assert!(
            denied.denied_with("on pods of the same namespace named by uid"),
            "{denied:?}"
        );
    }
    // A pod deleted meanwhile (--eviction-action=delete) is nobody's to
    // see the event on.
    let gone = event("shop", pod_ref("batch"), "Evicted", "node-a");
    assert_eq!(
        policies.decide(&gone.by_evictd_on("node-a")),
        Decision::Allowed
    );
}

#[test]
fn a_token_without_a_node_claim_is_refused_every_write() {
    let policies = Policies::load();
    let own = pod("web", "node-a");
    for request in [
        status_patch(own.clone(), evicted(&own)),
        delete(own.clone()),
        event(
            "default",
            node_ref("node-a"),
            "EvictionThresholdMet",
            "node-a",
        ),
    ] {
        let decision = policies.decide(&request.by(EVICTD, None));
        assert!(
            decision.denied_with("evictd's service-account token names no node"),
            "{decision:?}"
        );
    }
}

#[test]
fn other_users_are_not_matched() {
    let policies = Policies::load();
    let own = pod("web", "node-a");
    let kubelet = status_patch(own.clone(), own.clone()).by("system:node:node-a", None);
    assert_eq!(policies.decide(&kubelet), Decision::NotMatched);
    let controller = delete(pod("db", "node-b")).by(
        "system:serviceaccount:kube-system:replicaset-controller",
        None,
    );
    assert_eq!(policies.decide(&controller), Decision::NotMatched);
    // evictd deployed to another namespace is still matched.
    let moved = status_patch(own.clone(), evicted(&own))
        .by("system:serviceaccount:kube-system:evictd", Some("node-b"));
    assert!(policies.decide(&moved).denied_with("not shop/web"));
}

#[test]
fn every_write_the_cluster_role_grants_is_matched_by_a_policy() {
    let policies = Policies::load();
    let rbac = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac.yaml"))
        .unwrap();
    let role: Value = serde_yaml_ng::Deserializer::from_str(&rbac)
        .map(|document| Value::deserialize(document).unwrap())
        .find(|object| object["kind"] == "ClusterRole")
        .unwrap();
    let mut writes = 0;
    for rule in role["rules"].as_array().unwrap() {
        for resource in rule["resources"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                let operation = match verb.as_str().unwrap() {
                    "list" | "watch" => continue,
                    "create" => "CREATE",
                    "patch" | "update" => "UPDATE",
                    "delete" => "DELETE",
                    other => panic!("{other}: no admission operation known"),
                };
                let (resource, sub) = resource
                    .as_str()
                    .unwrap()
                    .split_once('/')
                    .unwrap_or((resource.as_str().unwrap(), ""));
                let request = json!({"resource": {"group": "", "version": "v1", "resource": resource},
                                     "subResource": sub, "operation": operation});
                let matched = policies.of_kind("ValidatingAdmissionPolicy").any(|policy| {
                    matches_rules(
                        &policy["spec"]["matchConstraints"]["resourceRules"],
                        &request,
                    )
                });
                assert!(
                    matched,
                    "{operation} {resource}/{sub} is granted but no policy confines it"
                );
                writes += 1;
            }
        }
    }
    assert_eq!(writes, 2, "pods/status patch and events create");
}
