//! Makes an eviction final and visible, as kubelet's eviction manager does:
//! by --eviction-action, the pod's status set to Failed/Evicted with a
//! `DisruptionTarget` condition, or the pod deleted; then an
//! `EvictionThresholdMet` event on the node and an `Evicted` event on the
//! pod. Runs on the API thread, after the kill, one request at a time (an
//! API outage costs one retrying request, not a storm). The step that stops
//! the pod being restarted in place goes first and is retried, with
//! backoff, until the API takes it or the pod is gone; a report whose step
//! fails goes behind the others, so one the API keeps refusing (a webhook
//! failing for that pod) holds up no other. Every report is in the on-disk
//! journal until its last step is done, so neither an outage nor an agent
//! restart loses one.
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

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

use super::EvictionAction;
use super::{
    ApiErrors, EvictionMessage, Failure, StarvedSignal,
    journal::{Journal, Pending, Stage},
};
use crate::metrics::Metrics;

/// While the API does not answer, or answers 5xx/429, the reporter waits
/// after each failed step, doubling from [`FIRST_RETRY`] to
/// [`LONGEST_RETRY`] while steps keep failing, for as long as it takes: an
/// API server that is down sees one request per node every 16 s at most,
/// and a report is final within 16 s of its return. The failed report
/// waits behind the others, which a step that succeeds lets go at once.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LONGEST_RETRY: Duration = Duration::from_secs(16);

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
    /// The pod outgrew its own local-storage limit: no threshold was met
    /// (`signal` holds zeros), so there is no node event, as from kubelet.
    pub pod_limit: bool,
}

/// A warning event on a pod that is not an eviction (KEP-5986's stage 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodWarning {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The event's reason, CamelCase as Kubernetes writes them.
    pub reason: &'static str,
    pub message: String,
}

/// KEP-5986's pod condition, `ContainerMemoryPressure`: `True` (reason
/// `MemoryHighRelaxed`) when stage 1 relaxes a container of the pod,
/// `False` (reason `MemoryPressureSubsided`) when the pod's pressure ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PressureCondition {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub under_pressure: bool,
    pub message: String,
}

/// The condition's type, as the KEP names it.
const CONTAINER_MEMORY_PRESSURE: &str = "ContainerMemoryPressure";

impl PressureCondition {
    fn reason(&self) -> &'static str {
        if self.under_pressure {
            "MemoryHighRelaxed"
        } else {
            "MemoryPressureSubsided"
        }
    }
}

/// What the API thread writes about a pod outside any eviction report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PodNote {
    Warning(PodWarning),
    Condition(PressureCondition),
}

/// The answer to a policy/v1 Eviction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// Accepted: the API server deletes the pod with its grace period.
    Evicted,
    /// Refused (a PodDisruptionBudget: 429, or the pod is gone), with the
    /// server's reason.
    Refused(String),
    /// Forbidden (403): evictd may not use the Eviction API at all, which
    /// is a configuration error, not the pod's answer (the shipped
    /// admission policy refuses every Eviction evictd sends), with the
    /// server's reason.
    Forbidden(String),
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

/// Takes reports off `queue` into the journal and works through the
/// journal, oldest first, until the queue closes (shutdown: what is left
/// stays in the journal for the next agent).
pub(super) async fn serve_reports(
    client: Client,
    context: Context,
    mut queue: mpsc::Receiver<EvictionNotice>,
    mut journal: Journal,
) {
    let mut wait = FIRST_RETRY;
    // The reports whose step is failing, so each one's trouble is logged
    // once.
    let mut failing: BTreeSet<u64> = BTreeSet::new();
    loop {
        while let Ok(notice) = queue.try_recv() {
            accept(&mut journal, &context, notice);
        }
        context
            .metrics
            .eviction_reports_pending
            .set(journal.len() as i64);
        let Some(report) = journal.first().cloned() else {
            match queue.recv().await {
                Some(notice) => {
                    accept(&mut journal, &context, notice);
                    continue;
                }
                None => return,
            }
        };
        let result = step(&client, &context, &report).await;
        match result {
            Err(failure) if failure.retryable() => {
                if failing.insert(report.id) {
                    warn!(pod = %pod_key(&report.notice), step = ?report.stage, code = failure.code,
                        "eviction report waits for the Kubernetes API; retrying with backoff");
                }
                journal.defer(report.id);
                let sleep = tokio::time::sleep(wait);
                tokio::pin!(sleep);
                // New reports join the journal meanwhile; a shutdown ends
                // the wait.
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        notice = queue.recv() => match notice {
                            Some(notice) => accept(&mut journal, &context, notice),
                            None => {
                                info!(pending = journal.len(), "eviction reports still pending at shutdown stay in the journal");
                                return;
                            }
                        },
                    }
                }
                wait = (wait * 2).min(LONGEST_RETRY);
                continue;
            }
            _ => {
                wait = FIRST_RETRY;
                failing.remove(&report.id);
            }
        }
        let next = match report.stage {
            Stage::MakeFinal => {
                concluded(&context, &report, result);
                if report.notice.pod_limit {
                    Some(Stage::PodEvent)
                } else {
                    Some(Stage::NodeEvent)
                }
            }
            Stage::NodeEvent => Some(Stage::PodEvent),
            Stage::PodEvent => {
                // Made final by the Eviction API: these events were all
                // that was left to report.
                if report.notice.evicted_by_api {
                    concluded(&context, &report, Ok(()));
                }
                None
            }
        };
        journal.advance(report.id, next);
    }
}

