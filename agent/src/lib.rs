//! evictd: a Kubernetes node agent that detects memory and PID pressure in
//! the kernel (eBPF on raw tracepoints) and keeps kubelet's eviction policy.
//!
//! # Layout
//!
//! The modules follow the data path, in the order a kernel record travels:
//!
//! * [`kernel`]: what the kernel offers (`capabilities`, `btf` offsets), the
//!   trigger chosen per resource (`triggers`), the eBPF programs (`bpf`:
//!   `hooks`, the scope `maps`, ring-buffer `events`) and the push
//!   mechanisms that need no BPF (`notify`: PSI, cgroup v1 thresholds).
//! * [`scopes`]: the cgroups watched against thresholds: the `--watch`
//!   flags (`spec`), `levels` and bands, the pure `registry` of them all,
//!   the `tripwires` the engine has the kernel watch, and the `monitor`
//!   shell that reads, arms and reports them.
//! * [`node`]: the node as cgroupfs shows it: `cgroupfs` mounts and reads,
//!   the node's `stats` (one [`node::stats::NodeObservation`] per wake-up),
//!   the pods' `inventory`, their `containers`, the container `runtime`
//!   through CRI (kubelet's disk side), Kubernetes' arithmetic on a pod's
//!   `resources` (its requests and QoS class), and the `snapshot` types the
//!   engine decides on.
//! * [`decide`]: kubelet's policy, pure: `thresholds`, the `engine`
//!   (thresholds met, grace periods, node conditions, victims), the disk
//!   `layout` and `rank`.
//! * [`act`]: the `evictor` loop (one observation per [`act::wake::Wake`],
//!   a decision, its execution, an [`act::evictor::Action`]), its seams
//!   (`io`) and the `kill` of a pod.
//! * [`report`]: `metrics`, what the `kernel` side saw (OOM victims,
//!   counters), and `kubernetes` (pod metadata in, eviction reports out).
//! * [`run`]: the entry points: the `daemon` (startup, then a `serve` loop
//!   that turns each wake-up into one evictor pass) and `simulate`.
//!
//! [`config`] parses the command line and kubelet's configuration;
//! [`quantity`] and [`duration`] are Kubernetes' units; [`logs`] writes
//! amounts in the text logs as quantities.
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
