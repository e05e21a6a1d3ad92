//! The trigger of each resource: the kernel hook that pushes its crossings,
//! or polling. [`choose`] is a pure function of the kernel's
//! [`Capabilities`] and the mode, so the choice on every kernel evictd is
//! tested on is a unit test; `arm` loads and attaches what it chose,
//! falling back past a hook the kernel refuses; `report` says what was
//! chosen and why (log, `evictd_trigger_info`, `evictd_trigger_hook_info`).
//!
//! Memory, best first:
//! 1. `lru-insertion`: folios joining an LRU list and kernel memory charged,
//!    each carrying the memory cgroup charged; it runs on charges only, so
//!    freeing memory (munmap, a kill, reclaim) costs nothing (needs
//!    `mod_memcg_state`: present on 6.18, absent on 6.1). A fall is seen at
//!    the next charge, so `--watch-memory` scopes, which report falls as
//!    they happen, pass it over;
//! 2. `memcg-stat`: the memcg stat tracepoints, either way, which carry the
//!    memory cgroup being charged (6.18, not 6.1);
//! 3. `page-alloc`: page allocations and frees, checked against the current
//!    task's memory cgroup (every kernel with BTF);
//! 4. polling cgroupfs every `--resync-interval`, announced as a warning.
//!
//! The kernel's own push mechanisms that need no BPF (PSI triggers on
//! `memory.pressure`, cgroup v1 `cgroup.event_control` thresholds) belong
//! between 2 and 3, see `fallback`.
use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use tracing::{error, info, warn};

use crate::{
    kernel::bpf::{Hook, ProbeOptions, Probes, Purpose},
    kernel::btf::KernelBtf,
    kernel::capabilities::{Capabilities, Support},
    metrics::Metrics,
};

/// How pressure is detected (`--mode`, which `config::ModeArg` parses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kernel programs push threshold crossings; cgroupfs is re-read every
    /// --resync-interval to repair anything lost.
    Event,
    /// No eBPF: read cgroupfs every --housekeeping-interval, as kubelet does.
    Poll,
    /// No eBPF: a PSI trigger wakes the engine, plus polling.
    Psi,
    /// No eBPF: cgroup v1 usage thresholds on an eventfd wake the engine,
    /// plus polling.
    MemcgThreshold,
}

impl Mode {
    /// The mode as `--mode` spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::Poll => "poll",
            Self::Psi => "psi",
            Self::MemcgThreshold => "memcg-threshold",
        }
    }

    /// Whether memory pressure is polled on --housekeeping-interval (every
    /// mode but event), rather than repaired on --resync-interval.
    pub(crate) fn housekeeping(self) -> bool {
        self != Self::Event
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When the agent must hear that memory usage fell below a band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryFalls {
    /// At the next charge: kubelet's signals, where a fall only ends
    /// pressure the engine reads again on its own (close watch, resync).
    AtTheNextCharge,
    /// When it happens: `--watch-memory` scopes report each crossing both
    /// ways.
    WhenTheyHappen,
}

/// How a resource's crossings are noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Kernel programs on `hook` push crossings through the ring buffer.
    Kernel(Hook),
    /// cgroupfs is re-read on a timer.
    Poll,
    /// A PSI trigger wakes the engine (`--mode psi`).
    Psi,
    /// cgroup v1 usage thresholds on an eventfd (`--mode memcg-threshold`).
    MemcgThreshold,
    /// Nothing reports it (kernel OOM kills without `oom:mark_victim`).
    Unobserved,
}

impl Trigger {
    /// The `trigger` label of logs and metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Kernel(_) => "bpf",
            Self::Poll => "poll",
            Self::Psi => "psi",
            Self::MemcgThreshold => "memcg-threshold",
            Self::Unobserved => "none",
        }
    }
}

/// The trigger of one resource and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerChoice {
    pub trigger: Trigger,
    pub reason: String,
}

/// The trigger of every resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Triggers(BTreeMap<Purpose, TriggerChoice>);

impl Triggers {
    pub fn get(&self, purpose: Purpose) -> &TriggerChoice {
        // choose() fills every purpose; the fallback keeps this total.
        static UNOBSERVED: TriggerChoice = TriggerChoice {
            trigger: Trigger::Unobserved,
            reason: String::new(),
        };
        self.0.get(&purpose).unwrap_or(&UNOBSERVED)
    }

    /// The hooks to attach.
    pub fn hooks(&self) -> Vec<Hook> {
        self.0
            .values()
            .filter_map(|choice| match choice.trigger {
                Trigger::Kernel(hook) => Some(hook),
                _ => None,
            })
            .collect()
    }
}

