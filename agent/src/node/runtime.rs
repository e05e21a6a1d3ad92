//! The container runtime through CRI (`--container-runtime-endpoint`, as
//! kubelet names it): what kubelet's disk side asks the runtime.
//!
//! - [`RuntimeClient`]: a gRPC client on the runtime's unix socket, every
//!   call bounded in time, errors naming the endpoint and the call.
//! - [`filesystems`]: `ImageFsInfo` → the imagefs and containerfs
//!   filesystems, and whether they are dedicated (by device).
//! - [`disk_usage`]: each pod's disk usage as kubelet's `podDiskUsage`
//!   counts it (writable layers, logs, local volumes).
//! - [`reclaim`]: kubelet's node-level reclaim (dead containers as its
//!   container GC keeps them, unused images old enough, least recently
//!   used first, never one a sandbox runs) before any pod is evicted, one
//!   round per signal.
//! - [`local_storage`]: kubelet's local-storage limit evictions (emptyDir
//!   `sizeLimit`, ephemeral-storage limits) with kubelet's messages.
//! - `link`: the live agent's connection, on a thread of its own.
//!
//! The CRI API comes from the `k8s-cri` crate (cri-api's `runtime/v1`
//! `api.proto`, compiled by its build script with tonic and prost).
pub mod disk_usage;
pub mod filesystems;
#[cfg(test)]
mod fixtures;
pub(crate) mod link;
pub mod local_storage;
pub mod reading;
pub mod reclaim;

use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    Container, ContainerStats, ContainerStatus, ContainerStatusRequest, Image, ImageFsInfoRequest,
    ImageFsInfoResponse, ImageSpec, ListContainerStatsRequest, ListContainersRequest,
    ListImagesRequest, ListPodSandboxRequest, PodSandbox, PodSandboxStatusRequest,
    RemoveContainerRequest, RemoveImageRequest, StatusRequest, VersionRequest,
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// How long connecting to the runtime's socket may take.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one CRI call may take. kubelet allows 2 minutes
/// (`--runtime-request-timeout`) because it pulls images through the same
/// connection; evictd only lists and removes, which a healthy runtime
/// answers in milliseconds, and a decision must not hang on a stuck one.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "--container-runtime-endpoint {endpoint:?}: expected unix:///path/to/socket or an absolute socket path"
    )]
    Endpoint { endpoint: String },
    #[error("connecting to the container runtime at {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("connecting to the container runtime at {}: no answer within {waited:?}", socket.display())]
    ConnectTimeout { socket: PathBuf, waited: Duration },
    #[error("CRI {call} on {}: {source}", socket.display())]
    Call {
        socket: PathBuf,
        call: &'static str,
        #[source]
        source: Box<tonic::Status>,
    },
    #[error("CRI {call} on {}: the answer has no {field}", socket.display())]
    Incomplete {
        socket: PathBuf,
        call: &'static str,
        field: &'static str,
    },
}

impl RuntimeError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_input_error(&self) -> bool {
        matches!(self, Self::Endpoint { .. })
    }

    /// What failed, as the `call` label of evictd_container_runtime_errors_total
    /// counts it: the CRI method, or `Connect`.
    pub(crate) fn call(&self) -> &'static str {
        match self {
            Self::Endpoint { .. } | Self::Connect { .. } | Self::ConnectTimeout { .. } => "Connect",
            Self::Call { call, .. } | Self::Incomplete { call, .. } => call,
        }
    }
}

/// The socket an endpoint names: `unix:///run/containerd/containerd.sock`
/// (kubelet's form) or a bare absolute path.
pub(crate) fn socket_path(endpoint: &str) -> Result<PathBuf, RuntimeError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') && !path.contains('\0') {
        Ok(PathBuf::from(path))
    } else {
        Err(RuntimeError::Endpoint {
            endpoint: endpoint.to_owned(),
        })
    }
}

