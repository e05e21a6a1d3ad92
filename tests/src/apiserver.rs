//! A stand-in for the Kubernetes API server (none can run here): serves
//! real API JSON (PodList, an open watch stream, the pod after a status
//! patch, created Events, Eviction answers and `Status` errors) on
//! loopback, keeps the pods' state as the API server would (a status patch
//! changes the stored pod, a delete removes it, uid preconditions and
//! duplicate event names are 409s), records every request with its answer,
//! and fails on demand: 403 for a route, 429 for evictions (a
//! PodDisruptionBudget), 500 for one path (a webhook that fails for one
//! pod), no answer for a while, or down altogether (connections refused)
//! until it comes back on the same address.
use std::{
    collections::{HashMap, HashSet},
    convert::Infallible,
    io,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    http::{Method, StatusCode, header},
    response::Response,
};
use serde_json::{Value, json};

use crate::{PodSpec, wait_until};

/// One request as the stand-in received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub authorization: String,
    pub body: Value,
    /// The HTTP status answered; 0 while the answer is pending.
    pub status: u16,
}

impl Recorded {
    /// Whether the request changes something (everything but GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

/// How the stand-in misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// (method, path suffix) answered 403 Forbidden, as RBAC answers.
    pub forbidden: Vec<(&'static str, &'static str)>,
    /// Evictions refused with 429, as a PodDisruptionBudget refuses them.
    pub budget_refuses_evictions: bool,
    /// Path suffixes answered 500 Internal Error, whatever the method, as
    /// an admission webhook that fails for one object makes the API answer.
    pub failing: Vec<&'static str>,
    /// With `failing`: only each path's first this many requests fail (0:
    /// every one), as a webhook that recovers.
    pub failing_first: usize,
    /// Every answer waits this long: an overloaded API server.
    pub delay: Duration,
}

struct Shared {
    state: Mutex<Stored>,
    faults: Faults,
    requests: Mutex<Vec<Recorded>>,
    /// Requests answered 500 so far, by failing path suffix.
    failed: Mutex<HashMap<&'static str, usize>>,
}

/// What the stand-in stores, as the API server's storage would.
#[derive(Default)]
struct Stored {
    pods: Vec<Value>,
    /// (namespace, name) of every event created.
    events: HashSet<(String, String)>,
    /// Status patches that moved a pod's phase to Failed.
    failed_transitions: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The serving thread of one "up" period.
struct Serving {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

pub struct ApiServer {
    shared: Arc<Shared>,
    address: SocketAddr,
    kubeconfig: PathBuf,
    serving: Option<Serving>,
}

/// The bearer token the kubeconfig carries.
pub const TOKEN: &str = "stand-in-token";

impl ApiServer {
    /// Serves `pods` (API Pod objects) with `faults`.
    pub fn start(pods: Vec<Value>, faults: Faults) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(Stored {
                pods,
                ..Stored::default()
            }),
            faults,
            requests: Mutex::new(Vec::new()),
            failed: Mutex::new(HashMap::new()),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let serving = serve(listener, shared.clone())?;
        let kubeconfig = write_kubeconfig(&format!("http://{address}"))?;
        Ok(Self {
            shared,
            address,
            kubeconfig,
            serving: Some(serving),
        })
    }

    /// Stops answering: open connections (the pod watch) are cut and new
    /// ones refused, as when the API server's process or its network is
    /// gone. What it stores is kept.
    pub fn go_down(&mut self) {
        if let Some(serving) = self.serving.take() {
            let _ = serving.stop.send(());
            let _ = serving.thread.join();
        }
    }

    /// Serves again on the same address, with the same state.
    pub fn come_back(&mut self) -> io::Result<()> {
        if self.serving.is_none() {
            // The listener closed with the old thread; its address is free
            // again (std sets SO_REUSEADDR, so TIME_WAIT does not hold it).
            let listener = std::net::TcpListener::bind(self.address)?;
            self.serving = Some(serve(listener, self.shared.clone())?);
        }
        Ok(())
    }

    /// The pod as the stand-in now stores it; `None` once deleted.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.shared.state)
            .pods
            .iter()
            .find(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)
            .cloned()
    }

    /// How many status patches moved a pod to phase Failed.
    pub fn failed_transitions(&self) -> usize {
        lock(&self.shared.state).failed_transitions
    }

