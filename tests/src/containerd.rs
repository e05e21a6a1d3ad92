//! A real containerd for the tests, private to each one: its own root,
//! state, socket and configuration under a temporary directory, the
//! cgroupfs driver and the overlayfs snapshotter, and an image built here
//! ([`OciImage`]: the `evictd-workload` binary) imported with `ctr`, which
//! is also the pod sandbox image. [`Containerd`] talks CRI to it through
//! the agent's own client (`evictd::node::runtime`).
//!
//! Dropping it removes every pod it ran (CRI `StopPodSandbox` and
//! `RemovePodSandbox`), stops containerd, kills any shim still serving its
//! socket, detaches every mount under its directory and removes that
//! directory: also when a test panics.
//!
//! containerd and runc come from Debian (`containerd`, `runc`): installed
//! with apt-get when missing and this runs as root; otherwise the tests
//! skip with a message, except under `CI=true`, where a skipped tier would
//! hide a red one.
use std::{
    fs, io,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use evictd::node::runtime::RuntimeClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerStatus, CreateContainerRequest, PodSandboxConfig,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
};

use crate::{
    oci_image::OciImage,
    wait::{scaled, stop_child, wait_until},
};

/// The image every container and sandbox runs: `evictd-workload`, which as
/// a sandbox (no arguments given) pauses.
pub const IMAGE: &str = "evictd.local/workload:test";
/// Debian packages providing each binary the tier runs.
const BINARIES: [(&str, &str); 4] = [
    ("containerd", "containerd"),
    ("containerd-shim-runc-v2", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
];
/// containerd answers CRI in well under a second here; generous for a
/// loaded machine.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// One CRI call or `ctr` run.
const CALL_DEADLINE: Duration = Duration::from_secs(60);
/// How long containerd may take to exit on SIGTERM.
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// apt-get update and install, bounded.
const APT_DEADLINE: Duration = Duration::from_secs(10 * 60);

/// Whether containerd, its shim, `ctr` and runc are there, installing them
/// as root with apt-get when missing (once per process). `Ok(None)`: ready;
/// `Ok(Some(reason))`: skip; `Err`: under `CI=true`, where a skip would
/// hide the tier.
pub fn containerd_unavailable() -> io::Result<Option<String>> {
    static CHECKED: OnceLock<Option<String>> = OnceLock::new();
    let missing = CHECKED.get_or_init(|| {
        let absent = missing_packages();
        if absent.is_empty() {
            return None;
        }
        if is_root() && which("apt-get").is_some() {
            eprintln!(
                "evictd-integration: installing {} with apt-get",
                absent.join(" ")
            );
            let quiet = |args: &[&str]| {
                let mut command = Command::new("apt-get");
                command
                    .args(args)
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .stdin(Stdio::null());
                run_bounded(&mut command, APT_DEADLINE)
            };
            let installed = quiet(&["update", "-qq"]).and_then(|()| {
                let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
                args.extend(absent.iter().map(String::as_str));
                quiet(&args)
            });
            if let Err(e) = installed {
                return Some(format!("apt-get could not install containerd: {e}"));
            }
        }
        let still = missing_packages();
        (!still.is_empty()).then(|| {
            format!(
                "the containerd tier needs Debian's {} (apt-get install {}; as root the tests install them)",
                still.join(", "),
                still.join(" ")
            )
        })
    });
    match missing {
        None => Ok(None),
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{reason}; CI must not skip the containerd tier"),
        )),
        Some(reason) => Ok(Some(reason.clone())),
    }
}

fn missing_packages() -> Vec<String> {
    let mut packages: Vec<String> = BINARIES
        .iter()
        .filter(|(binary, _)| which(binary).is_none())
        .map(|(_, package)| (*package).to_owned())
        .collect();
    packages.dedup();
    packages
}

/// A private containerd, its CRI client, and the pods it was asked to run.
pub struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    process: Option<Child>,
    runtime: tokio::runtime::Runtime,
    client: Option<RuntimeClient>,
    sandboxes: Vec<String>,
}

impl Containerd {
    /// Starts containerd and imports [`IMAGE`] built from `workload` (the
    /// `evictd-workload` binary). `Ok(None)` when the tier is skipped (the
    /// reason is printed).
    pub fn start(workload: &Path) -> io::Result<Option<Self>> {
        Self::start_with(workload, None)
    }