fn pod_key(notice: &EvictionNotice) -> String {
    format!("{}/{}", notice.namespace, notice.name)
}

/// Journals a new report (the time of the kill is now, give or take the hop
/// between threads); counts it dropped when the journal is full.
fn accept(journal: &mut Journal, context: &Context, notice: EvictionNotice) {
    let pod = pod_key(&notice);
    if journal
        .add(notice, context.action, Timestamp::now())
        .is_err()
    {
        context
            .metrics
            .eviction_reports
            .with_label_values(&[context.action.as_str(), "dropped"])
            .inc();
        warn!(%pod, pending = journal.len(),
            "eviction report dropped: the journal is full, the Kubernetes API has not kept up");
    }
}

/// Logs and counts how the step that makes the eviction final ended.
fn concluded(context: &Context, report: &Pending, result: Result<(), Failure>) {
    let label = match &result {
        Ok(()) => "reported",
        Err(failure) if failure.pod_gone() => "pod-gone",
        Err(_) => "failed",
    };
    context
        .metrics
        .eviction_reports
        .with_label_values(&[report.action.as_str(), label])
        .inc();
    let pod = pod_key(&report.notice);
    match result {
        Ok(()) => {
            info!(%pod, action = report.action.as_str(), "eviction reported to the Kubernetes API");
        }
        Err(failure) if failure.pod_gone() => {
            info!(%pod, code = failure.code, "pod already gone from the API; nothing more to make final");
        }
        Err(failure) => {
            warn!(%pod, code = failure.code, "eviction not reported to the Kubernetes API");
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

/// Posts each pod warning once, bounded by --api-timeout; one the API
/// refuses or does not answer is logged (API errors are counted as every
/// request's are) and not retried. Writes each pod condition, the latest
/// per pod; one the API cannot take now (no answer, 5xx, 429) is tried
/// again with the reports' backoff, so that a pressure's end is not lost
/// to an outage; one it refuses (the pod gone, 403) is logged and dropped.
pub(super) async fn serve_pod_notes(
    client: Client,
    context: Context,
    mut queue: mpsc::Receiver<PodNote>,
) {
    // At most one a pod: the latest condition wins.
    let mut unwritten: BTreeMap<String, PressureCondition> = BTreeMap::new();
    let mut wait = FIRST_RETRY;
    loop {
        let note = if unwritten.is_empty() {
            queue.recv().await
        } else {
            tokio::select! {
                () = tokio::time::sleep(wait) => {
                    let retried = std::mem::take(&mut unwritten);
                    for condition in retried.into_values() {
                        write_condition(&client, &context, condition, &mut unwritten).await;
                    }
                    wait = if unwritten.is_empty() { FIRST_RETRY } else { (wait * 2).min(LONGEST_RETRY) };
                    continue;
                }
                note = queue.recv() => note,
            }
        };
        match note {
            None => {
                if !unwritten.is_empty() {
                    info!(
                        pods = unwritten.len(),
                        "pod conditions still unwritten at shutdown are dropped"
                    );
                }
                return;
            }
            Some(PodNote::Warning(warning)) => post_warning(&client, &context, &warning).await,
            Some(PodNote::Condition(condition)) => {
                unwritten.remove(&condition.uid);
                write_condition(&client, &context, condition, &mut unwritten).await;
            }
        }
    }
}

async fn post_warning(client: &Client, context: &Context, warning: &PodWarning) {
    let pod_event = event(
        context,
        &warning.namespace,
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(warning.namespace.clone()),
            name: Some(warning.name.clone()),
            uid: Some(warning.uid.clone()),
            ..ObjectReference::default()
        },
        warning.reason,
        warning.message.clone(),
        BTreeMap::new(),
        Timestamp::now(),
    );
    if let Err(failure) = create_event(client, context, &pod_event).await {
        warn!(pod = %format!("{}/{}", warning.namespace, warning.name), reason = warning.reason,
            code = failure.code, "pod event not delivered to the Kubernetes API");
    }
}

/// One try of `condition`'s status patch; kept in `unwritten` for another
/// when the API could not take it now.
async fn write_condition(
    client: &Client,
    context: &Context,
    condition: PressureCondition,
    unwritten: &mut BTreeMap<String, PressureCondition>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &condition.namespace);
    let patch = Patch::Strategic(condition_patch(&condition, Timestamp::now()));
    let params = PatchParams::default();
    let request = pods.patch_status(&condition.name, &params, &patch);
    let pod = format!("{}/{}", condition.namespace, condition.name);
    match attempt(context, "patch", "pods/status", request).await {
        Ok(()) => {
            info!(%pod, condition = CONTAINER_MEMORY_PRESSURE, status = condition.under_pressure,
                reason = condition.reason(), "pod condition written to the Kubernetes API");
        }
        Err(failure) if failure.retryable() => {
            unwritten.insert(condition.uid.clone(), condition);
        }
        Err(failure) => {
            warn!(%pod, condition = CONTAINER_MEMORY_PRESSURE, status = condition.under_pressure,
                code = failure.code, "pod condition refused by the Kubernetes API; not retried");
        }
    }
}

/// The KEP's condition alone: a strategic merge patch merges `conditions`
/// by `type`, so every other condition stays as its owner wrote it (and
/// kubelet's status manager keeps conditions it does not own). The uid
/// makes it apply to this pod only.
fn condition_patch(condition: &PressureCondition, now: Timestamp) -> serde_json::Value {
    json!({
        "metadata": {"uid": condition.uid},
        "status": {
            "conditions": [{
                "type": CONTAINER_MEMORY_PRESSURE,
                "status": if condition.under_pressure { "True" } else { "False" },
                "reason": condition.reason(),
                "message": condition.message,
                "lastTransitionTime": Time(now),
            }],
        },
    })
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
        Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
            // Said by the eviction itself, at every one: the generic line
            // would blame RBAC alone.
            context
                .errors
                .count("create", "pods/eviction", status.code, &status.reason);
            EvictOutcome::Forbidden(format!("{}: {}", status.reason, status.message))
        }
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

/// One try of the report's next step, bounded by --api-timeout.
async fn step(client: &Client, context: &Context, report: &Pending) -> Result<(), Failure> {
    let notice = &report.notice;
    match report.stage {
        Stage::MakeFinal => make_final(client, context, report).await,
        Stage::NodeEvent => {
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
                report.evicted_at,
            );
            create_event(client, context, &node_event).await
        }
        Stage::PodEvent => {
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
                report.evicted_at,
            );
            create_event(client, context, &pod_event).await
        }
    }
}