    /// A kubeconfig naming this server (`--kubeconfig`).
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// The requests that changed something, in order.
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    /// Waits until a request matches `matches` (described by `what`);
    /// returns it.
    pub fn wait_for_request(
        &self,
        deadline: Duration,
        what: &str,
        matches: impl Fn(&Recorded) -> bool,
    ) -> io::Result<Recorded> {
        let mut found = None;
        wait_until(deadline, what, || {
            found = self.requests().into_iter().find(|r| matches(r));
            found.is_some()
        })
        .map_err(|e| io::Error::other(format!("{e}; requests: {:#?}", self.requests())))?;
        found.ok_or_else(|| io::Error::other("no request"))
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.go_down();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Serves `listener` on a thread of its own until told to stop; stopping
/// drops the runtime, and with it every open connection.
fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) -> io::Result<Serving> {
    listener.set_nonblocking(true)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = Router::new().fallback(handle).with_state(shared);
    let thread = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            tokio::select! {
                _ = axum::serve(listener, app) => {}
                _ = stopped => {}
            }
        });
    });
    Ok(Serving { stop, thread })
}

/// A kubeconfig for `server` with a bearer token.
pub fn write_kubeconfig(server: &str) -> io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("evictd-kubeconfig-{}-{n}.yaml", std::process::id()));
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "evictd", "user": {"token": TOKEN}}],
        "contexts": [{"name": "stand-in",
                      "context": {"cluster": "stand-in", "user": "evictd", "namespace": "default"}}],
        "current-context": "stand-in",
    });
    std::fs::write(&path, serde_json::to_vec(&config)?)?;
    Ok(path)
}

/// The API Pod object of a sandbox pod bound to `node`: what the API
/// server returns for it (spec, with the emptyDirs of the metadata's
/// `empty_dirs`; status with the container's runtime id, which names the
/// sandbox's container cgroup).
pub fn api_pod(pod: &PodSpec, node: &str) -> Value {
    let meta = &pod.metadata;
    let container_cgroup = pod.container.rsplit('/').next().unwrap_or_default();
    let containers: Vec<Value> = meta["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let mut resources = json!({});
            for key in ["requests", "limits"] {
                if !c[key].is_null() {
                    resources[key] = c[key].clone();
                }
            }
            json!({"name": c["name"], "image": "evictd-workload", "resources": resources})
        })
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({"name": c["name"], "image": "evictd-workload", "imageID": "",
                   "containerID": format!("containerd://{container_cgroup}"),
                   "ready": true, "restartCount": 0, "started": true,
                   "state": {"running": {"startedAt": "2026-11-23T00:00:00Z"}}})
        })
        .collect();
    let volumes: Vec<Value> = meta["empty_dirs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|volume| {
            let mut empty_dir = json!({});
            if !volume["size_limit"].is_null() {
                empty_dir["sizeLimit"] = volume["size_limit"].clone();
            }
            json!({"name": volume["name"], "emptyDir": empty_dir})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": "100",
            "annotations": {"kubernetes.io/config.source": "api"},
        },
        "spec": {
            "nodeName": node, "priority": meta["priority"],
            "containers": containers, "volumes": volumes,
            "terminationGracePeriodSeconds": 30,
        },
        "status": {"phase": "Running", "containerStatuses": statuses},
    })
}

/// A `Status` failure as the API server writes it.
pub fn status_failure(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
           "status": "Failure", "message": message, "reason": reason, "code": code})
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let header = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let recorded = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        content_type: header(header::CONTENT_TYPE),
        authorization: header(header::AUTHORIZATION),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        status: 0,
    };
    let index = {
        let mut requests = lock(&shared.requests);
        requests.push(recorded.clone());
        requests.len() - 1
    };
    tokio::time::sleep(shared.faults.delay).await;
    let response = respond(&shared, &parts.method, &recorded);
    lock(&shared.requests)[index].status = response.status().as_u16();
    response
}

