//! The pre-kill hook (`--pre-kill-hook`): a word to the operator's tooling
//! before a soft eviction's SIGTERM (a heap dump, a drain, a page), as
//! systemd-oomd's prekill hook and earlyoom's `-P` give one. Either an
//! executable, run without a shell in a process group of its own, or an
//! `http://` endpoint that gets a JSON POST. Told the pod, why it is
//! killed and its deadline; bounded by `--pre-kill-hook-timeout` and by
//! half the pod's grace period, and killed (or hung up on) at its
//! deadline: a hook that hangs, fails or floods its output never holds the
//! kill back past that, nor grows the agent.
use std::{
    fmt,
    io::ErrorKind,
    path::PathBuf,
    process::{ExitStatus, Stdio},
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use hyper::{
    Request, Uri,
    client::conn::http1,
    header::{CONTENT_TYPE, HOST, USER_AGENT},
};
use hyper_util::rt::TokioIo;
use nix::{
    sys::signal::{Signal as UnixSignal, killpg},
    unistd::Pid,
};
use serde::Serialize;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _},
    net::TcpStream,
    process::Command,
};

use crate::decide::reason::KillReason;

/// The hook's output kept for the log: a hook a tenant can make talk (it
/// prints the pod's name) must not grow the agent; the rest is read and
/// dropped.
const OUTPUT_KEPT: usize = 1024;

/// What an HTTP hook's answer may take while its head is read (hyper's
/// least): its body is never read.
const HTTP_ANSWER_BUFFER: usize = 8192;

/// The only environment a hook executable gets besides its call: not the
/// agent's (its service account token path, its proxies).
const HOOK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum PreKillError {
    #[error(
        "--pre-kill-hook {0:?}: neither an absolute path to an executable nor an http:// URL (https is not spoken: use a node-local endpoint)"
    )]
    Target(String),
    #[error("pre-kill hook {path}: cannot start it: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pre-kill hook {path}: waiting for it: {source}")]
    Wait {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pre-kill hook {path} exited with {status}; its output began {output:?}")]
    Exit {
        path: PathBuf,
        status: ExitStatus,
        output: String,
    },
    #[error("pre-kill hook {url}: cannot encode the call: {source}")]
    Encode {
        url: Uri,
        #[source]
        source: serde_json::Error,
    },
    #[error("pre-kill hook {url}: cannot make the request: {source}")]
    Request {
        url: Uri,
        #[source]
        source: hyper::http::Error,
    },
    #[error("pre-kill hook {url}: cannot connect: {source}")]
    Connect {
        url: Uri,
        #[source]
        source: std::io::Error,
    },
    #[error("pre-kill hook {url}: {source}")]
    Http {
        url: Uri,
        #[source]
        source: hyper::Error,
    },
    #[error("pre-kill hook {url} answered {status}")]
    HttpStatus { url: Uri, status: hyper::StatusCode },
}

/// Where the hook is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookTarget {
    /// An executable, given its call in its environment.
    Command(PathBuf),
    /// An HTTP/1.1 endpoint, given its call as a JSON body.
    Http(HttpEndpoint),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    url: Uri,
    /// `host:port`, as connected to.
    address: String,
}

impl FromStr for HookTarget {
    type Err = PreKillError;

    fn from_str(text: &str) -> Result<Self, PreKillError> {
        let refuse = || PreKillError::Target(text.to_owned());
        if text.starts_with("http://") {
            // A URL parses without spaces or control characters, which
            // would let it write headers; credentials are not sent.
            let url: Uri = text.parse().map_err(|_| refuse())?;
            let host = url.host().filter(|host| !host.is_empty());
            let credentials = url.authority().is_some_and(|a| a.as_str().contains('@'));
            // What follows the host; `Uri::port` would pass over a port
            // past 65535 as none.
            let after_host = match (url.authority(), host) {
                (Some(authority), Some(host)) => authority.as_str().strip_prefix(host),
                _ => None,
            };
            let port = match after_host {
                Some("") => Some(80),
                Some(rest) => rest
                    .strip_prefix(':')
                    .and_then(|port| port.parse::<u16>().ok()),
                None => None,
            };
            let (Some(host), Some(port), false) = (host, port, credentials) else {
                return Err(refuse());
            };
            let address = format!("{host}:{port}");
            return Ok(Self::Http(HttpEndpoint { url, address }));
        }
        let path = PathBuf::from(text);
        if text.contains("://") || !path.is_absolute() {
            return Err(refuse());
        }
        Ok(Self::Command(path))
    }
}

