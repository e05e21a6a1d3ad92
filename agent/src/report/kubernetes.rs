//! The Kubernetes API side, on its own thread and runtime so that nothing
//! the API does (a slow list, a large watch event, a server that is down)
//! can delay the engine: the engine reads the in-memory [`PodStore`] and
//! hands finished kills to a queue (`Kubernetes::report`); only a soft
//! eviction with `--eviction-action evict` waits for the API, bounded by
//! `--api-timeout`, and falls back to the local kill when it cannot get an
//! answer.
mod api_writes;
mod journal;
mod message;
mod pod_cache;
mod pods;

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, mpsc as std_mpsc},
    time::Duration,
};

use kube::{Client, Config, config::KubeConfigOptions};
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use api_writes::PodNote;
pub use api_writes::{EvictOutcome, EvictionNotice, PodWarning, PressureCondition};
pub use journal::{CAPACITY as JOURNAL_CAPACITY, Journal};
pub use message::{
    ContainerUsage, EvictionMessage, KILL_REASON_KEY, StarvedSignal, eviction_message,
};
pub use pod_cache::PodCache;
pub use pods::{KnownPod, PodStore, known_pod};

use crate::{
    decide::{reason::KillReason, thresholds::Resource},
    metrics::Metrics,
    state::StateDir,
};

/// What makes a kill final in the API, so that the pod is not restarted in
/// place (`--eviction-action`, which `config::EvictionActionArg` parses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionAction {
    /// Pod status phase Failed, reason Evicted (kubelet's own way).
    Status,
    /// Delete the pod.
    Delete,
    /// Soft evictions through the policy/v1 Eviction API; hard ones as
    /// `Status`.
    Evict,
}

impl EvictionAction {
    /// Every action, in `--eviction-action`'s order.
    pub(crate) const ALL: [Self; 3] = [Self::Status, Self::Delete, Self::Evict];

    /// The action as `--eviction-action` (and the journal) spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Delete => "delete",
            Self::Evict => "evict",
        }
    }

    /// The action `name` spells ([`Self::as_str`]), if any.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.as_str() == name)
    }
}

/// How the API is reached and evictions made final (built from the command
/// line's `config::KubernetesArgs`).
#[derive(Debug, Clone)]
pub(crate) struct KubernetesOptions {
    /// `--kubeconfig`; without it the pod's service account, else
    /// $KUBECONFIG or ~/.kube/config.
    pub kubeconfig: Option<PathBuf>,
    /// `--eviction-action`.
    pub eviction_action: EvictionAction,
    /// `--api-timeout`: the longest wait for one API request.
    pub api_timeout: Duration,
}

/// Eviction reports on their way from the engine to the API thread, which
/// moves them into its journal at once (bounded too: [`JOURNAL_CAPACITY`]).
/// Past either bound, reports are dropped (counted and logged), never the
/// kills.
const REPORT_QUEUE: usize = 256;
/// Pod warnings and conditions waiting for the API thread; one past these
/// is logged and dropped (warnings are best effort, as kubelet's own event
/// recorder is).
const POD_NOTE_QUEUE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("--kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "--node-name is set but no Kubernetes API configuration was found (not in a pod, no $KUBECONFIG or ~/.kube/config): {0}; give --kubeconfig, or run without --node-name"
    )]
    Infer(#[source] kube::config::InferConfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("starting the Kubernetes API thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the Kubernetes API thread ended while starting")]
    ThreadEnded,
}

impl KubeError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_input_error(&self) -> bool {
        matches!(self, Self::Kubeconfig { .. } | Self::Infer(_))
    }
}

/// The running API side: the pod store, the report queue and the
/// eviction-API requests of soft evictions.
pub(crate) struct Kubernetes {
    store: PodStore,
    action: EvictionAction,
    reports: mpsc::Sender<EvictionNotice>,
    evictions: mpsc::Sender<api_writes::EvictRequest>,
    pod_notes: mpsc::Sender<PodNote>,
    api_timeout: Duration,
    metrics: Arc<Metrics>,
    finished: std_mpsc::Receiver<()>,
}

