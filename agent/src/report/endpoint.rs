//! The HTTP endpoints: `/metrics`, `/healthz`, `/readyz` on
//! `--metrics-address`, and the probes alone on `--health-address`
//! ([`Routes`]). They listen where other clients may reach them, so nothing
//! they are sent may cost the node its protection: each runs on a thread
//! and runtime of its own (a flood delays no engine run), holds at most
//! [`EndpointLimits::max_connections`] connections with small buffers, and
//! gives each connection a deadline for its request headers and one for
//! the whole exchange. When every slot is taken, a new connection displaces
//! the oldest one that has not sent a complete request yet (a slow client),
//! so a scraper or a probe that sends its request at once still gets an
//! answer under a slow-connection flood.
//!
//! Clients that send their request at once and then read the answer slowly
//! hold their slot until the exchange's deadline: sixteen such scrapers
//! fill the metrics endpoint. kubelet's probes therefore have an endpoint
//! of their own, whose tiny answers fit in the socket's buffer, so no
//! connection there waits on its client, and no scrape client can take
//! its slots.
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    http::{Request, Response, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpStream, sync::oneshot, task::AbortHandle};
use tower_service::Service as _;
use tracing::{debug, warn};

use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("{routes} endpoint on {address}: {source}")]
    Bind {
        routes: Routes,
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} endpoint: starting its thread: {1}")]
    Thread(Routes, #[source] std::io::Error),
}

/// What an endpoint serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// `/metrics`, `/healthz` and `/readyz` (`--metrics-address`).
    Metrics,
    /// `/healthz` and `/readyz` only (`--health-address`): kubelet's
    /// probes, on slots no scrape client can take.
    Probes,
}

impl std::fmt::Display for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Routes::Metrics => "metrics",
            Routes::Probes => "probe",
        })
    }
}

/// How much the endpoint holds for its clients.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointLimits {
    /// Connections open at once. A Prometheus or two and kubelet's probes
    /// need a handful.
    pub max_connections: usize,
    /// From accept to the end of the request headers.
    pub header_timeout: Duration,
    /// From accept to the end of the response: bounds a client that reads
    /// the response slowly, or sends a body slowly. Prometheus' default
    /// scrape timeout is 10 s.
    pub request_deadline: Duration,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        Self {
            max_connections: 16,
            header_timeout: Duration::from_secs(5),
            request_deadline: Duration::from_secs(10),
        }
    }
}

impl EndpointLimits {
    /// The probe endpoint's: kubelet probes each container every few
    /// seconds, one request at a time per probe, and gives up after its
    /// `timeoutSeconds` (1 s by default), so a handful of slots and short
    /// deadlines.
    pub(crate) fn probes() -> Self {
        Self {
            max_connections: 8,
            header_timeout: Duration::from_secs(2),
            request_deadline: Duration::from_secs(2),
        }
    }
}

/// hyper's smallest read buffer, which also bounds the request line and
/// headers (larger ones get 431).
const READ_BUFFER: usize = 8192;
const MAX_HEADER_BYTES: usize = 4096;
const MAX_HEADERS: usize = 32;

/// A running endpoint; dropping it stops it.
pub(crate) struct Endpoint {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Binds `address` (port 0: any free port) and serves `routes` on a
    /// thread of its own until stopped. `/readyz` answers 200 once `ready`
    /// is set (protection armed), 503 before.
    pub(crate) fn start(
        metrics: Arc<Metrics>,
        ready: Arc<AtomicBool>,
        address: SocketAddr,
        routes: Routes,
        limits: EndpointLimits,
    ) -> Result<Self, EndpointError> {
        let bind_error = |source| EndpointError::Bind {
            routes,
            address,
            source,
        };
        let listener = std::net::TcpListener::bind(address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let bound = listener.local_addr().map_err(bind_error)?;
        let (stop, stopped) = oneshot::channel();
        let name = match routes {
            Routes::Metrics => "evictd-http",
            Routes::Probes => "evictd-probes",
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        warn!(error = %e, endpoint = %routes, "HTTP endpoint: cannot start its runtime; not serving");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            warn!(error = %e, endpoint = %routes, "HTTP endpoint: cannot listen; not serving");
                            return;
                        }
                    };
                    let router = router(metrics.clone(), ready, routes);
                    tokio::select! {
                        () = accept_loop(listener, router, metrics, routes, limits) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime ends every open connection.
            })
            .map_err(|e| EndpointError::Thread(routes, e))?;
        Ok(Self {
            address: bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>, routes: Routes) -> Router {
    let ready_for_metrics = Arc::clone(&ready);
    let router = match routes {
        Routes::Probes => Router::new(),
        Routes::Metrics => Router::new().route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                metrics
                    .ready
                    .set(i64::from(ready_for_metrics.load(Ordering::Acquire)));
                async move {
                    (
                        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                        metrics.render(),
                    )
                        .into_response()
                }
            }),
        ),
    };
    router.route("/healthz", get(|| async { "ok\n" })).route(
        "/readyz",
        get(move || {
            let armed = ready.load(Ordering::Acquire);
            async move {
                if armed {
                    (StatusCode::OK, "ok\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "protection not armed yet\n",
                    )
                }
            }
        }),
    )
}