impl fmt::Display for HookTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Command(path) => write!(f, "{}", path.display()),
            Self::Http(endpoint) => write!(f, "{}", endpoint.url),
        }
    }
}

/// What the hook is told: the pod, why it is killed, and until when the
/// hook may run (then it is killed, and the pod gets its SIGTERM).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PreKillCall {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub reason: &'static str,
    pub signal: &'static str,
    pub deadline_unix_ms: u64,
    pub remaining_ms: u64,
}

impl PreKillCall {
    /// The call for pod `namespace/name` (`uid`), killed for `reason`, whose
    /// hook may run for `bound` from `now`.
    pub(crate) fn new(
        (namespace, name, uid): (&str, &str, &str),
        reason: KillReason,
        now: SystemTime,
        bound: Duration,
    ) -> Self {
        let deadline = now + bound;
        let unix_ms = deadline.duration_since(UNIX_EPOCH).map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            reason: reason.as_str(),
            signal: reason.signal(),
            deadline_unix_ms: unix_ms,
            remaining_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The call as an executable's environment.
    fn env(&self) -> [(&'static str, String); 7] {
        [
            ("EVICTD_POD_NAMESPACE", self.namespace.clone()),
            ("EVICTD_POD_NAME", self.name.clone()),
            ("EVICTD_POD_UID", self.uid.clone()),
            ("EVICTD_REASON", self.reason.to_owned()),
            ("EVICTD_SIGNAL", self.signal.to_owned()),
            ("EVICTD_DEADLINE_UNIX_MS", self.deadline_unix_ms.to_string()),
            (
                "EVICTD_DEADLINE_REMAINING_MS",
                self.remaining_ms.to_string(),
            ),
        ]
    }
}

/// How a hook's run ended.
#[derive(Debug)]
pub(crate) enum HookOutcome {
    /// It exited 0, or the endpoint answered 2xx.
    Done,
    Failed(PreKillError),
    /// Still running at its deadline: killed, or hung up on.
    TimedOut,
}

impl HookOutcome {
    /// The `outcome` label of `evictd_pre_kill_hooks_total`.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed(_) => "failed",
            Self::TimedOut => "timeout",
        }
    }
}

/// The configured hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreKillHook {
    pub target: HookTarget,
    pub timeout: Duration,
}

impl PreKillHook {
    /// How long the hook may run before a soft eviction with `grace`: its
    /// timeout, and never more than half the grace period, so the pod
    /// keeps at least half of it after its SIGTERM and its SIGKILL comes
    /// no later than without a hook. A hard eviction (no grace) runs no
    /// hook: zero.
    pub(crate) fn bound(&self, grace: Duration) -> Duration {
        self.timeout.min(grace / 2)
    }

    /// Runs the hook for `call`, for at most `bound`.
    pub(crate) async fn run(&self, call: &PreKillCall, bound: Duration) -> HookOutcome {
        match &self.target {
            HookTarget::Command(path) => run_command(path, call, bound).await,
            HookTarget::Http(endpoint) => {
                match tokio::time::timeout(bound, post(endpoint, call)).await {
                    Ok(Ok(())) => HookOutcome::Done,
                    Ok(Err(e)) => HookOutcome::Failed(e),
                    Err(_) => HookOutcome::TimedOut,
                }
            }
        }
    }
}