impl Kubernetes {
    /// Loads the client configuration (in-cluster service account, or
    /// --kubeconfig), then starts the pod watch and the reporter on a
    /// thread of their own; the reporter first replays the reports a
    /// previous agent left in `state_dir`'s journal. Never waits for the
    /// API server itself.
    pub(crate) fn start(
        args: &KubernetesOptions,
        node_name: &str,
        state_dir: &Path,
        metrics: Arc<Metrics>,
    ) -> Result<Self, KubeError> {
        let state = match StateDir::open(state_dir) {
            Ok(state) => Some(state),
            Err(e) => {
                warn!(error = %e, "no state directory: eviction reports pending and pod metadata known at a restart will be lost");
                None
            }
        };
        let (reports, report_queue) = mpsc::channel(REPORT_QUEUE);
        let (evictions, eviction_queue) = mpsc::channel(REPORT_QUEUE);
        let (pod_notes, pod_note_queue) = mpsc::channel(POD_NOTE_QUEUE);
        let (started_tx, started_rx) = std_mpsc::channel();
        let (finished_tx, finished) = std_mpsc::channel();
        let store = PodStore::default();
        // Before the first decision: a restart during an API outage keeps
        // the protections the last agent knew.
        let cache = state.clone().map(|state| {
            let mut cache = PodCache::new(state, node_name);
            cache.load_into(&store);
            cache
        });
        metrics.kube_pods.set(store.len() as i64);
        let context = api_writes::Context {
            node_name: node_name.to_owned(),
            action: args.eviction_action,
            api_timeout: args.api_timeout,
            metrics: metrics.clone(),
            errors: ApiErrors::new(metrics.clone()),
        };
        let kubeconfig = args.kubeconfig.clone();
        let api_timeout = args.api_timeout;
        let thread_store = store.clone();
        std::thread::Builder::new()
            .name("evictd-kube".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started_tx.send(Err(KubeError::Thread(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = match client(kubeconfig.as_deref(), api_timeout).await {
                        Ok(client) => client,
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = started_tx.send(Ok(()));
                    tokio::spawn(pods::watch(
                        client.clone(),
                        context.node_name.clone(),
                        thread_store,
                        cache,
                        context.metrics.clone(),
                        context.errors.clone(),
                    ));
                    tokio::spawn(api_writes::serve_evictions(
                        client.clone(),
                        context.clone(),
                        eviction_queue,
                    ));
                    tokio::spawn(api_writes::serve_pod_notes(
                        client.clone(),
                        context.clone(),
                        pod_note_queue,
                    ));
                    let journal = Journal::open(state, &context.node_name);
                    api_writes::serve_reports(client, context, report_queue, journal).await;
                });
                let _ = finished_tx.send(());
            })
            .map_err(KubeError::Thread)?;
        started_rx.recv().map_err(|_| KubeError::ThreadEnded)??;
        Ok(Self {
            store,
            action: args.eviction_action,
            reports,
            evictions,
            pod_notes,
            api_timeout: args.api_timeout,
            metrics,
            finished,
        })
    }

    /// The pod store, the inventory's metadata source.
    pub(crate) fn store(&self) -> &PodStore {
        &self.store
    }

    pub(crate) fn action(&self) -> EvictionAction {
        self.action
    }

    /// Queues the report of a finished eviction; never waits.
    pub(crate) fn report(&self, notice: EvictionNotice) {
        if let Err(e) = self.reports.try_send(notice) {
            let notice = match e {
                mpsc::error::TrySendError::Full(notice)
                | mpsc::error::TrySendError::Closed(notice) => notice,
            };
            self.metrics
                .eviction_reports
                .with_label_values(&[self.action.as_str(), "dropped"])
                .inc();
            warn!(pod = %format!("{}/{}", notice.namespace, notice.name),
                queued = REPORT_QUEUE, "eviction report dropped: the Kubernetes API has not kept up");
        }
    }

    /// Queues a warning event on a pod; never waits. Best effort: one
    /// attempt, no journal (what it says is in the agent's log too).
    pub(crate) fn warn_pod(&self, warning: PodWarning) {
        self.queue_pod_note(PodNote::Warning(warning));
    }

    /// Queues KEP-5986's pod condition; never waits. Retried while the API
    /// cannot take it, not journalled across a restart.
    pub(crate) fn set_pressure_condition(&self, condition: PressureCondition) {
        self.queue_pod_note(PodNote::Condition(condition));
    }

    fn queue_pod_note(&self, note: PodNote) {
        if let Err(e) = self.pod_notes.try_send(note) {
            let (PodNote::Warning(PodWarning {
                namespace, name, ..
            })
            | PodNote::Condition(PressureCondition {
                namespace, name, ..
            })) = e.into_inner();
            warn!(pod = %format!("{namespace}/{name}"), queued = POD_NOTE_QUEUE,
                "pod event or condition dropped: the Kubernetes API has not kept up");
        }
    }

    /// Asks the API server to evict the pod (policy/v1 Eviction, which
    /// honours PodDisruptionBudgets) with `grace` as its grace period (the
    /// soft eviction's, as kubelet gives it), waiting at most --api-timeout.
    pub(crate) async fn evict(&self, notice: EvictionNotice, grace: Duration) -> EvictOutcome {
        let (reply, outcome) = oneshot::channel();
        let request = api_writes::EvictRequest {
            notice,
            grace,
            reply,
        };
        if self.evictions.try_send(request).is_err() {
            return EvictOutcome::Unanswered;
        }
        // The request itself is bounded by --api-timeout; the margin covers
        // the hop between threads.
        match tokio::time::timeout(self.api_timeout * 2, outcome).await {
            Ok(Ok(outcome)) => outcome,
            _ => EvictOutcome::Unanswered,
        }
    }

    /// Stops the watch and the reporter, waiting up to `within` for the
    /// request in flight; reports not yet final stay in the journal for the
    /// next agent.
    pub(crate) fn shutdown(self, within: Duration) {
        let Self {
            reports,
            evictions,
            pod_notes,
            finished,
            ..
        } = self;
        drop((reports, evictions, pod_notes));
        if finished.recv_timeout(within).is_err() {
            warn!(
                ?within,
                "the Kubernetes API thread did not stop in time; pending eviction reports stay in the journal"
            );
        }
    }
}

async fn client(kubeconfig: Option<&Path>, api_timeout: Duration) -> Result<Client, KubeError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                }
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(KubeError::Infer)?,
    };
    config.connect_timeout = Some(api_timeout);
    // evictd retries on its own terms: a 429 on an eviction is a
    // PodDisruptionBudget's answer, not a reason to wait past --api-timeout.
    config.default_retry = false;
    Client::try_from(config).map_err(KubeError::Client)
}