/// Hooks that can serve `purpose`, best first.
fn candidates(purpose: Purpose) -> &'static [Hook] {
    match purpose {
        Purpose::Memory => &[Hook::LruInsertion, Hook::MemcgStat, Hook::PageAlloc],
        Purpose::Pids => &[Hook::TaskLifetime],
        Purpose::OomKills => &[Hook::OomVictim],
        Purpose::CgroupLifecycle => &[Hook::CgroupLifecycle],
    }
}

/// What a hook gives, for the log line of its choice.
fn describe(hook: Hook) -> &'static str {
    match hook {
        Hook::LruInsertion => {
            "LRU insertions and kernel memory charges: every charge and no free, with the memory cgroup charged"
        }
        Hook::MemcgStat => {
            "memcg stat tracepoints: every charge and free, with the memory cgroup charged"
        }
        Hook::PageAlloc => {
            "page allocations and frees, checked against the allocating task's memory cgroup"
        }
        Hook::TaskLifetime => "fork and task release, with the task's pids cgroup",
        Hook::OomVictim => "the kernel OOM killer's victims",
        Hook::CgroupLifecycle => "cgroup creation and removal",
    }
}

/// The trigger of every resource on a kernel with `capabilities`.
pub fn choose(capabilities: &Capabilities, mode: Mode, falls: MemoryFalls) -> Triggers {
    let choices = Purpose::ALL
        .into_iter()
        .map(|purpose| {
            let choice = match (mode, kernel_unusable(capabilities)) {
                (Mode::Poll, _) => fallback(purpose, "--mode poll".into()),
                (Mode::Psi | Mode::MemcgThreshold, _) => without_bpf(capabilities, mode, purpose),
                (Mode::Event, Some(why)) => fallback(purpose, why),
                (Mode::Event, None) => best_hook(capabilities, purpose, falls),
            };
            (purpose, choice)
        })
        .collect();
    Triggers(choices)
}

/// Why no kernel program can run at all, if so.
fn kernel_unusable(capabilities: &Capabilities) -> Option<String> {
    match (&capabilities.btf, &capabilities.bpf) {
        (Support::No(why), _) => Some(format!("no kernel BTF: {why}")),
        (_, Support::No(why)) => Some(why.clone()),
        (Support::Yes, Support::Yes) => None,
    }
}

fn best_hook(capabilities: &Capabilities, purpose: Purpose, falls: MemoryFalls) -> TriggerChoice {
    let mut passed_over = Vec::new();
    for &hook in candidates(purpose) {
        let usable = match capabilities.attach_failures.get(&hook) {
            Some(error) => Support::No(format!("attaching failed: {error}")),
            None if falls == MemoryFalls::WhenTheyHappen && !hook.sees_memory_falls() => {
                Support::No(
                    "--watch-memory reports falls when they happen; it sees them at the next charge"
                        .into(),
                )
            }
            None => capabilities.hook_tracepoints(hook),
        };
        match usable {
            Support::Yes => {
                let mut reason = describe(hook).to_owned();
                for (hook, why) in &passed_over {
                    reason += &format!("; not {hook}: {why}");
                }
                return TriggerChoice {
                    trigger: Trigger::Kernel(hook),
                    reason,
                };
            }
            Support::No(why) => passed_over.push((hook.as_str(), why)),
        }
    }
    let why = passed_over
        .iter()
        .map(|(hook, why)| format!("not {hook}: {why}"))
        .collect::<Vec<_>>()
        .join("; ");
    fallback(purpose, why)
}

/// The trigger of `purpose` when no kernel hook serves it. A memory trigger
/// the kernel pushes without BPF (PSI on `memory.pressure`, cgroup v1
/// `cgroup.event_control` thresholds) would be tried here, before polling.
fn fallback(purpose: Purpose, why: String) -> TriggerChoice {
    let trigger = match purpose {
        Purpose::Memory | Purpose::Pids | Purpose::CgroupLifecycle => Trigger::Poll,
        Purpose::OomKills => Trigger::Unobserved,
    };
    TriggerChoice {
        trigger,
        reason: why,
    }
}

/// The triggers of the non-eBPF modes: their mechanism for memory, polling
/// for the rest (as kubelet and lmkd do).
fn without_bpf(capabilities: &Capabilities, mode: Mode, purpose: Purpose) -> TriggerChoice {
    let why = format!("--mode {mode}");
    if purpose != Purpose::Memory {
        return fallback(purpose, why);
    }
    let (trigger, reason) = match mode {
        Mode::Psi if capabilities.psi.system || capabilities.psi.cgroup => (
            Trigger::Psi,
            "the kernel's PSI trigger on memory stalls".to_owned(),
        ),
        Mode::Psi => return fallback(purpose, format!("{why}: this kernel has no PSI")),
        Mode::MemcgThreshold if capabilities.memcg_event_control => (
            Trigger::MemcgThreshold,
            "cgroup v1 memory.usage_in_bytes thresholds on an eventfd".to_owned(),
        ),
        Mode::MemcgThreshold => {
            return fallback(
                purpose,
                format!("{why}: no cgroup.event_control (memory thresholds are cgroup v1 only)"),
            );
        }
        Mode::Event | Mode::Poll => return fallback(purpose, why),
    };
    TriggerChoice {
        trigger,
        reason: format!("{why}: {reason}"),
    }
}