/// One open connection, in accept order.
struct Slot {
    id: u64,
    /// Set once its request headers are complete: from then on it is being
    /// answered and is not displaced.
    answering: Arc<AtomicBool>,
    task: AbortHandle,
}

struct Slots {
    next_id: u64,
    open: Vec<Slot>,
    /// Whether `evictd_http_connections` counts these: the metrics
    /// endpoint's (closed connections are counted for both).
    gauged: bool,
}

impl Slots {
    fn gauge(&self, metrics: &Metrics) {
        if self.gauged {
            metrics.http_connections.set(self.open.len() as i64);
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    metrics: Arc<Metrics>,
    routes: Routes,
    limits: EndpointLimits,
) {
    let slots = Arc::new(Mutex::new(Slots {
        next_id: 0,
        open: Vec::new(),
        gauged: routes == Routes::Metrics,
    }));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of file descriptors, typically: back off rather than
                // spin on the listener.
                warn!(error = %e, endpoint = %routes, "HTTP endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some((id, answering)) = admit(&slots, &metrics, limits.max_connections) else {
            continue;
        };
        let connection = serve_connection(
            stream,
            router.clone(),
            answering.clone(),
            metrics.clone(),
            limits,
        );
        let release = Release {
            slots: slots.clone(),
            id,
            metrics: metrics.clone(),
        };
        let task = tokio::spawn(async move {
            // Removes the slot however the task ends (finished, timed out,
            // or aborted when displaced).
            let _release = release;
            connection.await;
        });
        occupy(&slots, &metrics, id, answering, task.abort_handle());
        // Let the new connection read what it was sent before the next
        // accept: a client that sent its whole request with the connection
        // is answering by then and cannot be displaced, however many slow
        // ones wait behind it in the listen queue.
        tokio::task::yield_now().await;
    }
}

/// Makes room for a new connection: a free slot, or the one of the oldest
/// connection still waiting for its request, closed. `None` when every
/// slot is busy answering (the new connection is dropped, closing it).
/// Returns the new connection's id and its "answering" flag.
fn admit(
    slots: &Mutex<Slots>,
    metrics: &Metrics,
    max_connections: usize,
) -> Option<(u64, Arc<AtomicBool>)> {
    let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
    if slots.open.len() >= max_connections {
        let slow = slots
            .open
            .iter()
            .position(|slot| !slot.answering.load(Ordering::Acquire));
        match slow {
            Some(index) => {
                slots.open.remove(index).task.abort();
                closed(metrics, "displaced");
            }
            None => {
                closed(metrics, "refused");
                return None;
            }
        }
    }
    let id = slots.next_id;
    slots.next_id += 1;
    Some((id, Arc::new(AtomicBool::new(false))))
}

/// Records a new connection's slot.
fn occupy(
    slots: &Mutex<Slots>,
    metrics: &Metrics,
    id: u64,
    answering: Arc<AtomicBool>,
    task: AbortHandle,
) {
    let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
    slots.open.push(Slot {
        id,
        answering,
        task,
    });
    slots.gauge(metrics);
}

/// Removes a connection's slot when its task ends.
struct Release {
    slots: Arc<Mutex<Slots>>,
    id: u64,
    metrics: Arc<Metrics>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.open.retain(|slot| slot.id != self.id);
        slots.gauge(&self.metrics);
    }
}

