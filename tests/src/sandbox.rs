//! A Kubernetes node inside this machine: a node cgroup with a memory limit
//! (its capacity), pod cgroups laid out as kubelet lays them out, one real
//! process per pod, and the --pod-metadata file that names them. Used by the
//! eviction scenarios and `cargo xtask demo`; everything goes on drop.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use evictd::decide::snapshot::{PodSnapshot, QosClass};

use crate::{Agent, KUBEPODS, PrivateCgroupTree, Workload};

/// One pod of the sandbox node with a single container.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub uid: String,
    /// Container cgroup relative to the node cgroup.
    pub container: String,
    /// The pod in the snapshot schema (--pod-metadata).
    pub metadata: Value,
}

impl PodSpec {
    /// `resources`: the container's `requests`/`limits` object.
    pub fn new(
        name: impl Into<String>,
        uid: impl Into<String>,
        container: String,
        priority: i32,
        resources: Value,
    ) -> Self {
        let (name, uid) = (name.into(), uid.into());
        let mut container_spec = json!({"name": "main"});
        if let Value::Object(fields) = resources {
            for (key, value) in fields {
                container_spec[key] = value;
            }
        }
        let metadata = json!({
            "namespace": "default", "name": name, "uid": uid,
            "priority": priority, "containers": [container_spec],
        });
        Self {
            name,
            uid,
            container,
            metadata,
        }
    }
}

/// cgroupfs driver: `kubepods/[burstable/|besteffort/]pod<uid>/<container>`;
/// `qos_dir` is "", "burstable/" or "besteffort/".
pub fn cgroupfs_path(qos_dir: &str, uid: &str) -> String {
    format!("kubepods/{qos_dir}pod{uid}/ctr")
}

/// systemd driver: `kubepods.slice/kubepods-<qos>.slice/
/// kubepods-<qos>-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`;
/// `qos` None is Guaranteed (no QoS slice).
pub fn systemd_path(qos: Option<&str>, uid: &str) -> String {
    let uid = uid.replace('-', "_");
    match qos {
        Some(qos) => format!(
            "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/cri-containerd-1.scope"
        ),
        None => format!("kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-1.scope"),
    }
}

/// What the eviction scenarios give [`memory_pods`] but hog: db and web
/// below their requests, batch above its own but of priority 100,
/// node-exporter critical; so kubelet's ranking takes hog once it grows.
pub const MEMORY_PODS_HELD: [(&str, u64); 4] = [
    ("db", 48 << 20),
    ("web", 32 << 20),
    ("batch", 48 << 20),
    ("node-exporter", 24 << 20),
];

/// Pods of every QoS class and several priorities, cgroupfs driver:
/// db (Guaranteed, 128Mi, priority 1000), web (Burstable, requests 64Mi),
/// batch (Burstable, requests 16Mi, priority 100), node-exporter
/// (BestEffort, system-critical priority) and hog (BestEffort, priority 0).
/// Under memory pressure kubelet's ranking puts hog first once it uses
/// more than the others.
pub fn memory_pods() -> Vec<PodSpec> {
    let guaranteed = "00000000-0000-4000-8000-00000000000a";
    let web = "00000000-0000-4000-8000-00000000000b";
    let batch = "00000000-0000-4000-8000-00000000000c";
    let exporter = "00000000-0000-4000-8000-00000000000d";
    let hog = "00000000-0000-4000-8000-00000000000e";
    vec![
        PodSpec::new(
            "db",
            guaranteed,
            cgroupfs_path("", guaranteed),
            1000,
            json!({"requests": {"cpu": "100m", "memory": "128Mi"},
                   "limits": {"cpu": "100m", "memory": "128Mi"}}),
        ),
        PodSpec::new(
            "web",
            web,
            cgroupfs_path("burstable/", web),
            0,
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}}),
        ),
        PodSpec::new(
            "batch",
            batch,
            cgroupfs_path("burstable/", batch),
            100,
            json!({"requests": {"memory": "16Mi"}}),
        ),
        PodSpec::new(
            "node-exporter",
            exporter,
            cgroupfs_path("besteffort/", exporter),
            2_000_001_000,
            json!({}),
        ),
        PodSpec::new("hog", hog, cgroupfs_path("besteffort/", hog), 0, json!({})),
    ]
}

/// `count` small pods to stand beside [`memory_pods`] on a node with many
/// pods, cgroupfs driver: `quiet-1`, `quiet-2`, ... in turn Guaranteed
/// (16Mi), Burstable (requests 8Mi) and BestEffort, priorities 0 to 90.
/// Under memory pressure each ranks after a hog that holds more than they
/// do.
pub fn quiet_pods(count: usize) -> Vec<PodSpec> {
    (1..=count)
        .map(|n| {
            let uid = format!("00000000-0000-4000-8001-{n:012x}");
            let priority = (n % 10) as i32 * 10;
            let (qos_dir, resources) = match n % 3 {
                0 => (
                    "",
                    json!({"requests": {"cpu": "10m", "memory": "16Mi"},
                           "limits": {"cpu": "10m", "memory": "16Mi"}}),
                ),
                1 => ("burstable/", json!({"requests": {"memory": "8Mi"}})),
                _ => ("besteffort/", json!({})),
            };
            let container = cgroupfs_path(qos_dir, &uid);
            PodSpec::new(format!("quiet-{n}"), uid, container, priority, resources)
        })
        .collect()
}