/// The programs attached for the chosen triggers, and the final choice.
pub(crate) struct Armed {
    pub probes: Option<Probes>,
    pub triggers: Triggers,
    pub capabilities: Capabilities,
}

/// Loads the programs and attaches the hooks [`choose`] picks. A hook the
/// kernel refuses is recorded in the capabilities and the choice made again,
/// so the resource falls back to the next hook, or to polling.
pub(crate) fn arm(
    mut capabilities: Capabilities,
    btf: Option<&KernelBtf>,
    mode: Mode,
    falls: MemoryFalls,
    options: ProbeOptions,
) -> Armed {
    let mut probes: Option<Probes> = None;
    loop {
        let triggers = choose(&capabilities, mode, falls);
        let hooks = triggers.hooks();
        if hooks.is_empty() {
            // Dropping what was loaded frees it: nothing is attached.
            return Armed {
                probes: None,
                triggers,
                capabilities,
            };
        }
        let loaded = match (probes.take(), btf) {
            (Some(loaded), _) => Ok(loaded),
            (None, Some(btf)) => Probes::load(btf, options),
            (None, None) => {
                // Detection found no BTF, so choose() picked no hook; a
                // caller that forgot to pass it gets polling, not a panic.
                capabilities.btf = Support::No("kernel BTF was not read".into());
                continue;
            }
        };
        let mut loaded = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                capabilities.bpf = Support::No(e.to_string());
                continue;
            }
        };
        let mut refused = false;
        for hook in hooks {
            if let Err(e) = loaded.attach(hook) {
                capabilities.attach_failures.insert(hook, e.to_string());
                refused = true;
            }
        }
        if !refused {
            return Armed {
                probes: Some(loaded),
                triggers,
                capabilities,
            };
        }
        probes = Some(loaded);
    }
}

/// Logs the capabilities and the choice (one line per resource) and sets
/// `evictd_trigger_info`, `evictd_trigger_hook_info` and
/// `evictd_trigger_fallback`. `period` is the
/// polling period of a resource no kernel hook serves.
pub(crate) fn report(armed: &Armed, mode: Mode, metrics: &Arc<Metrics>, period: Duration) {
    info!(capabilities = %armed.capabilities, "kernel capabilities");
    if mode == Mode::Event
        && let Some(why) = kernel_unusable(&armed.capabilities)
    {
        error!(
            error = why,
            ?period,
            "eBPF programs unavailable: POLLING cgroupfs instead of kernel events"
        );
    }
    for purpose in Purpose::ALL {
        let choice = armed.triggers.get(purpose);
        let trigger = choice.trigger.as_str();
        metrics
            .trigger
            .with_label_values(&[purpose.as_str(), trigger])
            .set(1);
        let resource = purpose.as_str();
        let reason = choice.reason.as_str();
        let fallback = choice.trigger == Trigger::Poll
            && (mode == Mode::Event || purpose == Purpose::Memory)
            && mode != Mode::Poll
            && purpose != Purpose::CgroupLifecycle;
        metrics
            .trigger_fallback
            .with_label_values(&[resource])
            .set(i64::from(fallback));
        match choice.trigger {
            Trigger::Kernel(hook) => {
                metrics
                    .trigger_hook
                    .with_label_values(&[resource, hook.as_str()])
                    .set(1);
                let tracepoints = TracepointList(hook);
                info!(resource, trigger, hook = hook.as_str(), %tracepoints, reason, "trigger");
            }
            Trigger::Poll if fallback => {
                warn!(
                    resource,
                    trigger,
                    ?period,
                    reason,
                    "no kernel trigger for this resource: POLLING cgroupfs"
                );
            }
            Trigger::Poll => info!(resource, trigger, ?period, reason, "trigger"),
            Trigger::Psi | Trigger::MemcgThreshold => info!(resource, trigger, reason, "trigger"),
            Trigger::Unobserved => warn!(resource, trigger, reason, "not observed"),
        }
    }
}

/// The raw tracepoints of a hook, comma-separated.
struct TracepointList(Hook);

impl fmt::Display for TracepointList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.programs().iter().map(|p| p.tracepoint).collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests;
