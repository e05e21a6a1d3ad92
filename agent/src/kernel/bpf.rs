//! evictd's eBPF programs: `hooks` names them and what each serves,
//! [`Probes`] loads and attaches them, `maps` holds the scope bands and
//! the programs' counters, `events` turns ring-buffer records into
//! events, `charges` reads every memory cgroup's charge at once.
//!
//! Everything loaded here belongs to [`Probes`] (and the [`ScopeMaps`] and
//! [`EventStream`] taken from it): dropping them detaches every program and
//! frees every map. Nothing is pinned, so an agent that dies leaves nothing
//! behind in the kernel.
mod charges;
mod events;
mod hooks;
mod maps;

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, MapError, PerCpuArray, RingBuf},
    programs::{Iter, ProgramError, RawTracePoint, raw_trace_point::RawTracePointLinkId},
};
use evictd_common::names;
use tokio::io::{Interest, unix::AsyncFd};

pub use charges::{CgroupCharges, ChargesError};
pub use events::{
    CgroupChange, Crossing, DecodeError, EventStream, KernelEvent, Received, decode,
    monotonic_now_ns,
};
pub use hooks::{Hook, Program, Purpose};
pub use maps::{KernelCounters, ProgramStats, ScopeKind, ScopeMaps};

use crate::kernel::btf::{KernelBtf, LayoutError};

