//! Makes an eviction final and visible, as kubelet's eviction manager does:
//! an `EvictionThresholdMet` event on the node, an `Evicted` event on the
//! pod, then (by --eviction-action) the pod's status set to Failed/Evicted
//! with a `DisruptionTarget` condition, or the pod deleted. Runs on the
//! API thread, after the kill; one report at a time, so an API outage
//! costs one retrying request, not a storm.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::{
        core::v1::{Event, EventSource, ObjectReference, Pod},
        policy::v1::Eviction,
    },
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::{ApiErrors, EvictionMessage, Failure, StarvedSignal};
use crate::{config::EvictionAction, report::metrics::Metrics};

/// Tries per request when the API does not answer or answers 5xx/429,
/// with the wait doubling from [`FIRST_RETRY`]: about 15 s in all.
const ATTEMPTS: u32 = 5;
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// What kubelet names itself in events' `source.component`; evictd names
/// itself.
const COMPONENT: &str = "evictd";

/// One finished (or API-performed) eviction to report.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionNotice {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub signal: StarvedSignal,
    pub message: EvictionMessage,
    /// The Eviction API already removed the pod: only the events are left.
    pub evicted_by_api: bool,
}

/// The answer to a policy/v1 Eviction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// Accepted: the API server deletes the pod with its grace period.
    Evicted,
    /// Refused (a PodDisruptionBudget: 429, or RBAC, or the pod is gone),
    /// with the server's reason.
    Refused(String),
    /// No answer within --api-timeout: the caller kills locally.
    Unanswered,
}

/// A soft eviction for the Eviction API, and where its answer goes.
pub(super) struct EvictRequest {
    pub notice: EvictionNotice,
    pub grace: Duration,
    pub reply: oneshot::Sender<EvictOutcome>,
}

#[derive(Clone)]
pub(super) struct Context {
    pub node_name: String,
    pub action: EvictionAction,
    pub api_timeout: Duration,
    pub metrics: Arc<Metrics>,
    pub errors: ApiErrors,
}

pub(super) async fn serve_reports(
    client: Client,
    context: Context,
    mut queue: mpsc::Receiver<EvictionNotice>,
) {
    while let Some(notice) = queue.recv().await {
        let result = report(&client, &context, &notice).await;
        let label = match &result {
            Ok(()) => "reported",
            Err(failure) if failure.pod_gone() => "pod-gone",
            Err(_) => "failed",
        };
        context
            .metrics
            .eviction_reports
            .with_label_values(&[context.action.as_str(), label])
            .inc();
        let pod = format!("{}/{}", notice.namespace, notice.name);
        match result {
            Ok(()) => {
                info!(%pod, action = context.action.as_str(), "eviction reported to the Kubernetes API")
            }
            Err(failure) if failure.pod_gone() => {
                info!(%pod, code = failure.code, "pod already gone from the API; nothing more to report");
            }
            Err(failure) => {
                warn!(%pod, code = failure.code, "eviction not reported to the Kubernetes API");
            }
        }
    }
}

pub(super) async fn serve_evictions(
    client: Client,
    context: Context,
    mut queue: mpsc::Receiver<EvictRequest>,
) {
    while let Some(request) = queue.recv().await {
        let client = client.clone();
        let context = context.clone();
        // Concurrent: a soft eviction's wait must not queue behind another.
        tokio::spawn(async move {
            let outcome = evict(&client, &context, &request.notice, request.grace).await;
            let _ = request.reply.send(outcome);
        });
    }
}

async fn evict(
    client: &Client,
    context: &Context,
    notice: &EvictionNotice,
    grace: Duration,
) -> EvictOutcome {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &notice.namespace);
    // Written out rather than with kube's `Api::evict`, whose body names the
    // field `delete_options` where the API expects `deleteOptions` and so
    // loses the uid precondition.
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(notice.name.clone()),
            namespace: Some(notice.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX)),
            preconditions: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Preconditions {
                    uid: Some(notice.uid.clone()),
                    resource_version: None,
                },
            ),
            ..DeleteOptions::default()
        }),
    };
    let params = PostParams::default();
    let request = pods.create_subresource::<_, kube::core::Status>(
        "eviction",
        &notice.name,
        &params,
        &eviction,
    );
    match tokio::time::timeout(context.api_timeout, request).await {
        Ok(Ok(_)) => EvictOutcome::Evicted,
        Ok(Err(kube::Error::Api(status))) if status.code != 0 && status.code < 500 => {
            context
                .errors
                .status("create", "pods/eviction", status.code, &status.reason);
            EvictOutcome::Refused(format!(
                "{} {}: {}",
                status.code, status.reason, status.message
            ))
        }
        Ok(Err(e)) => {
            context.errors.failed("create", "pods/eviction", &e);
            EvictOutcome::Unanswered
        }
        Err(_) => {
            context
                .errors
                .status("create", "pods/eviction", 0, "Timeout");
            EvictOutcome::Unanswered
        }
    }
}