/// The status patch or the delete, by the action in force at the eviction.
async fn make_final(client: &Client, context: &Context, report: &Pending) -> Result<(), Failure> {
    let notice = &report.notice;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &notice.namespace);
    match report.action {
        // A hard eviction, or a soft one the Eviction API could not take,
        // under --eviction-action evict: the status says what happened.
        EvictionAction::Status | EvictionAction::Evict => {
            let patch = Patch::Strategic(status_patch(notice, report.evicted_at));
            let params = PatchParams::default();
            attempt(
                context,
                "patch",
                "pods/status",
                pods.patch_status(&notice.name, &params, &patch),
            )
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
            attempt(
                context,
                "delete",
                "pods",
                pods.delete(&notice.name, &params),
            )
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

/// Creates `event`. Its name is derived from the eviction's time, so the
/// same event sent again after a restart is the API's 409 AlreadyExists,
/// which counts as sent.
async fn create_event(client: &Client, context: &Context, event: &Event) -> Result<(), Failure> {
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let params = PostParams::default();
    match attempt(context, "create", "events", events.create(&params, event)).await {
        Err(failure) if failure.code == 409 => Ok(()),
        result => result,
    }
}

/// One request, bounded by --api-timeout; failures are counted (and a 403
/// logged once) by [`ApiErrors`].
async fn attempt<T>(
    context: &Context,
    verb: &'static str,
    resource: &'static str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<(), Failure> {
    match tokio::time::timeout(context.api_timeout, request).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(context.errors.failed(verb, resource, &e)),
        Err(_) => Err(context.errors.status(verb, resource, 0, "Timeout")),
    }
}
