//! A node whose pods containerd runs, made as kubelet makes them: for each
//! pod the harness creates the pod-level cgroup under the QoS parent
//! (`kubepods/[burstable/|besteffort/]pod<uid>`, with the pod's memory
//! limit where every container has one), then asks CRI for a sandbox with
//! that `cgroup_parent` (host network, no hostname, a PID namespace per
//! container, kubelet's labels, logs under
//! `<logs>/<namespace>_<name>_<uid>/<container>/0.log`) and a container
//! with the resources kubelet would set (memory limit, CPU shares and
//! quota, OOM score by QoS class). containerd and runc make the container
//! cgroups (`.../pod<uid>/<64-hex id>`) and everything below; evictd gets
//! no test-made layout beyond what kubelet itself makes.
//!
//! Each container runs `evictd-workload connect /control/workload.sock`:
//! the test listens on that socket (a host directory bind-mounted into the
//! container) and steers the workload as the cgroup-only tests do. Each pod
//! also has an emptyDir volume, `scratch`, where kubelet keeps one
//! (`<kubelet>/pods/<uid>/volumes/kubernetes.io~empty-dir/scratch`),
//! bind-mounted at `/scratch` as kubelet mounts it.
//!
//! Dropping the node removes the pods through CRI, then their cgroups in
//! every hierarchy (runc created them in all of them, kubelet removes the
//! pod-level ones), then containerd and the private cgroup tree.
use std::{
    fs, io,
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    time::Duration,
};

use evictd::decide::snapshot::{PodSnapshot, QosClass};
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, ImageSpec,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata,
};
use serde_json::Value;

use crate::{
    Agent, PodSpec, PrivateCgroupTree, WorkloadChannel,
    containerd::{Containerd, IMAGE, accept_within},
    sandbox::oom_score_adj,
    wait::wait_until,
};

/// The container name every pod's single container has.
pub const CONTAINER: &str = "main";
/// The emptyDir volume every pod has, and where its container sees it.
pub const SCRATCH_VOLUME: &str = "scratch";
pub const SCRATCH_PATH: &str = "/scratch";
/// How long a pod's container may take to start and connect.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long CRI may take to report a killed container exited.
const EXIT_DEADLINE: Duration = Duration::from_secs(30);
/// kubelet's CPU period (`cpu.cfs_period_us`).
const CPU_PERIOD: i64 = 100_000;

/// One pod containerd runs.
pub struct CriPod {
    pub spec: PodSpec,
    pub sandbox_id: String,
    pub container_id: String,
    /// The pod cgroup relative to the private tree (`node/kubepods/...`).
    pub cgroup: String,
    channel: WorkloadChannel,
}

impl CriPod {
    /// The container's cgroup relative to the private tree, as runc made it.
    pub fn container_cgroup(&self) -> String {
        format!("{}/{}", self.cgroup, self.container_id)
    }
}

pub struct CriNode {
    // Declared first: the sockets close before the pods are removed.
    pods: Vec<CriPod>,
    pub containerd: Containerd,
    pub tree: PrivateCgroupTree,
    dir: PathBuf,
    metadata_file: PathBuf,
    memory_limit: u64,
}

impl CriNode {
    /// Starts containerd (`Ok(None)`: the tier is skipped) and runs `pods`
    /// on a node of `memory_limit` bytes. `workload` is the
    /// `evictd-workload` binary.
    pub fn new(pods: Vec<PodSpec>, memory_limit: u64, workload: &Path) -> io::Result<Option<Self>> {
        Self::new_with(pods, memory_limit, workload, None)
    }

    /// [`new`](Self::new), with containerd's root on a filesystem of
    /// `root_disk` bytes ([`Containerd::start_with`]): the node's imagefs,
    /// apart from its nodefs.
    pub fn new_with(
        pods: Vec<PodSpec>,
        memory_limit: u64,
        workload: &Path,
        root_disk: Option<u64>,
    ) -> io::Result<Option<Self>> {
        let tree = PrivateCgroupTree::new()?;
        tree.create("node/kubepods/burstable")?;
        tree.create("node/kubepods/besteffort")?;
        tree.set_memory_limit("node", memory_limit)?;
        let Some(containerd) = Containerd::start_with(workload, root_disk)? else {
            return Ok(None);
        };
        let dir = containerd.dir().join("node");
        fs::create_dir_all(dir.join("logs"))?;
        let metadata_file = dir.join("pods.json");
        let metadata: Vec<&Value> = pods.iter().map(|p| &p.metadata).collect();
        fs::write(&metadata_file, serde_json::to_vec(&metadata)?)?;
        let mut node = Self {
            pods: Vec::new(),
            containerd,
            tree,
            dir,
            metadata_file,
            memory_limit,
        };
        for spec in pods {
            let pod = node.run_pod(spec)?;
            node.pods.push(pod);
        }
        Ok(Some(node))
    }

