//! What the running kernel offers evictd, probed once at startup: BTF, the
//! raw tracepoints the programs attach to (and their arity), whether BPF
//! programs and ring buffers load, the cgroup version and mounts, PSI, and
//! cgroup v1 memory event notification. [`crate::kernel::triggers`] turns this into
//! the trigger of each resource.
//!
//! tracefs is deliberately not probed or mounted: raw tracepoints are found
//! through BTF (`btf_trace_<name>`) and attached by name, so a host without
//! tracefs mounted loses nothing, and the agent never mounts a filesystem
//! on the node.
use std::{collections::BTreeMap, fmt, path::Path};

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{is_map_supported, is_program_supported},
};

use crate::{
    kernel::bpf::Hook,
    kernel::btf::{KernelBtf, VMLINUX_BTF},
    node::cgroupfs::{CgroupFs, CgroupVersion},
};

/// Whether something is usable, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(String),
}

impl Support {
    pub fn is_yes(&self) -> bool {
        matches!(self, Self::Yes)
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Yes => f.write_str("yes"),
            Self::No(why) => write!(f, "no ({why})"),
        }
    }
}

/// Pressure stall information (PSI) the kernel offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Psi {
    /// `/proc/pressure/memory` (the kernel was booted with PSI on).
    pub system: bool,
    /// `memory.pressure` in cgroups (cgroup v2 only).
    pub cgroup: bool,
}

/// Everything evictd's choice of triggers depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// `uname -r` (`/proc/sys/kernel/osrelease`).
    pub kernel_release: String,
    /// `/sys/kernel/btf/vmlinux`: the programs' struct offsets and the
    /// tracepoints' prototypes come from it.
    pub btf: Support,
    /// Arity of each raw tracepoint a program of evictd's attaches to, for
    /// those the kernel has (absent: no such tracepoint).
    pub tracepoints: BTreeMap<&'static str, usize>,
    /// Raw tracepoint programs and ring buffer maps load (privilege and
    /// kernel support; a ring buffer needs Linux 5.8).
    pub bpf: Support,
    pub cgroup_version: CgroupVersion,
    pub memory_root: String,
    pub pids_root: Option<String>,
    pub psi: Psi,
    /// cgroup v1 memory thresholds through `cgroup.event_control` (eventfd).
    pub memcg_event_control: bool,
    /// Hooks whose programs were refused when attached, with the error;
    /// filled by the agent, so the next choice falls back past them.
    pub attach_failures: BTreeMap<Hook, String>,
}

impl Capabilities {
    /// Probes the running kernel. The BTF read here is handed back for the
    /// programs' layout, so it is parsed once.
    pub fn detect(cgroupfs: &CgroupFs) -> (Self, Option<KernelBtf>) {
        let kernel_release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|release| release.trim().to_owned())
            .unwrap_or_else(|e| format!("unknown ({e})"));
        let (btf, kernel_btf) = match KernelBtf::open(Path::new(VMLINUX_BTF)) {
            Ok(kernel_btf) => (Support::Yes, Some(kernel_btf)),
            Err(e) => (Support::No(e.to_string()), None),
        };
        let tracepoints = kernel_btf
            .as_ref()
            .map(|btf| {
                Hook::ALL
                    .iter()
                    .flat_map(|hook| hook.programs())
                    .filter_map(|p| Some((p.tracepoint, btf.tracepoint_arity(p.tracepoint)?)))
                    .collect()
            })
            .unwrap_or_default();
        let memory_root = cgroupfs.memory_root.display().to_string();
        let capabilities = Self {
            kernel_release,
            btf,
            tracepoints,
            bpf: probe_bpf(),
            cgroup_version: cgroupfs.version,
            pids_root: cgroupfs
                .pids_root
                .as_ref()
                .map(|root| root.display().to_string()),
            psi: Psi {
                system: Path::new("/proc/pressure/memory").exists(),
                cgroup: cgroupfs.version == CgroupVersion::V2
                    && (cgroupfs.memory_root.join("memory.pressure").exists()
                        || first_child_has(&cgroupfs.memory_root, "memory.pressure")),
            },
            memcg_event_control: cgroupfs.version == CgroupVersion::V1
                && cgroupfs.memory_root.join("cgroup.event_control").exists(),
            memory_root,
            attach_failures: BTreeMap::new(),
        };
        (capabilities, kernel_btf)
    }

    /// Whether every tracepoint of `hook` exists with the arity its
    /// programs were written for; if not, which does not and how.
    pub fn hook_tracepoints(&self, hook: Hook) -> Support {
        for program in hook.programs() {
            match self.tracepoints.get(program.tracepoint) {
                None => {
                    return Support::No(format!("no {} tracepoint", program.tracepoint));
                }
                Some(&arity) if arity != program.arity => {
                    return Support::No(format!(
                        "{} takes {arity} arguments here, the program expects {}",
                        program.tracepoint, program.arity
                    ));
                }
                Some(_) => {}
            }
        }
        Support::Yes
    }
}

/// Whether raw tracepoint programs and ring buffers load. Loading a
/// trivial program is the only test of privilege that does not guess
/// (capabilities, LSMs, `kernel.unprivileged_bpf_disabled` all play a part).
fn probe_bpf() -> Support {
    let privilege =
        " (loading BPF needs root, or CAP_BPF and CAP_PERFMON; CAP_SYS_ADMIN before Linux 5.8)";
    let describe = |what: &str, error: &dyn std::error::Error| {
        let text = format!("{error:?}");
        let hint = if text.contains("EPERM")
            || text.contains("Operation not permitted")
            || text.contains("PermissionDenied")
        {
            privilege
        } else {
            ""
        };
        format!("{what}: {error}{hint}")
    };
    match is_program_supported(ProgramType::RawTracePoint) {
        Ok(true) => {}
        Ok(false) => return Support::No("raw tracepoint programs are not supported".into()),
        Err(e) => return Support::No(describe("loading a raw tracepoint program", &e)),
    }
    match is_map_supported(MapType::RingBuf) {
        Ok(true) => Support::Yes,
        Ok(false) => Support::No("BPF ring buffers are not supported (Linux 5.8+)".into()),
        Err(e) => Support::No(describe("creating a ring buffer", &e)),
    }
}

/// Whether any cgroup directly below `root` has `file` (the v2 root has no
/// `memory.pressure` on some kernels, its children do).
fn first_child_has(root: &Path, file: &str) -> bool {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| entry.path().join(file).exists())
}

impl fmt::Display for Capabilities {
    /// One line for the startup log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {}, BTF {}, BPF {}, cgroup {} (memory at {}, pids at {}), \
             PSI system {} cgroup {}, memcg v1 event_control {}, tracepoints: ",
            self.kernel_release,
            self.btf,
            self.bpf,
            match self.cgroup_version {
                CgroupVersion::V1 => "v1",
                CgroupVersion::V2 => "v2",
            },
            self.memory_root,
            self.pids_root.as_deref().unwrap_or("none"),
            self.psi.system,
            self.psi.cgroup,
            self.memcg_event_control,
        )?;
        let names: Vec<&str> = self.tracepoints.keys().copied().collect();
        f.write_str(&names.join(" "))
    }
}