fn respond(shared: &Shared, method: &Method, request: &Recorded) -> Response {
    let path = request.path.as_str();
    if shared
        .faults
        .forbidden
        .iter()
        .any(|(m, suffix)| *m == method.as_str() && path.ends_with(suffix))
    {
        let message = format!(
            "{path} is forbidden: User \"system:serviceaccount:evictd-system:evictd\" cannot {} this resource",
            method.as_str().to_lowercase()
        );
        return json_response(403, status_failure(403, "Forbidden", &message));
    }
    let failing = shared
        .faults
        .failing
        .iter()
        .find(|suffix| path.ends_with(*suffix));
    let fails = failing.is_some_and(|suffix| {
        let mut failed = lock(&shared.failed);
        let failed = failed.entry(suffix).or_default();
        *failed += 1;
        shared.faults.failing_first == 0 || *failed <= shared.faults.failing_first
    });
    if fails {
        let message = format!("Internal error occurred: failed calling webhook for {path}");
        return json_response(500, status_failure(500, "InternalError", &message));
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut state = lock(&shared.state);
    let pod_index = |state: &Stored, namespace: &str, name: &str| {
        state
            .pods
            .iter()
            .position(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)
    };
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", "pods"]) if request.query.contains("watch=true") => {
            // An open watch with nothing to say; bookmarks are optional.
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(futures::stream::pending::<
                    Result<Bytes, Infallible>,
                >()))
                .unwrap_or_default()
        }
        ("GET", ["api", "v1", "pods"]) => json_response(
            200,
            json!({"kind": "PodList", "apiVersion": "v1",
                   "metadata": {"resourceVersion": "100"}, "items": state.pods}),
        ),
        ("PATCH", ["api", "v1", "namespaces", namespace, "pods", name, "status"]) => {
            let Some(index) = pod_index(&state, namespace, name) else {
                return not_found(name);
            };
            let stored_uid = state.pods[index]["metadata"]["uid"].clone();
            let wanted_uid = &request.body["metadata"]["uid"];
            if !wanted_uid.is_null() && *wanted_uid != stored_uid {
                return conflict(&format!(
                    "Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {stored_uid}"
                ));
            }
            let status = &mut state.pods[index]["status"];
            let was_failed = status["phase"] == "Failed";
            for field in ["phase", "reason", "message"] {
                if !request.body["status"][field].is_null() {
                    status[field] = request.body["status"][field].clone();
                }
            }
            // A strategic merge patch merges conditions by their type.
            for patched in request.body["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let conditions = status["conditions"].as_array_mut();
                match conditions {
                    Some(conditions) => {
                        match conditions.iter_mut().find(|c| c["type"] == patched["type"]) {
                            Some(existing) => *existing = patched.clone(),
                            None => conditions.push(patched.clone()),
                        }
                    }
                    None => status["conditions"] = json!([patched]),
                }
            }
            let now_failed = status["phase"] == "Failed";
            let pod = state.pods[index].clone();
            if now_failed && !was_failed {
                state.failed_transitions += 1;
            }
            json_response(200, pod)
        }
        ("DELETE", ["api", "v1", "namespaces", namespace, "pods", name]) => {
            let Some(index) = pod_index(&state, namespace, name) else {
                return not_found(name);
            };
            let wanted_uid = &request.body["preconditions"]["uid"];
            if !wanted_uid.is_null() && *wanted_uid != state.pods[index]["metadata"]["uid"] {
                return conflict("Precondition failed: UID in precondition does not match");
            }
            json_response(200, state.pods.remove(index))
        }
        ("POST", ["api", "v1", "namespaces", _, "pods", name, "eviction"]) => {
            if shared.faults.budget_refuses_evictions {
                return json_response(
                    429,
                    status_failure(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    ),
                );
            }
            json_response(
                201,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Success", "code": 201, "details": {"name": name, "kind": "pods"}}),
            )
        }
        ("POST", ["api", "v1", "namespaces", namespace, "events"]) => {
            let name = request.body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if !state.events.insert(((*namespace).to_owned(), name.clone())) {
                return json_response(
                    409,
                    status_failure(
                        409,
                        "AlreadyExists",
                        &format!("events \"{name}\" already exists"),
                    ),
                );
            }
            let mut event = request.body.clone();
            event["metadata"]["resourceVersion"] = json!("200");
            json_response(201, event)
        }
        _ => not_found(path),
    }
}

fn conflict(message: &str) -> Response {
    json_response(409, status_failure(409, "Conflict", message))
}

fn not_found(name: &str) -> Response {
    json_response(
        404,
        status_failure(404, "NotFound", &format!("\"{name}\" not found")),
    )
}

fn json_response(code: u16, body: Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

/// A loopback address where nothing listens: an API server that is down.
pub fn closed_port() -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
    // The listener closes here; connections are refused from now on.
}