fn closed(metrics: &Metrics, reason: &str) {
    metrics
        .http_connections_closed
        .with_label_values(&[reason])
        .inc();
}

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    answering: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    limits: EndpointLimits,
) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        answering.store(true, Ordering::Release);
        let mut router = router.clone();
        async move {
            let response: Result<Response<Body>, Infallible> = router.call(request).await;
            response
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUFFER)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        // One request per connection: nothing idles in a slot between
        // scrapes.
        .keep_alive(false);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.request_deadline, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_timeout() => closed(&metrics, "header-timeout"),
        Ok(Err(e)) => debug!(error = %e, "HTTP endpoint: connection failed"),
        Err(_) => closed(&metrics, "deadline"),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::TcpStream as StdStream,
    };

    use super::*;

    fn http_get(address: SocketAddr, path: &str) -> String {
        let mut stream = StdStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    fn start(limits: EndpointLimits) -> (Endpoint, Arc<Metrics>, Arc<AtomicBool>) {
        let metrics = Metrics::new().unwrap();
        let ready = Arc::new(AtomicBool::new(false));
        let endpoint = Endpoint::start(
            metrics.clone(),
            ready.clone(),
            "127.0.0.1:0".parse().unwrap(),
            Routes::Metrics,
            limits,
        )
        .unwrap();
        (endpoint, metrics, ready)
    }

    /// Whether a GET of `path` is refused: the connection closed with no
    /// answer (a slow answer is not a refusal).
    fn refused(address: SocketAddr, path: &str) -> bool {
        let attempt = || -> std::io::Result<String> {
            let mut stream = StdStream::connect(address)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            write!(
                stream,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok(response)
        };
        match attempt() {
            Ok(answer) => answer.is_empty(),
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }

    /// An answer of several MiB: more than the socket buffers on both sides
    /// take, so writing it waits on a client that does not read.
    fn enlarge(metrics: &Metrics) {
        for scope in 0..60_000 {
            metrics
                .scope_value
                .with_label_values(&[&format!("/kubepods/burstable/pod-{scope:08}"), "memory"])
                .set(scope);
        }
    }

    fn closed_for(metrics: &Metrics, reason: &str) -> u64 {
        metrics
            .http_connections_closed
            .with_label_values(&[reason])
            .get()
    }

    /// Polls `condition` every 5 ms for up to 10 s.
    fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn serves_metrics_health_and_readiness() {
        let (endpoint, metrics, ready) = start(EndpointLimits::default());
        metrics.oom_kills.inc();
        let address = endpoint.address();
        let body = http_get(address, "/metrics");
        assert!(body.contains("evictd_kernel_oom_kills_total 1"), "{body}");
        assert!(http_get(address, "/healthz").ends_with("ok\n"));
        let before = http_get(address, "/readyz");
        assert!(before.starts_with("HTTP/1.1 503"), "{before}");
        ready.store(true, Ordering::Release);
        let after = http_get(address, "/readyz");
        assert!(after.starts_with("HTTP/1.1 200"), "{after}");
    }

    #[test]
    fn slow_clients_are_displaced_and_timed_out_while_a_prompt_one_is_answered() {
        let limits = EndpointLimits {
            max_connections: 4,
            header_timeout: Duration::from_millis(600),
            request_deadline: Duration::from_secs(5),
        };
        let (endpoint, metrics, _) = start(limits);
        let address = endpoint.address();
        // Ten clients that send half a request line and stop.
        let slow: Vec<StdStream> = (0..10)
            .map(|_| {
                let mut stream = StdStream::connect(address).unwrap();
                stream.write_all(b"GET /metr").unwrap();
                stream
            })
            .collect();
        eventually(
            "the endpoint to have displaced the slow clients past its cap",
            || closed_for(&metrics, "displaced") == 6,
        );
        assert!(metrics.http_connections.get() <= 4);
        // A prompt client still gets its answer.
        let body = http_get(address, "/healthz");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        // The slow ones left are closed once their header time is up.
        eventually("the slow clients' header timeout", || {
            closed_for(&metrics, "header-timeout") >= 1 && metrics.http_connections.get() == 0
        });
        drop(slow);
    }

    #[test]
    fn a_client_that_never_reads_its_answer_is_cut_at_the_deadline() {
        let limits = EndpointLimits {
            max_connections: 4,
            header_timeout: Duration::from_secs(5),
            request_deadline: Duration::from_millis(500),
        };
        let (endpoint, metrics, _) = start(limits);
        enlarge(&metrics);
        let mut stream = StdStream::connect(endpoint.address()).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        eventually("the unread answer to be cut at the deadline", || {
            closed_for(&metrics, "deadline") == 1 && metrics.http_connections.get() == 0
        });
        drop(stream);
    }

    #[test]
    fn slow_readers_that_fill_the_metrics_endpoint_cannot_fail_the_probes() {
        // Four slots, as good as sixteen and cheaper to fill; a deadline
        // longer than the test, so the scrapers hold their slots however
        // slowly it runs.
        let limits = EndpointLimits {
            max_connections: 4,
            request_deadline: Duration::from_secs(600),
            ..EndpointLimits::default()
        };
        let (endpoint, metrics, ready) = start(limits);
        let probes = Endpoint::start(
            metrics.clone(),
            ready.clone(),
            "127.0.0.1:0".parse().unwrap(),
            Routes::Probes,
            EndpointLimits::probes(),
        )
        .unwrap();
        enlarge(&metrics);
        ready.store(true, Ordering::Release);
        // Scrapers that ask at once and never read their answer: each holds
        // its slot, answering, until the exchange's deadline.
        let readers: Vec<StdStream> = (0..limits.max_connections)
            .map(|_| {
                let mut stream = StdStream::connect(endpoint.address()).unwrap();
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                stream
            })
            .collect();
        // A probe of the metrics endpoint now fails: its connection is
        // refused (what kubelet saw when the probes shared these slots).
        eventually("the metrics endpoint to refuse a probe", || {
            refused(endpoint.address(), "/healthz")
        });
        assert!(closed_for(&metrics, "refused") >= 1);
        // The probe endpoint answers both probes, at once, all the while.
        for path in ["/healthz", "/readyz"] {
            let answer = http_get(probes.address(), path);
            assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        }
        // It serves nothing a scraper would come for.
        let scrape = http_get(probes.address(), "/metrics");
        assert!(scrape.starts_with("HTTP/1.1 404"), "{scrape}");
        drop(readers);
    }
}