/// The programs, built from `ebpf/` by build.rs. Empty when the build had no
/// bpf-linker (see build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/evictd"));

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "this evictd binary was built without its eBPF programs (no bpf-linker at build time); \
         build it with `cargo xtask build`"
    )]
    NoObject,
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("loading the eBPF object failed: {0}{hint}", hint = privilege_hint(.0))]
    Load(#[source] aya::EbpfError),
    #[error("eBPF object has no {0}")]
    Missing(&'static str),
    #[error("program {program} ({tracepoint}): {source}{hint}", hint = privilege_hint(.source))]
    Program {
        program: &'static str,
        tracepoint: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("reading the kernel's BTF for the cgroup iterator: {0}")]
    Btf(#[source] aya::BtfError),
    #[error("attaching the cgroup iterator: {0}")]
    Iterator(#[source] std::io::Error),
    #[error("ring buffer: {0}")]
    Poll(#[source] std::io::Error),
    #[error("reading the CPUs the programs may run on ({path}): {source}")]
    Cpus {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn privilege_hint(error: &dyn std::error::Error) -> &'static str {
    let text = format!("{error:?}");
    if text.contains("EPERM")
        || text.contains("Operation not permitted")
        || text.contains("PermissionDenied")
    {
        " (loading BPF needs root, or CAP_BPF and CAP_PERFMON; CAP_SYS_ADMIN before Linux 5.8)"
    } else {
        ""
    }
}

#[derive(Debug, Clone, Copy)]
pub struct ProbeOptions {
    /// Bytes of memcg stat churn a CPU sees between two page-counter reads.
    pub check_step_bytes: u64,
    /// Forward aya-log output of the programs to the agent's log.
    pub kernel_log: bool,
}

/// Loaded and attached programs with their maps.
pub struct Probes {
    ebpf: Ebpf,
    counters: PerCpuArray<MapData, u64>,
    scope_maps: Option<ScopeMaps>,
    events: Option<RingBuf<MapData>>,
    hooks: Vec<Hook>,
    /// The link of each program attached now. A hook's programs stay loaded
    /// when it is detached ([`Probes::set_active`]), so attaching it again
    /// costs one syscall per program and no verification.
    links: BTreeMap<&'static str, RawTracePointLinkId>,
    page_shift: u32,
    cpus: u64,
    /// Why the cgroup iterator did not load, if it did not.
    iterator_error: Option<BpfError>,
    /// Whether the cgroup iterator was attached (its link is the
    /// [`CgroupCharges`] handed out).
    iterator_linked: bool,
    /// Whether the root memory cgroup's value is the machine's working set.
    machine_working_set: Result<(), MachineWorkingSetError>,
}

/// Why the programs cannot add up the machine's working set, which the
/// root memory cgroup's band compares.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MachineWorkingSetError {
    #[error(transparent)]
    Layout(LayoutError),
    #[error("reading the NUMA nodes the kernel may have ({path}): {source}")]
    Nodes {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path} reads {text:?}, not a list of NUMA node ids")]
    NodesText { path: &'static str, text: String },
    #[error("{count} NUMA node ids, more than the {max} the programs add up")]
    TooManyNodes { count: u32, max: u32 },
}

/// The NUMA node ids the kernel may have (`nr_node_ids` is the highest + 1).
const NUMA_NODES_POSSIBLE: &str = "/sys/devices/system/node/possible";

/// What the programs' loop over NUMA nodes is bounded by
/// (`MAX_NUMA_NODES` in the eBPF crate).
const MAX_NUMA_NODES: u32 = 64;

/// `nr_node_ids` from `path` (a list such as `0` or `0-3,6`); 1 where the
/// kernel has no NUMA (no such file), as its one node.
fn numa_nodes(path: &Path) -> Result<u32, MachineWorkingSetError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(1),
        Err(source) => {
            return Err(MachineWorkingSetError::Nodes {
                path: NUMA_NODES_POSSIBLE,
                source,
            });
        }
    };
    let highest = text
        .trim()
        .split(',')
        .map(|range| range.rsplit('-').next().unwrap_or(range).parse::<u32>())
        .try_fold(0u32, |highest, id| {
            Ok::<_, std::num::ParseIntError>(highest.max(id?))
        })
        .map_err(|_| MachineWorkingSetError::NodesText {
            path: NUMA_NODES_POSSIBLE,
            text: text.trim().to_owned(),
        })?;
    let count = highest.saturating_add(1);
    if count > MAX_NUMA_NODES {
        return Err(MachineWorkingSetError::TooManyNodes {
            count,
            max: MAX_NUMA_NODES,
        });
    }
    Ok(count)
}

impl Probes {
    /// Loads the object with the layout of the running kernel and takes its
    /// maps. No program runs until [`Probes::attach`] attaches its hook.
    pub fn load(btf: &KernelBtf, options: ProbeOptions) -> Result<Self, BpfError> {
        if OBJECT.is_empty() {
            return Err(BpfError::NoObject);
        }
        let mut layout = btf.layout(options.check_step_bytes, options.kernel_log)?;
        layout.possible_cpus =
            aya::util::nr_cpus().map_err(|(path, source)| BpfError::Cpus { path, source })? as u64;
        let machine_working_set = match btf.machine_working_set_error() {
            Some(e) => Err(MachineWorkingSetError::Layout(e.clone())),
            None => numa_nodes(Path::new(NUMA_NODES_POSSIBLE)),
        };
        layout.numa_nodes = *machine_working_set.as_ref().unwrap_or(&0);
        let mut ebpf = EbpfLoader::new()
            .override_global(names::LAYOUT, &layout, true)
            .load(OBJECT)
            .map_err(BpfError::Load)?;
        let scope_maps = ScopeMaps {
            memory: take_map(&mut ebpf, names::MEMORY_SCOPES)?,
            pids: take_map(&mut ebpf, names::PIDS_SCOPES)?,
            node_pids: take_map(&mut ebpf, names::NODE_PIDS_BAND)?,
            pids_watched: take_map(&mut ebpf, names::PIDS_WATCHED)?,
            pids_cgroups: Default::default(),
            node_pids_watched: false,
        };
        // Loaded now, while the loader's copy of the kernel's BTF is freed
        // and nothing else is held: a second copy later would raise the
        // agent's peak memory.
        let iterator_error = load_iterator(&mut ebpf).err();
        let counters = take_map(&mut ebpf, names::COUNTERS)?;
        let events = Some(take_map(&mut ebpf, names::EVENTS)?);
        Ok(Self {
            ebpf,
            counters,
            scope_maps: Some(scope_maps),
            events,
            hooks: Vec::new(),
            links: BTreeMap::new(),
            page_shift: layout.page_shift,
            cpus: layout.possible_cpus,
            iterator_error,
            iterator_linked: false,
            machine_working_set: machine_working_set.map(|_| ()),
        })
    }

    /// Whether the memory programs compare the machine's working set
    /// (kubelet's, from the kernel's per-NUMA-node counters) on the root
    /// memory cgroup, where a cgroup's page counter is compared; why not.
    pub(crate) fn machine_working_set(&self) -> Result<(), &MachineWorkingSetError> {
        self.machine_working_set.as_ref().copied()
    }

    /// Verifies and attaches every program of `hook`. On an error none of
    /// them stays attached, so the caller can fall back to another hook.
    pub fn attach(&mut self, hook: Hook) -> Result<(), BpfError> {
        if self.hooks.contains(&hook) {
            return Ok(());
        }
        for (done, program) in hook.programs().iter().enumerate() {
            if let Err(e) = self.attach_program(program) {
                for attached in &hook.programs()[..done] {
                    self.links.remove(attached.name);
                    if let Ok(prog) = self.raw_tracepoint(attached) {
                        // Unloading detaches its link; failing that, dropping
                        // the Probes does.
                        let _ = prog.unload();
                    }
                }
                return Err(e);
            }
        }
        self.hooks.push(hook);
        Ok(())
    }

    fn attach_program(&mut self, program: &Program) -> Result<(), BpfError> {
        let error = |source| BpfError::Program {
            program: program.name,
            tracepoint: program.tracepoint,
            source,
        };
        let prog = self.raw_tracepoint(program)?;
        prog.load().map_err(error)?;
        let link = prog.attach(program.tracepoint).map_err(error)?;
        self.links.insert(program.name, link);
        Ok(())
    }

    /// Detaches (`active` false) or attaches again the programs of an
    /// attached hook; they stay loaded, with their maps. A detached
    /// tracepoint costs the kernel nothing (its static key is off), where a
    /// program that returns early still costs the call. Returns whether
    /// anything changed.
    pub(crate) fn set_active(&mut self, hook: Hook, active: bool) -> Result<bool, BpfError> {
        if !self.hooks.contains(&hook) {
            return Err(BpfError::Missing(hook.as_str()));
        }
        let mut changed = false;
        for program in hook.programs() {
            let error = |source| BpfError::Program {
                program: program.name,
                tracepoint: program.tracepoint,
                source,
            };
            match (self.links.remove(program.name), active) {
                (Some(link), false) => {
                    self.raw_tracepoint(program)?.detach(link).map_err(error)?;
                    changed = true;
                }
                (None, true) => {
                    let link = self
                        .raw_tracepoint(program)?
                        .attach(program.tracepoint)
                        .map_err(error)?;
                    self.links.insert(program.name, link);
                    changed = true;
                }
                (Some(link), true) => {
                    self.links.insert(program.name, link);
                }
                (None, false) => {}
            }
        }
        Ok(changed)
    }

    fn raw_tracepoint(&mut self, program: &Program) -> Result<&mut RawTracePoint, BpfError> {
        self.ebpf
            .program_mut(program.name)
            .ok_or(BpfError::Missing(program.name))?
            .try_into()
            .map_err(|source| BpfError::Program {
                program: program.name,
                tracepoint: program.tracepoint,
                source,
            })
    }

    /// Attaches the cgroup iterator to walk the memory cgroups under `root`
    /// (a directory of the memory hierarchy), reporting those at most
    /// `max_level` below the hierarchy's root, and checks a first reading
    /// against `root`'s usage file, read by `usage`
    /// (`CgroupCharges::check`). It needs Linux 6.1, and 6.7 on a cgroup
    /// v1 hierarchy.
    pub fn cgroup_charges<E>(
        &mut self,
        root: &Path,
        max_level: u32,
        usage: impl Fn() -> Result<u64, E>,
    ) -> Result<CgroupCharges, ChargesError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let mut charges = self.attach_iterator(root, max_level)?;
        charges.check(usage)?;
        self.iterator_linked = true;
        Ok(charges)
    }

    fn attach_iterator(&mut self, root: &Path, max_level: u32) -> Result<CgroupCharges, BpfError> {
        if let Some(e) = self.iterator_error.take() {
            return Err(e);
        }
        let mut level: Array<_, u32> = self
            .ebpf
            .map_mut(names::CHARGES_MAX_LEVEL)
            .ok_or(BpfError::Missing(names::CHARGES_MAX_LEVEL))?
            .try_into()
            .map_err(|source| BpfError::Map {
                map: names::CHARGES_MAX_LEVEL,
                source,
            })?;
        level.set(0, max_level, 0).map_err(|source| BpfError::Map {
            map: names::CHARGES_MAX_LEVEL,
            source,
        })?;
        let program = iterator(&mut self.ebpf)?.fd().map_err(iterator_error)?;
        CgroupCharges::attach(program.as_fd(), root, self.page_shift, self.cpus)
            .map_err(BpfError::Iterator)
    }

    /// The hooks attached, in the order they were.
    pub(crate) fn hooks(&self) -> &[Hook] {
        &self.hooks
    }

    /// Whether an attached hook serves `purpose`.
    pub(crate) fn covers(&self, purpose: Purpose) -> bool {
        self.hooks.iter().any(|hook| hook.purpose() == purpose)
    }

    fn attached_programs(&self) -> impl Iterator<Item = &'static Program> + '_ {
        self.hooks.iter().flat_map(|hook| hook.programs())
    }

    /// The event stream; can be taken once.
    pub fn take_events(&mut self) -> Result<EventStream, BpfError> {
        let ring = self.events.take().ok_or(BpfError::Missing(names::EVENTS))?;
        Ok(EventStream::new(readable(ring)?))
    }

    /// The scope maps, where bands are armed; can be taken once.
    pub fn take_scope_maps(&mut self) -> Result<ScopeMaps, BpfError> {
        self.scope_maps
            .take()
            .ok_or(BpfError::Missing(names::MEMORY_SCOPES))
    }

    /// Starts forwarding the programs' aya-log records to the `log` facade
    /// (and so to tracing). Only useful when loaded with `kernel_log`.
    pub(crate) fn kernel_logger(&mut self) -> Result<KernelLogger, BpfError> {
        let logger = aya_log::EbpfLogger::init(&mut self.ebpf)
            .map_err(|e| BpfError::Poll(std::io::Error::other(e)))?;
        Ok(KernelLogger {
            fd: readable(logger)?,
        })
    }

    /// Ids of the attached programs, the cgroup iterator included, as
    /// `bpftool prog list` shows them.
    pub fn program_ids(&self) -> BTreeMap<&'static str, u32> {
        let iterator = self.iterator_linked.then_some(names::CGROUP_CHARGES);
        self.attached_programs()
            .map(|program| program.name)
            .chain(iterator)
            .filter_map(|name| Some((name, self.ebpf.program(name)?.info().ok()?.id())))
            .collect()
    }
}

fn iterator_error(source: ProgramError) -> BpfError {
    BpfError::Program {
        program: names::CGROUP_CHARGES,
        tracepoint: "iter/cgroup",
        source,
    }
}

fn iterator(ebpf: &mut Ebpf) -> Result<&mut Iter, BpfError> {
    ebpf.program_mut(names::CGROUP_CHARGES)
        .ok_or(BpfError::Missing(names::CGROUP_CHARGES))?
        .try_into()
        .map_err(iterator_error)
}

/// Verifies the cgroup iterator; it is attached only once the cgroup to
/// walk is known.
fn load_iterator(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    // aya finds the iterator's attach point by name in the whole BTF.
    let btf = aya::Btf::from_sys_fs().map_err(BpfError::Btf)?;
    iterator(ebpf)?.load("cgroup", &btf).map_err(iterator_error)
}

/// Registers a map-backed reader with tokio for readability.
fn readable<T: AsRawFd>(inner: T) -> Result<AsyncFd<T>, BpfError> {
    // SAFETY: the fd belongs to `inner` (a ring buffer map it owns), which the
    // AsyncFd owns in turn, so it stays open and unchanged while registered.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }
        .map_err(|e| BpfError::Poll(e.into()))
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, BpfError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(BpfError::Missing(name))?;
    T::try_from(map).map_err(|source| BpfError::Map { map: name, source })
}

/// Drains aya-log records from the kernel programs.
pub(crate) struct KernelLogger {
    fd: AsyncFd<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl KernelLogger {
    pub(crate) async fn run(mut self) {
        loop {
            let Ok(mut guard) = self.fd.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }
}

/// The `bpf` system call for a command that returns a new descriptor, for
/// what aya does not expose (and the measurement tools).
pub fn bpf_syscall<T>(command: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a repr(C) prefix of `union bpf_attr` for `command`,
    // valid for `size_of::<T>()` bytes; what it points to outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            (attr as *const T).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call succeeded, so `fd` is a new descriptor owned by no one.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_ids_are_the_highest_possible_plus_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("possible");
        for (text, count) in [("0\n", 1), ("0-1\n", 2), ("0-3,6\n", 7)] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(numa_nodes(&path).unwrap(), count, "{text:?}");
        }
        std::fs::write(&path, "0-127\n").unwrap();
        assert!(matches!(
            numa_nodes(&path),
            Err(MachineWorkingSetError::TooManyNodes { count: 128, .. })
        ));
        std::fs::write(&path, "zero\n").unwrap();
        assert!(matches!(
            numa_nodes(&path),
            Err(MachineWorkingSetError::NodesText { .. })
        ));
        // A kernel without NUMA has one node and no such file.
        assert_eq!(numa_nodes(&dir.path().join("missing")).unwrap(), 1);
    }
}