const MIB: u64 = 1 << 20;

/// The machine's memory in bytes: sysinfo's total RAM, which is
/// /proc/meminfo's `MemTotal`.
pub fn machine_memory() -> io::Result<u64> {
    Ok(nix::sys::sysinfo::sysinfo()?.ram_total())
}

/// What the steady pods of [`memory_pods`] hold in `cargo xtask demo` and
/// `cargo xtask bench` (232 MiB): all but the hog.
pub const STEADY_POD_MEMORY: [(&str, u64); 4] = [
    ("db", 96 * MIB),
    ("web", 48 * MIB),
    ("batch", 64 * MIB),
    ("node-exporter", 24 * MIB),
];

/// kubelet's OOM score adjustment of a pod's containers on a node of
/// `capacity` bytes (pkg/kubelet/qos `GetContainerOOMScoreAdjust`):
/// Guaranteed −997, BestEffort 1000, Burstable 1000 − 1000 × its memory
/// request / capacity, kept within 2 … 999.
pub fn oom_score_adj(snapshot: &PodSnapshot, capacity: u64) -> i64 {
    let capacity = i64::try_from(capacity).unwrap_or(i64::MAX).max(1);
    match snapshot.qos_class() {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let request = snapshot
                .containers
                .iter()
                .filter_map(|c| c.requests.get("memory").or_else(|| c.limits.get("memory")))
                .map(|q| q.value())
                .sum::<i64>();
            (1000 - 1000 * request / capacity).clamp(2, 999)
        }
    }
}

/// Sets process `pid`'s `/proc/<pid>/oom_score_adj`.
pub fn set_oom_score_adj(pid: u32, adj: i64) -> io::Result<()> {
    fs::write(format!("/proc/{pid}/oom_score_adj"), adj.to_string())
}

/// The node: cgroups for every pod, a process in each, the metadata file.
pub struct SandboxNode {
    // Declared first so the processes die before their cgroups go.
    workloads: Vec<(String, Workload)>,
    pub tree: PrivateCgroupTree,
    pub pods: Vec<PodSpec>,
    /// The node is the machine's root (`--node-cgroup /`, the tree is its
    /// `kubepods`), not a cgroup with a limit.
    on_root: bool,
    metadata_file: PathBuf,
    /// The agent's --state-dir: private to this node, kept across agent
    /// restarts, removed with the node.
    state_dir: PathBuf,
}

impl SandboxNode {
    /// `memory_limit` is the node's capacity; `workload_binary` the
    /// evictd-workload executable each pod runs.
    pub fn new(pods: Vec<PodSpec>, memory_limit: u64, workload_binary: &str) -> io::Result<Self> {
        let tree = PrivateCgroupTree::new()?;
        tree.create("node")?;
        tree.set_memory_limit("node", memory_limit)?;
        Self::populated(tree, false, pods, workload_binary)
    }

    /// The node as it is on a real one: the machine's root, its pods in a
    /// `kubepods` cgroup at the hierarchy root (kubelet's cgroupfs driver),
    /// each pod's process with the OOM score adjustment kubelet gives its
    /// QoS class, so the kernel's global OOM killer chooses as on a node.
    /// For a throwaway machine only (see
    /// [`PrivateCgroupTree::kubepods_at_root`]).
    pub fn on_root(pods: Vec<PodSpec>, workload_binary: &str) -> io::Result<Self> {
        let tree = PrivateCgroupTree::kubepods_at_root()?;
        let mut node = Self::populated(tree, true, pods, workload_binary)?;
        let capacity = machine_memory()?;
        for pod in node.pods.clone() {
            let snapshot: PodSnapshot = serde_json::from_value(pod.metadata.clone())?;
            let pid = node.workload(&pod.name)?.pid();
            set_oom_score_adj(pid, oom_score_adj(&snapshot, capacity))?;
        }
        Ok(node)
    }

    fn populated(
        tree: PrivateCgroupTree,
        on_root: bool,
        pods: Vec<PodSpec>,
        workload_binary: &str,
    ) -> io::Result<Self> {
        let metadata: Vec<&Value> = pods.iter().map(|p| &p.metadata).collect();
        let metadata_file = std::env::temp_dir().join(format!("evictd-pods-{}.json", tree.name()));
        let state_dir = std::env::temp_dir().join(format!("evictd-state-{}", tree.name()));
        fs::write(&metadata_file, serde_json::to_vec(&metadata)?)?;
        let mut node = Self {
            tree,
            pods,
            on_root,
            metadata_file,
            state_dir,
            workloads: Vec::new(),
        };
        for pod in node.pods.clone() {
            let rel = node.pod_cgroup(&pod);
            node.tree.create(&rel)?;
            let workload = Workload::spawn_in(&node.tree, &rel, workload_binary)?;
            node.workloads.push((pod.name.clone(), workload));
        }
        Ok(node)
    }