    /// [`start`](Self::start), with containerd's root (its images, and the
    /// containers' writable layers) on a filesystem of its own of
    /// `root_disk` bytes when given: an ext4 image loop-mounted at
    /// `<dir>/root`, unmounted with everything else on drop. A small disk
    /// the tests can fill, as a node's dedicated imagefs.
    pub fn start_with(workload: &Path, root_disk: Option<u64>) -> io::Result<Option<Self>> {
        if let Some(reason) = containerd_unavailable()? {
            eprintln!("evictd-integration: SKIPPING the containerd test: {reason}");
            return Ok(None);
        }
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "evictd-containerd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // From here on, drop cleans up whatever was started.
        let mut containerd = Self {
            socket: dir.join("containerd.sock"),
            dir,
            process: None,
            runtime,
            client: None,
            sandboxes: Vec::new(),
        };
        if let Some(bytes) = root_disk {
            containerd.mount_root_disk(bytes)?;
        }
        let config = containerd.dir.join("config.toml");
        fs::write(&config, containerd.config())?;
        let log = fs::File::create(containerd.dir.join("containerd.log"))?;
        containerd.process = Some(
            Command::new("containerd")
                .arg("--config")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        );
        containerd.connect()?;
        containerd.import_image(workload)?;
        Ok(Some(containerd))
    }

    /// `unix://<socket>`, for `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The private directory (root, state, logs of containerd).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs a CRI call (or any future) to completion within the call
    /// deadline, with a fresh client on the same connection.
    pub fn call<T, F>(&self, what: &str, call: impl FnOnce(RuntimeClient) -> F) -> io::Result<T>
    where
        F: Future<Output = Result<T, tonic::Status>>,
    {
        let client = self
            .client
            .clone()
            .ok_or_else(|| io::Error::other("containerd is not running"))?;
        let future = call(client);
        let bounded = async { tokio::time::timeout(scaled(CALL_DEADLINE), future).await };
        match self.runtime.block_on(bounded) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(status)) => Err(io::Error::other(format!("CRI {what}: {status}"))),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("CRI {what}: no answer within {:?}", scaled(CALL_DEADLINE)),
            )),
        }
    }

    /// Runs the agent's async client code against this containerd.
    pub fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    pub fn client(&self) -> io::Result<RuntimeClient> {
        self.client
            .clone()
            .ok_or_else(|| io::Error::other("containerd is not running"))
    }

    /// `RunPodSandbox`; the sandbox is removed on drop.
    pub fn run_pod_sandbox(&mut self, config: &PodSandboxConfig) -> io::Result<String> {
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let id = self.call("RunPodSandbox", |client| async move {
            Ok(client
                .runtime_service()
                .run_pod_sandbox(request)
                .await?
                .into_inner()
                .pod_sandbox_id)
        })?;
        self.sandboxes.push(id.clone());
        Ok(id)
    }

    /// `CreateContainer` and `StartContainer`; returns the container id.
    pub fn start_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> io::Result<String> {
        let request = CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let id = self.call("CreateContainer", |client| async move {
            Ok(client
                .runtime_service()
                .create_container(request)
                .await?
                .into_inner()
                .container_id)
        })?;
        let start = StartContainerRequest {
            container_id: id.clone(),
        };
        self.call("StartContainer", |client| async move {
            client.runtime_service().start_container(start).await
        })?;
        Ok(id)
    }

    pub fn container_status(&self, id: &str) -> io::Result<ContainerStatus> {
        let id = id.to_owned();
        self.call("ContainerStatus", |mut client| async move {
            client
                .container_status(&id)
                .await
                .map_err(|e| tonic::Status::unknown(e.to_string()))
        })
    }

    /// `StopPodSandbox`: every container in it is killed.
    pub fn stop_pod_sandbox(&self, id: &str) -> io::Result<()> {
        let stop = StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.call("StopPodSandbox", |client| async move {
            client.runtime_service().stop_pod_sandbox(stop).await
        })?;
        Ok(())
    }

    /// `StopPodSandbox` and `RemovePodSandbox` (every container in it).
    pub fn remove_pod_sandbox(&mut self, id: &str) -> io::Result<()> {
        self.stop_pod_sandbox(id)?;
        let remove = RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.call("RemovePodSandbox", |client| async move {
            client.runtime_service().remove_pod_sandbox(remove).await
        })?;
        self.sandboxes.retain(|s| s != id);
        Ok(())
    }

    /// `ctr images import` of an archive [`OciImage::write_archive`] wrote.
    pub fn import(&self, archive: &Path) -> io::Result<()> {
        let mut ctr = Command::new("ctr");
        ctr.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "overlayfs"])
            .arg(archive)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        run_bounded(&mut ctr, CALL_DEADLINE)
    }

    /// Everything gone: pods, containerd, shims, mounts, the directory.
    /// Idempotent; drop calls it.
    pub fn shutdown(&mut self) -> io::Result<()> {
        let mut first_error = None;
        for id in self.sandboxes.clone() {
            if let Err(e) = self.remove_pod_sandbox(&id) {
                first_error.get_or_insert(e);
            }
        }
        self.client = None;
        if let Some(mut process) = self.process.take()
            && let Err(e) = stop_child(&mut process, "containerd", STOP_DEADLINE)
        {
            first_error.get_or_insert(e);
        }
        // A shim outlives a killed containerd; ours serve our socket.
        for pid in processes_naming(&self.socket) {
            // Started by this test's containerd, found by its command line.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Err(e) = unmount_below(&self.dir) {
            first_error.get_or_insert(e);
        }
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                first_error.get_or_insert(io::Error::new(
                    e.kind(),
                    format!("removing {}: {e}", self.dir.display()),
                ));
            }
            _ => {}
        }
        first_error.map_or(Ok(()), Err)
    }

    /// containerd's root directory.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// An ext4 filesystem of `bytes` at [`root`](Self::root), with no
    /// blocks reserved for root (statvfs's available is all of its free
    /// space). `mount -o loop` sets the loop device to detach itself once
    /// the filesystem is unmounted.
    fn mount_root_disk(&self, bytes: u64) -> io::Result<()> {
        let image = self.dir.join("root.img");
        fs::File::create(&image)?.set_len(bytes)?;
        run_bounded(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0"])
                .arg(&image)
                .stdin(Stdio::null()),
            CALL_DEADLINE,
        )?;
        fs::create_dir(self.root())?;
        run_bounded(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(self.root())
                .stdin(Stdio::null()),
            CALL_DEADLINE,
        )
    }

    fn config(&self) -> String {
        let dir = self.dir.display();
        // cgroupfs driver (no systemd here); restrict_oom_score_adj: root
        // lacks CAP_SYS_RESOURCE on this machine, so the sandbox's -998
        // would fail; stats every second (containerd's default is 10 s) so
        // writable-layer usage follows writes promptly; the CRI streaming
        // server on a free loopback port; no CNI (host-network pods only).
        format!(
            r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{dir}/containerd.sock"
[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  stats_collect_period = 1
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dir}/cni/bin"
    conf_dir = "{dir}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{dir}/runc"
"#
        )
    }

    /// Waits until containerd answers CRI (its Version call).
    fn connect(&mut self) -> io::Result<()> {
        let endpoint = self.endpoint();
        let mut last_error = String::from("no attempt");
        let mut exited = None;
        let connected = wait_until(START_DEADLINE, "containerd to answer CRI", || {
            if let Some(process) = self.process.as_mut()
                && let Ok(Some(status)) = process.try_wait()
            {
                exited = Some(status);
                return true;
            }
            if !self.socket.exists() {
                return false;
            }
            match self.runtime.block_on(RuntimeClient::connect(&endpoint)) {
                Ok(client) => {
                    self.client = Some(client);
                    true
                }
                Err(e) => {
                    last_error = e.to_string();
                    false
                }
            }
        });
        let log = || {
            fs::read_to_string(self.dir.join("containerd.log"))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        };
        if let Some(status) = exited {
            return Err(io::Error::other(format!(
                "containerd exited ({status}); its log ends:\n{}",
                log()
            )));
        }
        connected.map_err(|timeout| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{timeout}: {last_error}; containerd's log ends:\n{}", log()),
            )
        })
    }

    fn import_image(&self, workload: &Path) -> io::Result<()> {
        let archive = self.dir.join("workload-image.tar");
        OciImage::new()
            .binary_with_libraries(workload, "evictd-workload")?
            .entrypoint(&["/evictd-workload"])
            .cmd(&["pause"])
            .write_archive(IMAGE, &archive)?;
        self.import(&archive)?;
        fs::remove_file(&archive)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!(
                "evictd-integration: cleaning up containerd in {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// Processes whose command line names `socket` (containerd's shims are
/// started with `-address <socket>`).
fn processes_naming(socket: &Path) -> Vec<i32> {
    let needle = socket.display().to_string();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != std::process::id() as i32)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                text.contains("containerd-shim") && text.contains(&needle)
            })
        })
        .collect()
}

