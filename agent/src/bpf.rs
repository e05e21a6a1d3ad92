//! Loads and attaches evictd's eBPF programs, configures the watched scopes
//! through their maps, and turns ring-buffer records into events.
//!
//! Everything loaded here belongs to [`Probes`]: dropping it detaches every
//! program and frees every map. Nothing is pinned, so an agent that dies
//! leaves nothing behind in the kernel.
use std::{collections::BTreeMap, os::fd::AsRawFd, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, MapError, PerCpuArray, RingBuf},
    programs::{ProgramError, RawTracePoint},
};
use evictd_common::{
    Band, COUNTER_MEMORY_CHECKS, COUNTER_READ_ERRORS, COUNTER_RINGBUF_DROPS, CgroupEvent,
    CrossingEvent, EVENT_CGROUP_MKDIR, EVENT_CGROUP_RMDIR, EVENT_CROSSING, EVENT_OOM_VICTIM,
    OomVictimEvent, RESOURCE_MEMORY, RESOURCE_PIDS, names,
};
use tokio::io::{Interest, unix::AsyncFd};

use crate::kernel_layout::{KernelBtf, LayoutError};

/// The programs, built from `ebpf/` by build.rs. Empty when the build had no
/// bpf-linker (see build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/evictd"));

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Memory,
    Pids,
}

impl Resource {
    fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            RESOURCE_MEMORY => Some(Self::Memory),
            RESOURCE_PIDS => Some(Self::Pids),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
        }
    }
}

/// What a program is for; the agent polls a resource no attached hook
/// serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    Memory,
    Pids,
    OomKills,
    CgroupLifecycle,
}

impl Purpose {
    pub const ALL: [Purpose; 4] = [
        Purpose::Memory,
        Purpose::Pids,
        Purpose::OomKills,
        Purpose::CgroupLifecycle,
    ];

    /// The `resource` label of logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::OomKills => "oom_kills",
            Self::CgroupLifecycle => "cgroups",
        }
    }
}

/// One program of the eBPF object and the raw tracepoint it attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub tracepoint: &'static str,
    /// Tracepoint arguments the program was written for.
    pub arity: usize,
}

/// A set of programs that serve one purpose together, attached all or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    /// memcg stat updates, with the memory cgroup charged (Linux 6.x after 6.1).
    MemcgStat,
    /// Page allocations and frees, with the current task's memory cgroup.
    PageAlloc,
    /// Task creation and release, with the task's pids cgroup.
    TaskLifetime,
    /// The kernel OOM killer's victims.
    OomVictim,
    /// Cgroup creation and removal.
    CgroupLifecycle,
}

impl Hook {
    pub const ALL: [Hook; 5] = [
        Hook::MemcgStat,
        Hook::PageAlloc,
        Hook::TaskLifetime,
        Hook::OomVictim,
        Hook::CgroupLifecycle,
    ];

    pub fn purpose(self) -> Purpose {
        match self {
            Self::MemcgStat | Self::PageAlloc => Purpose::Memory,
            Self::TaskLifetime => Purpose::Pids,
            Self::OomVictim => Purpose::OomKills,
            Self::CgroupLifecycle => Purpose::CgroupLifecycle,
        }
    }

    /// The `hook` label of logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemcgStat => "memcg-stat",
            Self::PageAlloc => "page-alloc",
            Self::TaskLifetime => "task-lifetime",
            Self::OomVictim => "oom-victim",
            Self::CgroupLifecycle => "cgroup-lifecycle",
        }
    }

    pub fn programs(self) -> &'static [Program] {
        match self {
            Self::MemcgStat => {
                const {
                    &[
                        program("memcg_lruvec_state", "mod_memcg_lruvec_state", 3),
                        program("memcg_state", "mod_memcg_state", 3),
                    ]
                }
            }
            Self::PageAlloc => {
                const {
                    &[
                        program("page_alloc", "mm_page_alloc", 4),
                        program("page_free", "mm_page_free", 2),
                    ]
                }
            }
            Self::TaskLifetime => {
                const {
                    &[
                        program("task_fork", "sched_process_fork", 2),
                        program("task_free", "sched_process_free", 1),
                    ]
                }
            }
            Self::OomVictim => const { &[program("oom_mark_victim", "mark_victim", 2)] },
            Self::CgroupLifecycle => {
                const {
                    &[
                        program("cgroup_mkdir", "cgroup_mkdir", 2),
                        program("cgroup_rmdir", "cgroup_rmdir", 2),
                    ]
                }
            }
        }
    }
}