impl EvictionNotice {
    /// What the API is told about the eviction of `pod`: kubelet's message
    /// for `signal`, naming each container's usage of the starved resource
    /// from `usages` (by container name: for memory the working set read
    /// just before the kill, for ephemeral storage what the decision's
    /// disk reading found).
    pub(crate) fn new(
        pod: &KnownPod,
        signal: StarvedSignal,
        usages: &[(String, Option<u64>)],
    ) -> Self {
        let containers: Vec<ContainerUsage> = match signal.resource {
            Resource::Memory | Resource::EphemeralStorage => pod
                .snapshot
                .containers
                .iter()
                .map(|container| ContainerUsage {
                    name: container.name.clone(),
                    usage_bytes: usages
                        .iter()
                        .find(|(name, _)| *name == container.name)
                        .and_then(|(_, bytes)| *bytes),
                    request: container.requests.get(signal.resource.as_str()).copied(),
                })
                .collect(),
            _ => Vec::new(),
        };
        Self {
            namespace: pod.snapshot.namespace.clone(),
            name: pod.snapshot.name.clone(),
            uid: pod.snapshot.uid.clone(),
            message: eviction_message(signal, &containers),
            signal,
            evicted_by_api: false,
            pod_limit: false,
        }
    }

    /// What the API is told about `pod` killed at its own limit of
    /// `resource`, not for a node's threshold: outgrowing a local-storage
    /// limit (kubelet's `message`, no annotations: kubelet adds none to
    /// these), or thrashing at its memory limit. Only the pod's event is
    /// posted, as kubelet's `localStorageEviction` posts.
    pub(crate) fn own_limit(pod: &KnownPod, resource: Resource, message: String) -> Self {
        Self {
            namespace: pod.snapshot.namespace.clone(),
            name: pod.snapshot.name.clone(),
            uid: pod.snapshot.uid.clone(),
            signal: StarvedSignal {
                resource,
                threshold: 0,
                available: 0,
            },
            message: EvictionMessage {
                text: message,
                annotations: BTreeMap::new(),
            },
            evicted_by_api: false,
            pod_limit: true,
        }
    }