/// A hook's process group, killed when dropped (at the deadline, or with
/// its eviction, which a hard threshold took over) unless its leader has
/// been reaped (then its id may be another group's).
struct Group {
    leader: Option<Pid>,
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(leader) = self.leader {
            // ESRCH: the whole group has exited already.
            let _ = killpg(leader, UnixSignal::SIGKILL);
        }
    }
}

async fn run_command(path: &PathBuf, call: &PreKillCall, bound: Duration) -> HookOutcome {
    let spawned = Command::new(path)
        .env_clear()
        .env("PATH", HOOK_PATH)
        .envs(call.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own group: what it starts is killed with it at the deadline.
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(source) => {
            return HookOutcome::Failed(PreKillError::Spawn {
                path: path.clone(),
                source,
            });
        }
    };
    let mut group = Group {
        leader: child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    };
    let output = child.stderr.take();
    let finished = tokio::time::timeout(bound, async {
        let (status, output) = tokio::join!(child.wait(), read_bounded(output));
        (status, output)
    })
    .await;
    match finished {
        Ok((Ok(status), output)) => {
            // Reaped: the group's id is no longer the hook's to kill.
            group.leader = None;
            if status.success() {
                HookOutcome::Done
            } else {
                HookOutcome::Failed(PreKillError::Exit {
                    path: path.clone(),
                    status,
                    output,
                })
            }
        }
        Ok((Err(source), _)) => HookOutcome::Failed(PreKillError::Wait {
            path: path.clone(),
            source,
        }),
        // The group is killed before the child is dropped, which tokio
        // reaps when it has died: the eviction never waits for that (a
        // task in uninterruptible sleep dies only when it wakes).
        Err(_) => {
            drop(group);
            drop(child);
            HookOutcome::TimedOut
        }
    }
}

/// The first [`OUTPUT_KEPT`] bytes of `output`, read to its end (a hook
/// blocked on a full pipe would never exit).
async fn read_bounded(output: Option<impl AsyncRead + Unpin>) -> String {
    let Some(mut output) = output else {
        return String::new();
    };
    let mut kept = Vec::with_capacity(OUTPUT_KEPT);
    let mut buffer = [0u8; 4096];
    loop {
        match output.read(&mut buffer).await {
            Ok(0) => break,
            Ok(read) => {
                let room = OUTPUT_KEPT - kept.len();
                kept.extend_from_slice(&buffer[..read.min(room)]);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// POSTs `call` to `endpoint` and reads the answer's head: 2xx is done.
async fn post(endpoint: &HttpEndpoint, call: &PreKillCall) -> Result<(), PreKillError> {
    let url = &endpoint.url;
    let http = |source| PreKillError::Http {
        url: url.clone(),
        source,
    };
    let stream = TcpStream::connect(&endpoint.address)
        .await
        .map_err(|source| PreKillError::Connect {
            url: url.clone(),
            source,
        })?;
    let (mut sender, connection) = http1::Builder::new()
        .max_buf_size(HTTP_ANSWER_BUFFER)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let authority = url.authority().map_or("", |authority| authority.as_str());
    let body = serde_json::to_vec(call).map_err(|source| PreKillError::Encode {
        url: url.clone(),
        source,
    })?;
    let request = Request::post(url.path_and_query().map_or("/", |path| path.as_str()))
        .header(HOST, authority)
        .header(USER_AGENT, "evictd")
        .header(CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(body))
        .map_err(|source| PreKillError::Request {
            url: url.clone(),
            source,
        })?;
    // The connection is driven beside the request, on this task; once it
    // has ended, the request has its answer or its error.
    let exchange = sender.send_request(request);
    tokio::pin!(connection, exchange);
    let response = tokio::select! {
        response = &mut exchange => response,
        closed = &mut connection => {
            closed.map_err(http)?;
            exchange.await
        }
    }
    .map_err(http)?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(PreKillError::HttpStatus {
            url: url.clone(),
            status: response.status(),
        })
    }
}

#[cfg(test)]
mod tests;