/// kubelet's order: the node event as the threshold is acted on, the pod's
/// event, then the pod itself.
async fn report(
    client: &Client,
    context: &Context,
    notice: &EvictionNotice,
) -> Result<(), Failure> {
    let now = Timestamp::now();
    let resource = notice.signal.resource.as_str();
    let node_event = event(
        context,
        "default",
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(context.node_name.clone()),
            // kubelet's node reference uses the node's name as its uid.
            uid: Some(context.node_name.clone()),
            ..ObjectReference::default()
        },
        "EvictionThresholdMet",
        format!("Attempting to reclaim {resource}"),
        BTreeMap::new(),
        now,
    );
    // The node event is context; losing it must not stop the pod's report.
    let _ = create_event(client, context, &node_event).await;
    let pod_event = event(
        context,
        &notice.namespace,
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(notice.namespace.clone()),
            name: Some(notice.name.clone()),
            uid: Some(notice.uid.clone()),
            ..ObjectReference::default()
        },
        "Evicted",
        notice.message.text.clone(),
        notice.message.annotations.clone(),
        now,
    );
    let _ = create_event(client, context, &pod_event).await;
    if notice.evicted_by_api {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &notice.namespace);
    match context.action {
        // A hard eviction, or a soft one the Eviction API could not take,
        // under --eviction-action evict: the status says what happened.
        EvictionAction::Status | EvictionAction::Evict => {
            let patch = Patch::Strategic(status_patch(notice, now));
            let params = PatchParams::default();
            retry(context, "patch", "pods/status", || {
                pods.patch_status(&notice.name, &params, &patch)
            })
            .await
        }
        EvictionAction::Delete => {
            let params = DeleteParams {
                // The pod's processes are already gone.
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(notice.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            retry(context, "delete", "pods", || {
                pods.delete(&notice.name, &params)
            })
            .await
        }
    }
}

/// What kubelet's status manager writes for an evicted pod: phase Failed,
/// reason Evicted, the message, and a `DisruptionTarget` condition
/// (reason `TerminationByKubelet`). The uid makes the patch apply to this
/// pod only, not to a new one of the same name (409 otherwise).
fn status_patch(notice: &EvictionNotice, now: Timestamp) -> serde_json::Value {
    json!({
        "metadata": {"uid": notice.uid},
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": notice.message.text,
            "conditions": [{
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": notice.message.text,
                "lastTransitionTime": Time(now),
            }],
        },
    })
}

fn event(
    context: &Context,
    namespace: &str,
    involved_object: ObjectReference,
    reason: &str,
    message: String,
    annotations: BTreeMap<String, String>,
    now: Timestamp,
) -> Event {
    let object = involved_object.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            // client-go's recorder names events <object>.<unix nanos, hex>.
            name: Some(format!("{object}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace.to_owned()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        involved_object,
        reason: Some(reason.to_owned()),
        message: Some(message),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(context.node_name.clone()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(context.node_name.clone()),
        ..Event::default()
    }
}

async fn create_event(client: &Client, context: &Context, event: &Event) -> Result<(), Failure> {
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let params = PostParams::default();
    retry(context, "create", "events", || {
        events.create(&params, event)
    })
    .await
}

/// One request, retried with doubling waits while it is worth retrying
/// (no answer, 429, 5xx); each try bounded by --api-timeout.
async fn retry<T, F, Fut>(
    context: &Context,
    verb: &'static str,
    resource: &'static str,
    mut request: F,
) -> Result<(), Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut wait = FIRST_RETRY;
    let mut attempt = 1;
    loop {
        let failure = match tokio::time::timeout(context.api_timeout, request()).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => context.errors.failed(verb, resource, &e),
            Err(_) => context.errors.status(verb, resource, 0, "Timeout"),
        };
        if !failure.retryable() || attempt == ATTEMPTS {
            return Err(failure);
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
        attempt += 1;
    }
}
