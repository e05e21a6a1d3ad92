//! The programs of the eBPF object, grouped into hooks that serve one
//! purpose each, and the raw tracepoints they attach to.
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
    pub(crate) fn as_str(self) -> &'static str {
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
    /// Folios joining an LRU list and kernel memory charged, with the
    /// memory cgroup charged: charges only, no free (Linux 6.x after 6.1).
    LruInsertion,
    /// memcg stat updates either way, with the memory cgroup charged (Linux
    /// 6.x after 6.1).
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
    pub const ALL: [Hook; 6] = [
        Hook::LruInsertion,
        Hook::MemcgStat,
        Hook::PageAlloc,
        Hook::TaskLifetime,
        Hook::OomVictim,
        Hook::CgroupLifecycle,
    ];

    pub fn purpose(self) -> Purpose {
        match self {
            Self::LruInsertion | Self::MemcgStat | Self::PageAlloc => Purpose::Memory,
            Self::TaskLifetime => Purpose::Pids,
            Self::OomVictim => Purpose::OomKills,
            Self::CgroupLifecycle => Purpose::CgroupLifecycle,
        }
    }

    /// The `hook` label of logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LruInsertion => "lru-insertion",
            Self::MemcgStat => "memcg-stat",
            Self::PageAlloc => "page-alloc",
            Self::TaskLifetime => "task-lifetime",
            Self::OomVictim => "oom-victim",
            Self::CgroupLifecycle => "cgroup-lifecycle",
        }
    }

    /// Whether a fall of memory usage is seen when it happens; a hook that
    /// runs only on charges sees it at the next charge below the band.
    pub fn sees_memory_falls(self) -> bool {
        self != Self::LruInsertion
    }

    pub fn programs(self) -> &'static [Program] {
        match self {
            Self::LruInsertion => {
                const {
                    &[
                        program("lru_insertion", "mm_lru_insertion", 1),
                        program("memcg_charge_state", "mod_memcg_state", 3),
                        SWITCH_OUT,
                    ]
                }
            }
            Self::MemcgStat => {
                const {
                    &[
                        program("memcg_lruvec_state", "mod_memcg_lruvec_state", 3),
                        program("memcg_state", "mod_memcg_state", 3),
                        SWITCH_OUT,
                    ]
                }
            }
            Self::PageAlloc => {
                const {
                    &[
                        program("page_alloc", "mm_page_alloc", 4),
                        program("page_free", "mm_page_free", 2),
                        SWITCH_OUT,
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

/// Near a line, the task a CPU switches out has its memory cgroup read:
/// the last charges of a task that then sleeps would otherwise wait for
/// that CPU's next charge, as each CPU reads the page counters once per
/// check step, an LRU insertion comes up to a batch of 31 folios after the
/// charge, and a page allocation before it.
const SWITCH_OUT: Program = program("memory_switch_out", "sched_switch", 4);

const fn program(name: &'static str, tracepoint: &'static str, arity: usize) -> Program {
    Program {
        name,
        tracepoint,
        arity,
    }
}