    /// A pod's container cgroup relative to the tree.
    fn pod_cgroup(&self, pod: &PodSpec) -> String {
        match self.on_root {
            // The tree is the root's kubepods.
            true => pod
                .container
                .strip_prefix(&format!("{KUBEPODS}/"))
                .unwrap_or(&pod.container)
                .to_owned(),
            false => format!("node/{}", pod.container),
        }
    }

    /// Whether the node is the machine's root ([`SandboxNode::on_root`]).
    pub fn is_root(&self) -> bool {
        self.on_root
    }

    /// The node cgroup relative to the hierarchy root (--node-cgroup).
    pub fn node_cgroup(&self) -> String {
        match self.on_root {
            true => "/".to_owned(),
            false => self.tree.relative_path("node"),
        }
    }

    /// The process of pod `name`.
    pub fn workload(&mut self, name: &str) -> io::Result<&mut Workload> {
        self.workloads
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, w)| w)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no pod {name}")))
    }

    /// Agent arguments that make it protect this node (and nothing else:
    /// the disk signals point nowhere), pod metadata from the file.
    pub fn agent_args(&self) -> Vec<String> {
        let mut args = self.node_args();
        args.extend([
            "--pod-metadata".into(),
            self.metadata_file.display().to_string(),
        ]);
        args
    }

    /// The same, with pod metadata from a Kubernetes API server instead:
    /// this node is `node_name` there.
    pub fn api_agent_args(&self, node_name: &str, kubeconfig: &Path) -> Vec<String> {
        let mut args = self.node_args();
        args.extend([
            "--node-name".into(),
            node_name.into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--state-dir".into(),
            self.state_dir.display().to_string(),
        ]);
        args
    }

    /// The agent's --state-dir (with [`Self::api_agent_args`]).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn node_args(&self) -> Vec<String> {
        vec![
            "--node-cgroup".into(),
            self.node_cgroup(),
            "--nodefs-path".into(),
            "/nonexistent".into(),
            "--imagefs-path".into(),
            "/nonexistent".into(),
        ]
    }

    /// Makes each named pod's process hold that many bytes more.
    pub fn alloc(&mut self, pods: &[(&str, u64)]) -> io::Result<()> {
        for (name, bytes) in pods {
            self.workload(name)?.alloc(*bytes)?;
        }
        Ok(())
    }

    /// Grows pod `name` by `step` bytes at a time until an allocation fails
    /// (something stopped its process); returns what it held by then. An
    /// error if it reaches `limit` (the node's capacity) unstopped.
    pub fn grow_until_stopped(&mut self, name: &str, step: u64, limit: u64) -> io::Result<u64> {
        self.workload(name)?.grow_until_stopped(step, limit)
    }

    /// As [`Self::grow_until_stopped`], at `rate` bytes/s.
    pub fn grow_until_stopped_at(
        &mut self,
        name: &str,
        step: u64,
        limit: u64,
        rate: u64,
    ) -> io::Result<u64> {
        self.workload(name)?
            .grow_until_stopped_at(step, limit, rate)
    }

    /// Starts the agent on this node with `extra` arguments.
    pub fn start_agent(&self, extra: &[&str]) -> io::Result<Agent> {
        let mut args = self.agent_args();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Agent::start(&args)
    }

    /// As [`Self::start_agent`], but as the DaemonSet runs the agent: its
    /// capabilities, its seccomp profile (applied by `seccomp_launcher`)
    /// and the cgroup filesystem read-only but the pods'.
    pub fn start_confined_agent(
        &self,
        seccomp_launcher: &Path,
        extra: &[&str],
    ) -> io::Result<Agent> {
        let mut args = self.agent_args();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        crate::confined_agent(
            seccomp_launcher,
            &self.node_cgroup(),
            &self.tree.dir(crate::Controller::Memory, "node"),
            &args,
        )
    }

    /// Kernel OOM kills in every pod's container cgroup.
    pub fn oom_kills(&self) -> io::Result<u64> {
        self.pods
            .iter()
            .map(|p| self.tree.oom_kill_count(&self.pod_cgroup(p)))
            .sum()
    }

    /// Whether pod `name`'s process still runs (it answers a command).
    pub fn alive(&mut self, name: &str) -> bool {
        self.workload(name).and_then(|w| w.reported_pid()).is_ok()
    }
}

impl Drop for SandboxNode {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.metadata_file);
        let _ = fs::remove_dir_all(&self.state_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_get_kubelets_oom_score_adjustment_of_their_qos_class() {
        let capacity = 2 << 30;
        let adj = |pod: &PodSpec| {
            let snapshot: PodSnapshot = serde_json::from_value(pod.metadata.clone()).unwrap();
            oom_score_adj(&snapshot, capacity)
        };
        let pods = memory_pods();
        let of = |name: &str| adj(pods.iter().find(|p| p.name == name).unwrap());
        assert_eq!(of("db"), -997);
        assert_eq!(of("hog"), 1000);
        // Burstable: 1000 − 1000 × 64 MiB / 2 GiB.
        assert_eq!(of("web"), 969);
        assert_eq!(of("batch"), 993);
    }
}