/// Detaches every mount at or below `dir` (overlay root filesystems and
/// sandbox shm a killed containerd leaves), deepest first.
fn unmount_below(dir: &Path) -> io::Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|mount| mount.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for mount in mounts {
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| io::Error::other(format!("unmounting {}: {e}", mount.display())))?;
    }
    Ok(())
}

/// Runs `command` to success within `limit` (scaled), killing it past that.
fn run_bounded(command: &mut Command, limit: Duration) -> io::Result<()> {
    let mut child = command.spawn()?;
    let mut status = None;
    let finished = wait_until(limit, "a command to finish", || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if finished.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{command:?} did not finish within {:?}", scaled(limit)),
        ));
    }
    match status {
        Some(status) if status.success() => Ok(()),
        other => Err(io::Error::other(format!("{command:?} failed: {other:?}"))),
    }
}

fn which(binary: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Connects the test to a workload's socket: the accepted stream, within
/// the deadline (the container must start and connect).
pub(crate) fn accept_within(
    listener: &std::os::unix::net::UnixListener,
    deadline: Duration,
) -> io::Result<UnixStream> {
    listener.set_nonblocking(true)?;
    let mut accepted = None;
    let mut failure = None;
    wait_until(deadline, "the workload in the container to connect", || {
        match listener.accept() {
            Ok((stream, _)) => accepted = Some(stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) => failure = Some(e),
        }
        true
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    let stream = accepted.ok_or_else(|| io::Error::other("no connection"))?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}