const fn program(name: &'static str, tracepoint: &'static str, arity: usize) -> Program {
    Program {
        name,
        tracepoint,
        arity,
    }
}

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
    #[error("ring buffer: {0}")]
    Poll(#[source] std::io::Error),
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
    memory_scopes: HashMap<MapData, u64, Band>,
    pids_scopes: HashMap<MapData, u64, Band>,
    counters: PerCpuArray<MapData, u64>,
    events: Option<RingBuf<MapData>>,
    hooks: Vec<Hook>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramStats {
    pub program: &'static str,
    pub runs: u64,
    pub run_time: Duration,
}

/// Sums of the per-CPU counters the programs keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub ringbuf_drops: u64,
    pub memory_checks: u64,
    pub read_errors: u64,
}

impl Probes {
    /// Loads the object with the layout of the running kernel and takes its
    /// maps. No program runs until [`Probes::attach`] attaches its hook.
    pub fn load(btf: &KernelBtf, options: ProbeOptions) -> Result<Self, BpfError> {
        if OBJECT.is_empty() {
            return Err(BpfError::NoObject);
        }
        let layout = btf.layout(options.check_step_bytes, options.kernel_log)?;
        let mut ebpf = EbpfLoader::new()
            .override_global(names::LAYOUT, &layout, true)
            .load(OBJECT)
            .map_err(BpfError::Load)?;
        let memory_scopes = take_map(&mut ebpf, names::MEMORY_SCOPES)?;
        let pids_scopes = take_map(&mut ebpf, names::PIDS_SCOPES)?;
        let counters = take_map(&mut ebpf, names::COUNTERS)?;
        let events = Some(take_map(&mut ebpf, names::EVENTS)?);
        Ok(Self {
            ebpf,
            memory_scopes,
            pids_scopes,
            counters,
            events,
            hooks: Vec::new(),
        })
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
        prog.attach(program.tracepoint).map_err(error)?;
        Ok(())
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

    /// The hooks attached, in the order they were.
    pub fn hooks(&self) -> &[Hook] {
        &self.hooks
    }

    /// Whether an attached hook serves `purpose`.
    pub fn covers(&self, purpose: Purpose) -> bool {
        self.hooks.iter().any(|hook| hook.purpose() == purpose)
    }

    fn attached_programs(&self) -> impl Iterator<Item = &'static Program> + '_ {
        self.hooks.iter().flat_map(|hook| hook.programs())
    }

    /// Arms (or re-arms) the band of scope `id` of `resource`.
    pub fn set_band(&mut self, resource: Resource, id: u64, band: Band) -> Result<(), BpfError> {
        let (map, name) = self.scopes_mut(resource);
        map.insert(id, band, 0)
            .map_err(|source| BpfError::Map { map: name, source })
    }

    /// Stops watching scope `id`; a scope that was not watched is fine.
    pub fn remove_scope(&mut self, resource: Resource, id: u64) -> Result<(), BpfError> {
        let (map, name) = self.scopes_mut(resource);
        match map.remove(&id) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(BpfError::Map { map: name, source }),
        }
    }