    /// The notice with evictd's typed kill reason as an annotation of the
    /// pod's `Evicted` event ([`KILL_REASON_KEY`]): kubelet's message and
    /// annotations stay word for word, and the journal keeps the reason
    /// with them.
    pub(crate) fn with_kill_reason(mut self, reason: KillReason) -> Self {
        self.message
            .annotations
            .insert(KILL_REASON_KEY.to_owned(), reason.as_str().to_owned());
        self
    }
}

/// How one failed request is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failure {
    /// HTTP status; 0 when no answer came.
    pub code: u16,
    pub forbidden: bool,
}

impl Failure {
    /// Worth another try: no answer, throttled, or the server's own fault.
    /// A 403 is not: RBAC does not change by retrying.
    pub(crate) fn retryable(self) -> bool {
        self.code == 0 || self.code == 429 || self.code >= 500
    }

    /// The pod is gone or replaced (404, or 409 on the uid precondition):
    /// there is nothing left to report on.
    pub(crate) fn pod_gone(self) -> bool {
        self.code == 404 || self.code == 409
    }
}

/// Counts failed API requests and logs a refused permission once per verb
/// and resource, so a missing RBAC rule is one clear line, not a stream.
#[derive(Clone)]
pub(crate) struct ApiErrors {
    metrics: Arc<Metrics>,
    forbidden_logged: Arc<Mutex<HashSet<(&'static str, &'static str)>>>,
}

impl ApiErrors {
    fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            forbidden_logged: Arc::default(),
        }
    }

    pub(crate) fn failed(
        &self,
        verb: &'static str,
        resource: &'static str,
        error: &kube::Error,
    ) -> Failure {
        match error {
            kube::Error::Api(status) => self.status(verb, resource, status.code, &status.reason),
            _ => self.status(verb, resource, 0, "Unreachable"),
        }
    }

    pub(crate) fn status(
        &self,
        verb: &'static str,
        resource: &'static str,
        code: u16,
        reason: &str,
    ) -> Failure {
        self.count(verb, resource, code, reason);
        let forbidden = code == 403;
        if forbidden {
            let first = self
                .forbidden_logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((verb, resource));
            if first {
                error!(
                    verb,
                    resource,
                    "the Kubernetes API forbids evictd's service account to {verb} {resource}: grant it in the ClusterRole (deploy/rbac.yaml); such requests are not retried"
                );
            }
        }
        Failure { code, forbidden }
    }

    /// Counts a failed request in `evictd_kube_api_errors_total`, logging
    /// nothing: for a caller that says what the failure means itself.
    pub(crate) fn count(
        &self,
        verb: &'static str,
        resource: &'static str,
        code: u16,
        reason: &str,
    ) {
        let reason = match (reason, code) {
            ("", 0) => "Unreachable",
            ("", _) => "Unknown",
            (reason, _) => reason,
        };
        self.metrics
            .kube_api_errors
            .with_label_values(&[verb, resource, reason])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unanswered_throttled_and_server_failures_are_retried() {
        let failure = |code| Failure {
            code,
            forbidden: code == 403,
        };
        for code in [0, 429, 500, 503] {
            assert!(failure(code).retryable(), "{code}");
        }
        for code in [400, 403, 404, 409, 422] {
            assert!(!failure(code).retryable(), "{code}");
        }
        assert!(failure(404).pod_gone() && failure(409).pod_gone());
        assert!(!failure(403).pod_gone());
    }
}