    /// The node cgroup relative to the hierarchy root (--node-cgroup).
    pub fn node_cgroup(&self) -> String {
        self.tree.relative_path("node")
    }

    /// Agent arguments for this node: its cgroup, the pods' metadata, no
    /// disk signals.
    pub fn agent_args(&self) -> Vec<String> {
        [
            "--node-cgroup",
            &self.node_cgroup(),
            "--pod-metadata",
            &self.metadata_file.display().to_string(),
            "--nodefs-path",
            "/nonexistent",
            "--imagefs-path",
            "/nonexistent",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Agent arguments for this node with its container runtime: the
    /// runtime's endpoint, kubelet's root as nodefs; the imagefs and
    /// containerfs are what the runtime names.
    pub fn runtime_agent_args(&self) -> Vec<String> {
        let mut args = self.runtime_args();
        args.extend([
            "--pod-metadata".to_owned(),
            self.metadata_file.display().to_string(),
        ]);
        args
    }

    /// [`runtime_agent_args`](Self::runtime_agent_args) with the pods'
    /// metadata from the Kubernetes API at `kubeconfig`, for node
    /// `node_name`, instead of the file.
    pub fn runtime_api_agent_args(&self, node_name: &str, kubeconfig: &Path) -> Vec<String> {
        let mut args = self.runtime_args();
        args.extend([
            "--node-name".to_owned(),
            node_name.to_owned(),
            "--kubeconfig".to_owned(),
            kubeconfig.display().to_string(),
        ]);
        args.extend(self.state_args());
        args
    }

    /// The agent's --state-dir, this node's own (where it keeps when it
    /// first saw each image), never the machine's.
    pub fn state_args(&self) -> Vec<String> {
        vec![
            "--state-dir".to_owned(),
            self.state_dir().display().to_string(),
        ]
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn runtime_args(&self) -> Vec<String> {
        [
            "--node-cgroup",
            &self.node_cgroup(),
            "--nodefs-path",
            &self.kubelet_dir().display().to_string(),
            "--imagefs-path",
            "/nonexistent",
            "--container-runtime-endpoint",
            &self.containerd.endpoint(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The agent with [`runtime_agent_args`](Self::runtime_agent_args) and
    /// `extra`.
    pub fn start_agent_with_runtime(&self, extra: &[&str]) -> io::Result<Agent> {
        let mut args = self.runtime_agent_args();
        args.extend(self.state_args());
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Agent::start(&args)
    }

    /// The bytes pod `name`'s container's writable layer holds, as the
    /// runtime reports it (`ListContainerStats`); 0 before it has measured.
    pub fn writable_layer_bytes(&self, name: &str) -> io::Result<u64> {
        let id = self.pod(name)?.container_id.clone();
        let stats = self
            .containerd
            .call("ListContainerStats", |mut client| async move {
                client
                    .list_container_stats()
                    .await
                    .map_err(|e| tonic::Status::unknown(e.to_string()))
            })?;
        Ok(stats
            .into_iter()
            .filter(|s| s.attributes.as_ref().is_some_and(|a| a.id == id))
            .filter_map(|s| Some(s.writable_layer?.used_bytes?.value))
            .next()
            .unwrap_or(0))
    }

    /// kubelet's root directory on this node (what `--nodefs-path` names).
    pub fn kubelet_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    /// kubelet's pods directory (`<root>/pods`), with the pods' volumes.
    pub fn pods_dir(&self) -> PathBuf {
        self.kubelet_dir().join("pods")
    }

    /// Pod `name`'s `scratch` emptyDir on the host.
    pub fn scratch_dir(&self, name: &str) -> io::Result<PathBuf> {
        Ok(self
            .pods_dir()
            .join(&self.pod(name)?.spec.uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(SCRATCH_VOLUME))
    }

    /// `StopPodSandbox` of pod `name`: its containers are killed and exit,
    /// the sandbox stays (not ready) until the node is dropped.
    pub fn stop_pod(&mut self, name: &str) -> io::Result<()> {
        let id = self.pod(name)?.sandbox_id.clone();
        self.containerd.stop_pod_sandbox(&id)
    }

    pub fn start_agent(&self, extra: &[&str]) -> io::Result<Agent> {
        let mut args = self.agent_args();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Agent::start(&args)
    }

    pub fn pod(&self, name: &str) -> io::Result<&CriPod> {
        self.pods
            .iter()
            .find(|p| p.spec.name == name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no pod {name}")))
    }

    /// The command channel to pod `name`'s workload.
    pub fn workload(&mut self, name: &str) -> io::Result<&mut WorkloadChannel> {
        self.pods
            .iter_mut()
            .find(|p| p.spec.name == name)
            .map(|p| &mut p.channel)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no pod {name}")))
    }

    /// Makes each named pod's workload hold that many bytes more.
    pub fn alloc(&mut self, pods: &[(&str, u64)]) -> io::Result<()> {
        for (name, bytes) in pods {
            self.workload(name)?.alloc(*bytes)?;
        }
        Ok(())
    }

    /// CRI's status of pod `name`'s container.
    pub fn status(&self, name: &str) -> io::Result<ContainerStatus> {
        self.containerd
            .container_status(&self.pod(name)?.container_id)
    }

    /// Waits until CRI reports pod `name`'s container exited; its status.
    pub fn wait_exited(&self, name: &str) -> io::Result<ContainerStatus> {
        let mut status = Err(io::Error::other("not asked"));
        let exited = wait_until(EXIT_DEADLINE, "CRI to report the container exited", || {
            status = self.status(name);
            status
                .as_ref()
                .is_ok_and(|s| s.state == ContainerState::ContainerExited as i32)
        });
        let status = status?;
        exited.map_err(|e| io::Error::other(format!("{e}: last status {status:?}")))?;
        Ok(status)
    }

    /// Whether pod `name` runs: CRI says its container runs and its
    /// workload answers.
    pub fn alive(&mut self, name: &str) -> bool {
        let running = self
            .status(name)
            .is_ok_and(|s| s.state == ContainerState::ContainerRunning as i32);
        running && self.workload(name).and_then(|w| w.reported_pid()).is_ok()
    }

    /// Kernel OOM kills in pod `name`'s container cgroup (v1: that cgroup's
    /// own victims; v2: with its descendants).
    pub fn oom_kills(&self, name: &str) -> io::Result<u64> {
        self.tree
            .oom_kill_count(&self.pod(name)?.container_cgroup())
    }

    fn run_pod(&mut self, spec: PodSpec) -> io::Result<CriPod> {
        let snapshot: PodSnapshot = serde_json::from_value(spec.metadata.clone())?;
        let qos_dir = match snapshot.qos_class() {
            QosClass::Guaranteed => "",
            QosClass::Burstable => "burstable/",
            QosClass::BestEffort => "besteffort/",
        };
        let cgroup = format!("node/kubepods/{qos_dir}pod{}", spec.uid);
        self.tree.create(&cgroup)?;
        // kubelet limits a pod's cgroup when every container has a limit.
        let limits: Option<Vec<i64>> = snapshot
            .containers
            .iter()
            .map(|c| c.limits.get("memory").map(|q| q.value()))
            .collect();
        if let Some(limits) = limits.filter(|l| !l.is_empty()) {
            let total: i64 = limits.iter().sum();
            self.tree
                .set_memory_limit(&cgroup, u64::try_from(total).map_err(io::Error::other)?)?;
        }
        let control = self.dir.join("control").join(&spec.name);
        fs::create_dir_all(&control)?;
        let scratch = self
            .pods_dir()
            .join(&spec.uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(SCRATCH_VOLUME);
        fs::create_dir_all(&scratch)?;
        let listener = UnixListener::bind(control.join("workload.sock"))?;
        let sandbox_config = self.sandbox_config(&spec, &self.tree.relative_path(&cgroup));
        let sandbox_id = self.containerd.run_pod_sandbox(&sandbox_config)?;
        let container_config = self.container_config(&spec, &snapshot, &control, &scratch);
        let container_id =
            self.containerd
                .start_container(&sandbox_id, &container_config, &sandbox_config)?;
        let stream = accept_within(&listener, START_DEADLINE)?;
        let mut channel =
            WorkloadChannel::new(format!("pod {}", spec.name), stream.try_clone()?, stream);
        // One round trip: the workload runs its command loop.
        channel.reported_pid()?;
        Ok(CriPod {
            spec,
            sandbox_id,
            container_id,
            cgroup,
            channel,
        })
    }

    fn sandbox_config(&self, spec: &PodSpec, cgroup_parent: &str) -> PodSandboxConfig {
        let namespaces = namespace_options();
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.to_owned(),
                uid: spec.uid.to_owned(),
                namespace: "default".to_owned(),
                attempt: 0,
            }),
            // Host network: kubelet sets no hostname.
            hostname: String::new(),
            log_directory: self
                .dir
                .join("logs")
                .join(format!("default_{}_{}", spec.name, spec.uid))
                .display()
                .to_string(),
            labels: pod_labels(spec),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_owned(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        }
    }

    fn container_config(
        &self,
        spec: &PodSpec,
        snapshot: &PodSnapshot,
        control: &Path,
        scratch: &Path,
    ) -> ContainerConfig {
        let mut labels = pod_labels(spec);
        labels.insert(
            "io.kubernetes.container.name".to_owned(),
            CONTAINER.to_owned(),
        );
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: CONTAINER.to_owned(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: IMAGE.to_owned(),
                ..ImageSpec::default()
            }),
            args: vec!["connect".to_owned(), "/control/workload.sock".to_owned()],
            mounts: vec![
                Mount {
                    container_path: "/control".to_owned(),
                    host_path: control.display().to_string(),
                    ..Mount::default()
                },
                Mount {
                    container_path: SCRATCH_PATH.to_owned(),
                    host_path: scratch.display().to_string(),
                    ..Mount::default()
                },
            ],
            labels,
            log_path: format!("{CONTAINER}/0.log"),
            linux: Some(LinuxContainerConfig {
                resources: Some(self.resources(snapshot)),
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: Some(namespace_options()),
                    ..LinuxContainerSecurityContext::default()
                }),
            }),
            ..ContainerConfig::default()
        }
    }

    /// What kubelet asks the runtime to set (kuberuntime_container_linux.go):
    /// CPU shares from the request (2 at least), quota from the limit,
    /// the memory limit, and the OOM score adjustment of the QoS class.
    fn resources(&self, snapshot: &PodSnapshot) -> LinuxContainerResources {
        let container = snapshot.containers.first();
        let find = |limits: bool, name: &str| {
            container
                .and_then(|c| if limits { &c.limits } else { &c.requests }.get(name))
                .copied()
        };
        let cpu_limit = find(true, "cpu").map(|q| q.milli_value());
        let cpu_request = find(false, "cpu").map(|q| q.milli_value()).or(cpu_limit);
        let memory_limit = find(true, "memory").map_or(0, |q| q.value());
        let oom_score_adj = oom_score_adj(snapshot, self.memory_limit);
        LinuxContainerResources {
            cpu_period: if cpu_limit.is_some() { CPU_PERIOD } else { 0 },
            cpu_quota: cpu_limit.map_or(0, |milli| (milli * CPU_PERIOD / 1000).max(1000)),
            cpu_shares: cpu_request.map_or(2, |milli| (milli * 1024 / 1000).max(2)),
            memory_limit_in_bytes: memory_limit,
            oom_score_adj,
            ..LinuxContainerResources::default()
        }
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        self.pods.clear();
        if let Err(e) = self.containerd.shutdown() {
            eprintln!("evictd-integration: stopping containerd: {e}");
        }
        // Whatever still runs in the tree dies here.
        if let Err(e) = self.tree.remove("") {
            eprintln!("evictd-integration: removing the cgroup tree: {e}");
        }
        // runc made the pods' cgroups in every hierarchy, the private
        // tree has its own only in memory, pids and freezer.
        if let Err(e) = remove_in_every_hierarchy(self.tree.name()) {
            eprintln!("evictd-integration: removing the pods' cgroups: {e}");
        }
    }
}

/// Host network (no CNI here), a PID namespace per container (kubelet's
/// default without `shareProcessNamespace`), IPC per pod.
fn namespace_options() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..NamespaceOption::default()
    }
}

/// kubelet's labels on sandboxes (and containers, which add their name).
fn pod_labels(spec: &PodSpec) -> std::collections::HashMap<String, String> {
    [
        ("io.kubernetes.pod.name", spec.name.as_str()),
        ("io.kubernetes.pod.namespace", "default"),
        ("io.kubernetes.pod.uid", spec.uid.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Removes `<mount>/<root>` and everything below it in every mounted cgroup
/// hierarchy, children first. Only empty cgroups can go: the pods' tasks
/// must be gone already.
fn remove_in_every_hierarchy(root: &str) -> io::Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let mut first_error = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split(' ').next().unwrap_or_default();
        let Some(mount) = left.split(' ').nth(4) else {
            continue;
        };
        if (fstype == "cgroup" || fstype == "cgroup2")
            && let Err(e) = remove_empty_tree(&Path::new(mount).join(root))
        {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn remove_empty_tree(dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type()?.is_dir() {
            remove_empty_tree(&entry.path())?;
        }
    }
    let mut outcome = Ok(());
    // rmdir can briefly fail with EBUSY right after the last task left.
    let _ = wait_until(Duration::from_secs(5), "rmdir", || {
        outcome = match fs::remove_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        !matches!(&outcome, Err(e) if e.kind() == io::ErrorKind::ResourceBusy)
    });
    outcome.map_err(|e| io::Error::new(e.kind(), format!("removing {}: {e}", dir.display())))
}