/// A connection to the runtime's CRI services (runtime and image: both on
/// the one socket for containerd and CRI-O).
#[derive(Debug, Clone)]
pub struct RuntimeClient {
    socket: PathBuf,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl RuntimeClient {
    /// Connects to `endpoint` with the default timeouts and asks the
    /// runtime's version, so a socket that accepts but does not speak CRI
    /// v1 (containerd < 1.6 speaks only v1alpha2) fails here.
    pub async fn connect(endpoint: &str) -> Result<Self, RuntimeError> {
        Self::connect_with(endpoint, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CALL_TIMEOUT).await
    }

    pub(crate) async fn connect_with(
        endpoint: &str,
        connect_timeout: Duration,
        call_timeout: Duration,
    ) -> Result<Self, RuntimeError> {
        let socket = socket_path(endpoint)?;
        let channel = unix_channel(&socket, connect_timeout, call_timeout).await?;
        let mut client = Self {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            socket,
        };
        client.version().await?;
        Ok(client)
    }

    /// The socket this client talks to.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// The runtime service, for calls this module does not wrap (the test
    /// harness creates pods with it).
    pub fn runtime_service(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// The image service, likewise.
    pub fn image_service(&self) -> ImageServiceClient<Channel> {
        self.images.clone()
    }

    /// `(runtime name, runtime version)`, e.g. `("containerd", "1.6.20")`.
    pub(crate) async fn version(&mut self) -> Result<(String, String), RuntimeError> {
        let reply = self
            .runtime
            .version(VersionRequest {
                version: String::new(),
            })
            .await
            .map_err(|e| self.call_error("Version", e))?
            .into_inner();
        Ok((reply.runtime_name, reply.runtime_version))
    }

    pub(crate) async fn list_pod_sandboxes(&mut self) -> Result<Vec<PodSandbox>, RuntimeError> {
        Ok(self
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|e| self.call_error("ListPodSandbox", e))?
            .into_inner()
            .items)
    }

    /// Every container, running or not.
    pub async fn list_containers(&mut self) -> Result<Vec<Container>, RuntimeError> {
        Ok(self
            .runtime
            .list_containers(ListContainersRequest { filter: None })
            .await
            .map_err(|e| self.call_error("ListContainers", e))?
            .into_inner()
            .containers)
    }

    pub async fn list_container_stats(&mut self) -> Result<Vec<ContainerStats>, RuntimeError> {
        Ok(self
            .runtime
            .list_container_stats(ListContainerStatsRequest { filter: None })
            .await
            .map_err(|e| self.call_error("ListContainerStats", e))?
            .into_inner()
            .stats)
    }

    pub async fn container_status(&mut self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.runtime
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await
            .map_err(|e| self.call_error("ContainerStatus", e))?
            .into_inner()
            .status
            .ok_or_else(|| self.incomplete("ContainerStatus", "status"))
    }

    pub(crate) async fn image_fs_info(&mut self) -> Result<ImageFsInfoResponse, RuntimeError> {
        Ok(self
            .images
            .image_fs_info(ImageFsInfoRequest {})
            .await
            .map_err(|e| self.call_error("ImageFsInfo", e))?
            .into_inner())
    }

    pub async fn list_images(&mut self) -> Result<Vec<Image>, RuntimeError> {
        Ok(self
            .images
            .list_images(ListImagesRequest { filter: None })
            .await
            .map_err(|e| self.call_error("ListImages", e))?
            .into_inner()
            .images)
    }

    /// Removes a container that is not running (a running one is refused
    /// by the runtime's own checks only for some runtimes: callers pass
    /// dead containers).
    pub(crate) async fn remove_container(&mut self, id: &str) -> Result<(), RuntimeError> {
        self.runtime
            .remove_container(RemoveContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .map_err(|e| self.call_error("RemoveContainer", e))?;
        Ok(())
    }

    /// Removes an image by id, with every tag it has.
    pub(crate) async fn remove_image(&mut self, id: &str) -> Result<(), RuntimeError> {
        self.images
            .remove_image(RemoveImageRequest {
                image: Some(ImageSpec {
                    image: id.to_owned(),
                    ..ImageSpec::default()
                }),
            })
            .await
            .map_err(|e| self.call_error("RemoveImage", e))?;
        Ok(())
    }

    /// The image the runtime starts pod sandboxes from (containerd's
    /// `sandbox_image`, from the configuration its verbose `Status` shows),
    /// which kubelet's image GC never deletes; `None` when the runtime
    /// does not say.
    pub async fn sandbox_image(&mut self) -> Result<Option<String>, RuntimeError> {
        let reply = self
            .runtime
            .status(StatusRequest { verbose: true })
            .await
            .map_err(|e| self.call_error("Status", e))?
            .into_inner();
        Ok(reply
            .info
            .get("config")
            .and_then(|config| serde_json::from_str::<serde_json::Value>(config).ok())
            .and_then(|config| config["sandboxImage"].as_str().map(str::to_owned)))
    }

    /// The image sandbox `id` runs, from its verbose status (the `image` of
    /// the `info` containerd and CRI-O put there); `None` when the runtime
    /// does not say.
    pub(crate) async fn pod_sandbox_image(
        &mut self,
        id: &str,
    ) -> Result<Option<String>, RuntimeError> {
        let reply = self
            .runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: true,
            })
            .await
            .map_err(|e| self.call_error("PodSandboxStatus", e))?
            .into_inner();
        Ok(reply
            .info
            .get("info")
            .and_then(|info| serde_json::from_str::<serde_json::Value>(info).ok())
            .and_then(|info| info["image"].as_str().map(str::to_owned))
            .filter(|image| !image.is_empty()))
    }