    /// The band as the kernel holds it now (last value included).
    pub fn band(&self, resource: Resource, id: u64) -> Result<Option<Band>, BpfError> {
        let (map, name) = match resource {
            Resource::Memory => (&self.memory_scopes, names::MEMORY_SCOPES),
            Resource::Pids => (&self.pids_scopes, names::PIDS_SCOPES),
        };
        match map.get(&id, 0) {
            Ok(scope) => Ok(Some(scope)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(BpfError::Map { map: name, source }),
        }
    }

    fn scopes_mut(
        &mut self,
        resource: Resource,
    ) -> (&mut HashMap<MapData, u64, Band>, &'static str) {
        match resource {
            Resource::Memory => (&mut self.memory_scopes, names::MEMORY_SCOPES),
            Resource::Pids => (&mut self.pids_scopes, names::PIDS_SCOPES),
        }
    }

    pub fn counters(&self) -> Result<KernelCounters, BpfError> {
        Ok(KernelCounters {
            ringbuf_drops: self.counter(COUNTER_RINGBUF_DROPS)?,
            memory_checks: self.counter(COUNTER_MEMORY_CHECKS)?,
            read_errors: self.counter(COUNTER_READ_ERRORS)?,
        })
    }

    /// Records lost to a full ring buffer since the programs loaded: one
    /// map read, cheap enough to check after every batch of records.
    pub fn ringbuf_drops(&self) -> Result<u64, BpfError> {
        self.counter(COUNTER_RINGBUF_DROPS)
    }

    /// One counter summed over every CPU.
    fn counter(&self, index: u32) -> Result<u64, BpfError> {
        self.counters
            .get(&index, 0)
            .map(|values| values.iter().sum::<u64>())
            .map_err(|source| BpfError::Map {
                map: names::COUNTERS,
                source,
            })
    }

    /// The event stream; can be taken once.
    pub fn take_events(&mut self) -> Result<EventStream, BpfError> {
        let ring = self.events.take().ok_or(BpfError::Missing(names::EVENTS))?;
        Ok(EventStream {
            ring: readable(ring)?,
        })
    }

    /// Starts forwarding the programs' aya-log records to the `log` facade
    /// (and so to tracing). Only useful when loaded with `kernel_log`.
    pub fn kernel_logger(&mut self) -> Result<KernelLogger, BpfError> {
        let logger = aya_log::EbpfLogger::init(&mut self.ebpf)
            .map_err(|e| BpfError::Poll(std::io::Error::other(e)))?;
        Ok(KernelLogger {
            fd: readable(logger)?,
        })
    }

    /// Run count and total run time of each attached program. The kernel
    /// counts only while `kernel.bpf_stats_enabled` is 1 (it costs a clock
    /// read per run), so both stay 0 otherwise.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.attached_programs()
            .filter_map(|program| {
                let info = self.ebpf.program(program.name)?.info().ok()?;
                Some(ProgramStats {
                    program: program.name,
                    runs: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }

    /// Ids of the loaded programs, as `bpftool prog list` shows them.
    pub fn program_ids(&self) -> BTreeMap<&'static str, u32> {
        self.attached_programs()
            .filter_map(|program| {
                let id = self.ebpf.program(program.name)?.info().ok()?.id();
                Some((program.name, id))
            })
            .collect()
    }
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
pub struct KernelLogger {
    fd: AsyncFd<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl KernelLogger {
    pub async fn run(mut self) {
        loop {
            let Ok(mut guard) = self.fd.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }
}

/// One ring-buffer record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEvent {
    Crossing(Crossing),
    OomVictim(OomVictimEvent),
    CgroupCreated(CgroupChange),
    CgroupRemoved(CgroupChange),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossing {
    pub resource: Resource,
    pub raw: CrossingEvent,
}

impl Crossing {
    pub fn rising(&self) -> bool {
        self.raw.rising != 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupChange(pub CgroupEvent);

impl CgroupChange {
    /// The path relative to its hierarchy root, and whether the kernel had
    /// to cut it.
    pub fn path(&self) -> (String, bool) {
        let len = (self.0.path_len as usize).min(self.0.path.len());
        let bytes = &self.0.path[..len];
        let text = bytes.split(|b| *b == 0).next().unwrap_or_default();
        (
            String::from_utf8_lossy(text).into_owned(),
            len == self.0.path.len(),
        )
    }
}

impl KernelEvent {
    pub fn timestamp_ns(&self) -> u64 {
        match self {
            Self::Crossing(c) => c.raw.timestamp_ns,
            Self::OomVictim(o) => o.timestamp_ns,
            Self::CgroupCreated(c) | Self::CgroupRemoved(c) => c.0.timestamp_ns,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Crossing(_) => "crossing",
            Self::OomVictim(_) => "oom_victim",
            Self::CgroupCreated(_) => "cgroup_mkdir",
            Self::CgroupRemoved(_) => "cgroup_rmdir",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {0} bytes is too short for a header")]
    Short(usize),
    #[error("record kind {kind} needs {needed} bytes, got {got}")]
    Truncated {
        kind: u32,
        needed: usize,
        got: usize,
    },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("unknown resource {0}")]
    UnknownResource(u32),
}

fn read_record<T: Copy>(bytes: &[u8], kind: u32) -> Result<T, DecodeError> {
    let needed = size_of::<T>();
    if bytes.len() < needed {
        return Err(DecodeError::Truncated {
            kind,
            needed,
            got: bytes.len(),
        });
    }
    // SAFETY: length checked; T is a repr(C) integer-only type from
    // evictd-common, valid for any bit pattern; read_unaligned needs no
    // alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<KernelEvent, DecodeError> {
    let kind = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(DecodeError::Short(bytes.len()))?;
    match kind {
        EVENT_CROSSING => {
            let raw: CrossingEvent = read_record(bytes, kind)?;
            let resource = Resource::from_raw(raw.resource)
                .ok_or(DecodeError::UnknownResource(raw.resource))?;
            Ok(KernelEvent::Crossing(Crossing { resource, raw }))
        }
        EVENT_OOM_VICTIM => Ok(KernelEvent::OomVictim(read_record(bytes, kind)?)),
        EVENT_CGROUP_MKDIR => Ok(KernelEvent::CgroupCreated(CgroupChange(read_record(
            bytes, kind,
        )?))),
        EVENT_CGROUP_RMDIR => Ok(KernelEvent::CgroupRemoved(CgroupChange(read_record(
            bytes, kind,
        )?))),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

/// CLOCK_MONOTONIC now, in the nanoseconds `bpf_ktime_get_ns()` uses.
pub fn monotonic_now_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default();
    now.as_nanos() as u64
}

/// An event with the time userspace read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub event: KernelEvent,
    pub received_ns: u64,
}

impl Received {
    /// Kernel timestamp to userspace read.
    pub fn latency(&self) -> Duration {
        Duration::from_nanos(self.received_ns.saturating_sub(self.event.timestamp_ns()))
    }
}

/// Ring-buffer reader woken by the kernel through epoll.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl EventStream {
    /// Waits for records and appends every one available to `out`. Records
    /// that do not decode are returned as errors in place, never dropped
    /// silently.
    pub async fn next_batch(
        &mut self,
        out: &mut Vec<Result<Received, DecodeError>>,
    ) -> Result<(), BpfError> {
        let mut guard = self.ring.readable_mut().await.map_err(BpfError::Poll)?;
        let ring = guard.get_inner_mut();
        while let Some(record) = ring.next() {
            let received_ns = monotonic_now_ns();
            out.push(decode(&record).map(|event| Received { event, received_ns }));
        }
        guard.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use evictd_common::CGROUP_PATH_LEN;

    use super::*;

    fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) integer-only value.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    #[test]
    fn decodes_a_crossing() {
        let raw = CrossingEvent {
            kind: EVENT_CROSSING,
            resource: RESOURCE_PIDS,
            timestamp_ns: 5,
            scope_id: 7,
            trigger_cgroup_id: 9,
            value: 100,
            bound: 90,
            rising: 1,
            _pad: 0,
        };
        let event = decode(&bytes_of(&raw)).unwrap();
        let KernelEvent::Crossing(crossing) = event else {
            panic!("{event:?}")
        };
        assert_eq!(crossing.resource, Resource::Pids);
        assert!(crossing.rising());
        assert_eq!(crossing.raw, raw);
    }

    #[test]
    fn decodes_a_cgroup_path() {
        let mut raw = CgroupEvent {
            kind: EVENT_CGROUP_MKDIR,
            hierarchy_id: 3,
            timestamp_ns: 1,
            cgroup_id: 42,
            level: 2,
            path_len: 0,
            path: [0xaa; CGROUP_PATH_LEN],
        };
        let path = b"/kubepods/pod1\0";
        raw.path[..path.len()].copy_from_slice(path);
        raw.path_len = path.len() as u32;
        let KernelEvent::CgroupCreated(change) = decode(&bytes_of(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(change.path(), ("/kubepods/pod1".to_owned(), false));
        raw.path = [b'a'; CGROUP_PATH_LEN];
        raw.path_len = CGROUP_PATH_LEN as u32;
        assert!(CgroupChange(raw).path().1, "a full buffer may be cut");
    }

    #[test]
    fn rejects_short_and_unknown_records() {
        assert_eq!(decode(&[1, 0]), Err(DecodeError::Short(2)));
        assert_eq!(
            decode(&[EVENT_OOM_VICTIM as u8, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::Truncated {
                kind: EVENT_OOM_VICTIM,
                needed: size_of::<OomVictimEvent>(),
                got: 8
            })
        );
        assert_eq!(decode(&[99, 0, 0, 0]), Err(DecodeError::UnknownKind(99)));
    }
}
