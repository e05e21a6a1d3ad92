//! evictd: a Kubernetes node agent that detects memory and PID pressure in
//! the kernel (eBPF on raw tracepoints) and keeps kubelet's eviction policy.
//!
//! # Layout
//!
//! The modules follow the data path, in the order a kernel record travels:
//!
//! * [`kernel`]: what the kernel offers (`capabilities`, `btf` offsets), the
//!   trigger chosen per resource and the [`kernel::triggers::Mode`] that
//!   chooses it (`triggers`), the eBPF programs (`bpf`: `hooks`, the scope
//!   `maps`, ring-buffer `events`, `charges`) and the push mechanisms that
//!   need no BPF (`notify`: PSI, cgroup v1 thresholds).
//! * [`scopes`]: the cgroups watched against thresholds: the `--watch`
//!   flags (`spec`), `levels` and bands, the pure `registry` of them all,
//!   the `tripwires` the engine has the kernel watch, the `zone` where the
//!   precise hooks run, and the `monitor` shell that reads, arms and
//!   reports them.
//! * [`node`]: the node as cgroupfs shows it: `cgroupfs` mounts and reads,
//!   the node's `stats` (one [`node::stats::NodeObservation`] per wake-up),
//!   the pods' `inventory` (taking [`node::inventory::InventoryOptions`]),
//!   their `containers`, `pod_metadata`, `forks`, `stalls`,
//!   `container_pressure` and `cold_cache`, and the container `runtime`
//!   through CRI (kubelet's disk side and its local-storage rules).
//! * [`decide`]: kubelet's policy, pure: the `snapshot` types it decides on
//!   and Kubernetes' arithmetic on a pod's `resources` (its requests and QoS
//!   class), `thresholds`, the `engine` (thresholds met, grace periods, node
//!   conditions, victims), the disk `layout`, `rank`, the kill `reason`,
//!   `thrashing` and `memory_high` (KEP-5986).
//! * [`act`]: the `evictor` loop (one observation per `act::wake::Wake`,
//!   a decision, its execution, an `act::evictor::Action`), its seams
//!   (`io`), its `timer`, the `pre_kill` hook and the `kill` of a pod.
//! * [`report`]: the metrics `endpoint`, the `decisions` records, what the
//!   kernel side saw (`kernel_side`: OOM victims, counters), and
//!   `kubernetes` (pod metadata in, eviction reports out, taking
//!   `report::kubernetes::KubernetesOptions`).
//! * [`run`]: the entry points: the `daemon` (startup, then a `serve` loop
//!   that turns each wake-up into one evictor pass), the `precise` hooks'
//!   I/O shell, `simulate` and the `seccomp` profile.
//!
//! [`config`] parses the command line and kubelet's configuration (`kubelet`)
//! and builds the plain options the stages take; [`metrics`] are the
//! Prometheus metrics every stage counts in; [`quantity`] and [`duration`]
//! are Kubernetes' units; [`logs`] writes amounts in the text logs as
//! quantities; [`state`] is the `--state-dir` that outlives a restart;
//! `testing` holds the unit tests' fakes and log capture.
//!
//! # Imports
//!
//! Imports only go down: [`run`] and [`config`] on top (the only modules
//! that know clap; `run` uses `config`), then [`act`], [`scopes`],
//! [`report`], [`kernel`], [`node`], and [`decide`] at the bottom, which
//! imports nothing but the units. [`metrics`] and [`state`] import no
//! other module; [`logs`] only the units and `decide`'s threshold values.
pub mod act;
pub mod config;
pub mod decide;
pub mod duration;
pub mod kernel;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod quantity;
pub mod report;
pub mod run;
pub mod scopes;
pub mod state;
#[cfg(test)]
mod testing;