    fn call_error(&self, call: &'static str, status: tonic::Status) -> RuntimeError {
        RuntimeError::Call {
            socket: self.socket.clone(),
            call,
            source: Box::new(status),
        }
    }

    fn incomplete(&self, call: &'static str, field: &'static str) -> RuntimeError {
        RuntimeError::Incomplete {
            socket: self.socket.clone(),
            call,
            field,
        }
    }
}

/// An HTTP/2 channel over the unix socket. The URI is a placeholder tonic
/// requires; the connector ignores it.
async fn unix_channel(
    socket: &Path,
    connect_timeout: Duration,
    call_timeout: Duration,
) -> Result<Channel, RuntimeError> {
    let endpoint = Endpoint::from_static("http://cri.invalid")
        .connect_timeout(connect_timeout)
        .timeout(call_timeout);
    let path = socket.to_owned();
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, io::Error>(TokioIo::new(stream))
        }
    });
    // The connector's own timeout does not cover a socket that accepts and
    // never completes the HTTP/2 handshake; this does.
    match tokio::time::timeout(connect_timeout, endpoint.connect_with_connector(connector)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(RuntimeError::Connect {
            socket: socket.to_owned(),
            source,
        }),
        Err(_) => Err(RuntimeError::ConnectTimeout {
            socket: socket.to_owned(),
            waited: connect_timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_a_unix_socket() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            Path::new("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/var/run/crio/crio.sock").unwrap(),
            Path::new("/var/run/crio/crio.sock")
        );
        for bad in [
            "tcp://127.0.0.1:1234",
            "unix://relative.sock",
            "",
            "run/x.sock",
        ] {
            let err = socket_path(bad).unwrap_err();
            assert!(err.is_input_error());
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let endpoint = format!("unix://{}", socket.display());
        let err =
            RuntimeClient::connect_with(&endpoint, Duration::from_secs(1), Duration::from_secs(1))
                .await
                .unwrap_err();
        assert!(
            matches!(&err, RuntimeError::Connect { socket: s, .. } if *s == socket),
            "{err:?}"
        );
        assert!(err.to_string().contains("absent.sock"), "{err}");
    }

    #[tokio::test]
    async fn a_socket_that_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent.sock");
        // Accepts connections (the kernel's backlog) but never speaks.
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let endpoint = socket.display().to_string();
        let err = RuntimeClient::connect_with(
            &endpoint,
            Duration::from_millis(200),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                RuntimeError::ConnectTimeout { .. } | RuntimeError::Call { .. }
            ),
            "{err:?}"
        );
    }
}
