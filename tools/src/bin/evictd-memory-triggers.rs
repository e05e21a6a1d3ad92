//! `evictd-memory-triggers WORKLOAD [RUNS]` (run by `cargo xtask
//! measure-triggers [--vm]`): the measurements behind the choice of memory
//! trigger per kernel (docs/design.md, "Memory triggers per kernel").
//!
//! 1. Each memory hook this kernel offers (`memcg-stat`, `page-alloc`),
//!    loaded alone: how far past a threshold its first record is (slack),
//!    for anonymous memory and for tmpfs writes (page cache a pod can fill,
//!    e.g. an `emptyDir` of medium Memory), and what each program costs
//!    per run (`kernel.bpf_stats_enabled`).
//! 2. PSI: a trigger written to the pod's `memory.pressure` (cgroup v2), and
//!    when it fires for a pod growing towards its limit.
//! 3. `memory.high` as a tripwire (cgroup v2): what it does to the pod that
//!    crosses it.
//! 4. What registering a memory threshold on an eventfd takes (cgroup v1).
//!
//! Everything runs in a private cgroup tree with a 512 MiB ceiling; the
//! tmpfs is a private mount, removed at the end.
use std::{
    fs,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use evictd::{
    kernel::bpf::{
        EventStream, Hook, KernelEvent, ProbeOptions, Probes, Purpose, ScopeKind, ScopeMaps,
    },
    kernel::btf::KernelBtf,
    kernel::capabilities::{Capabilities, Support},
    kernel::notify::MemcgThresholds,
    node::cgroupfs::CgroupFs,
    scopes::levels::Levels,
};
use evictd_integration::{BpfStats, Controller, PrivateCgroupTree, Workload};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

const MIB: u64 = 1 << 20;
const CHECK_STEP: u64 = 256 * 1024;
const POD_LIMIT: u64 = 512 * MIB;
/// How long to wait for a record after the workload stopped growing.
const SETTLE: Duration = Duration::from_secs(1);

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let workload = PathBuf::from(
        args.next()
            .context("usage: evictd-memory-triggers WORKLOAD [RUNS]")?,
    );
    let runs: u64 = args.next().map_or(Ok(10), |r| r.parse()).context("RUNS")?;
    let (capabilities, btf) = Capabilities::detect(&CgroupFs::discover()?);
    println!("{capabilities}\n");
    let btf = btf.context("no kernel BTF")?;
    let tmpfs = PrivateTmpfs::mount()?;
    let _stats = BpfStats::on().context("turning kernel.bpf_stats_enabled on")?;
    for hook in Hook::ALL {
        if hook.purpose() != Purpose::Memory {
            continue;
        }
        if let Support::No(why) = capabilities.hook_tracepoints(hook) {
            println!("## {}: not on this kernel ({why})\n", hook.as_str());
            continue;
        }
        measure_hook(hook, &btf, &workload, &tmpfs.dir, runs)?;
    }
    if capabilities.cgroup_version == evictd::node::cgroupfs::CgroupVersion::V2 {
        psi(&workload)?;
        memory_high(&workload)?;
    } else {
        println!("## PSI and memory.high: per-cgroup files of cgroup v2 only, not measured here");
        threshold_registration()?;
    }
    Ok(())
}

/// What registering a cgroup v1 memory threshold costs its caller: the
/// kernel waits out an RCU grace period in each. `--mode memcg-threshold`
/// pays it when its levels move and after a signal whose reading is below
/// a level, event mode's far trigger when its edge moves (docs/design.md,
/// pay per pressure).
fn threshold_registration() -> Result<()> {
    const REGISTRATIONS: usize = 50;
    let tree = PrivateCgroupTree::new()?;
    tree.create("pod")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _guard = runtime.enter();
    let mut thresholds = MemcgThresholds::open(&tree.dir(Controller::Memory, "pod"))?;
    let mut took: Vec<Duration> = (0..REGISTRATIONS as u64)
        .map(|registration| -> Result<Duration> {
            let started = Instant::now();
            // Another level each time: each is a registration, and each
            // closes the previous eventfd, as the agent does.
            thresholds.arm(&[POD_LIMIT + registration % 2])?;
            Ok(started.elapsed())
        })
        .collect::<Result<_>>()?;
    took.sort();
    let ms = |at: usize| took[at].as_secs_f64() * 1e3;
    println!(
        "## cgroup v1 memory threshold registration (cgroup.event_control), {REGISTRATIONS} in a row\n"
    );
    println!(
        "p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms\n",
        ms(REGISTRATIONS / 2),
        ms(REGISTRATIONS * 9 / 10),
        ms(REGISTRATIONS - 1)
    );
    Ok(())
}

/// Slack of the first record past a threshold, per scenario, and the cost
/// of the hook's programs.
fn measure_hook(
    hook: Hook,
    btf: &KernelBtf,
    workload: &Path,
    tmpfs: &Path,
    runs: u64,
) -> Result<()> {
    let mut probes = Probes::load(
        btf,
        ProbeOptions {
            check_step_bytes: CHECK_STEP,
            kernel_log: false,
        },
    )?;
    probes.attach(hook)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut events = {
        let _guard = runtime.enter();
        probes.take_events()?
    };
    let mut maps = probes.take_scope_maps()?;
    println!(
        "## {} (check step {} KiB)\n",
        hook.as_str(),
        CHECK_STEP / 1024
    );
    println!("| scenario | runs | detected | slack min | slack mean | slack max |");
    println!("|---|---:|---:|---:|---:|---:|");
    let started = Instant::now();
    for scenario in [Scenario::Anonymous, Scenario::Tmpfs] {
        let mut slack = Vec::new();
        for run in 0..runs {
            // Thresholds that fall at different places within a check step.
            let threshold = 64 * MIB + run * 3 * MIB + run * 12 * 4096;
            if let Some(past) = crossing_slack(
                &mut maps,
                &runtime,
                &mut events,
                scenario,
                threshold,
                workload,
                tmpfs,
            )? {
                slack.push(past);
            }
        }
        let kib = |bytes: u64| bytes as f64 / 1024.0;
        let (min, max) = (
            slack.iter().min().copied().unwrap_or(0),
            slack.iter().max().copied().unwrap_or(0),
        );
        let mean = if slack.is_empty() {
            0.0
        } else {
            slack.iter().sum::<u64>() as f64 / slack.len() as f64
        };
        println!(
            "| {} | {runs} | {} | {:.0} KiB | {:.0} KiB | {:.0} KiB |",
            scenario.describe(),
            slack.len(),
            kib(min),
            mean / 1024.0,
            kib(max)
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("\n| program | runs | runs/s | ns per run |");
    println!("|---|---:|---:|---:|");
    for stats in probes.program_stats() {
        let per_run = stats.run_time.as_nanos() as f64 / stats.runs.max(1) as f64;
        println!(
            "| {} | {} | {:.0} | {per_run:.1} |",
            stats.program,
            stats.runs,
            stats.runs as f64 / elapsed
        );
    }
    println!(
        "\npage-counter checks: {}\n",
        probes.counters()?.memory_checks
    );
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Scenario {
    /// The workload touches 2 MiB at a time.
    Anonymous,
    /// dd writes a tmpfs file in 1 MiB blocks.
    Tmpfs,
}

impl Scenario {
    fn describe(self) -> &'static str {
        match self {
            Self::Anonymous => "anonymous memory, 2 MiB steps",
            Self::Tmpfs => "tmpfs writes (dd, 1 MiB blocks)",
        }
    }
}

/// Bytes past `threshold` of the first record for a fresh pod growing past
/// it; `None` when no record came.
fn crossing_slack(
    maps: &mut ScopeMaps,
    runtime: &tokio::runtime::Runtime,
    events: &mut EventStream,
    scenario: Scenario,
    threshold: u64,
    workload: &Path,
    tmpfs: &Path,
) -> Result<Option<u64>> {
    let tree = PrivateCgroupTree::new()?;
    tree.create("pod")?;
    tree.set_memory_limit("pod", POD_LIMIT)?;
    let id = tree.cgroup_id(Controller::Memory, "pod")?;
    maps.set_band(
        ScopeKind::Memory,
        id,
        Levels::new(vec![threshold], 16 * MIB).band(0, 0),
    )?;
    let target = threshold + 64 * MIB;
    let mut found = None;
    let mut poll_records = |found: &mut Option<u64>, wait: Duration| -> Result<()> {
        let mut batch = Vec::new();
        let _ = runtime
            .block_on(async { tokio::time::timeout(wait, events.next_batch(&mut batch)).await });
        for record in batch.into_iter().flatten() {
            if let KernelEvent::Crossing(c) = record.event
                && c.raw.scope_id == id
                && c.rising()
                && found.is_none()
            {
                *found = Some(c.raw.value);
            }
        }
        Ok(())
    };
    match scenario {
        Scenario::Anonymous => {
            let mut workload = Workload::spawn_in(&tree, "pod", workload)?;
            while found.is_none() && tree.memory_usage("pod")? < target {
                workload.alloc(2 * MIB)?;
                poll_records(&mut found, Duration::ZERO)?;
            }
        }
        Scenario::Tmpfs => {
            let file = tmpfs.join(format!("fill-{}", tree.name()));
            let procs = tree.dir(Controller::Memory, "pod").join("cgroup.procs");
            let status = Command::new("sh")
                .arg("-c")
                .arg(r#"echo $$ > "$1" && exec dd if=/dev/zero of="$2" bs=1M count="$3" status=none"#)
                .arg("sh")
                .arg(&procs)
                .arg(&file)
                .arg((target / MIB).to_string())
                .status()?;
            if !status.success() {
                bail!("dd into {} failed", file.display());
            }
            let _ = fs::remove_file(&file);
        }
    }
    let deadline = Instant::now() + SETTLE;
    while found.is_none() && Instant::now() < deadline {
        poll_records(&mut found, Duration::from_millis(50))?;
    }
    maps.remove_scope(ScopeKind::Memory, id)?;
    Ok(found.map(|value| value.saturating_sub(threshold)))
}

/// A PSI trigger on the pod's memory.pressure (10 ms of stall within any
/// 500 ms, the finest the kernel allows for unprivileged windows), while
/// the pod grows 4 MiB at a time to its limit.
fn psi(workload: &Path) -> Result<()> {
    let limit = 256 * MIB;
    let threshold = limit - 100 * MIB;
    let tree = PrivateCgroupTree::new()?;
    tree.create("pod")?;
    tree.set_memory_limit("pod", limit)?;
    let pressure = tree.dir(Controller::Memory, "pod").join("memory.pressure");
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pressure)?;
    nix::unistd::write(&file, b"some 10000 500000\0").context("writing a PSI trigger")?;
    let mut workload = Workload::spawn_in(&tree, "pod", workload)?;
    let mut fired_at = None;
    let mut usage = 0;
    let started = Instant::now();
    while workload.alloc(4 * MIB).is_ok() {
        usage = tree.memory_usage("pod")?;
        if fired_at.is_none() && pressure_event(&file)? {
            fired_at = Some((usage, started.elapsed()));
        }
        if usage >= limit {
            break;
        }
    }
    let oom_kills = tree.oom_kill_count("pod")?;
    println!("## PSI trigger on memory.pressure (some 10 ms per 500 ms), pod limit 256 MiB\n");
    match fired_at {
        Some((at, after)) => println!(
            "first PSI event at usage {} MiB ({:+} MiB from a memory.available<100Mi line at {} MiB), after {:.0} ms",
            at / MIB,
            (at as i64 - threshold as i64) / MIB as i64,
            threshold / MIB,
            after.as_secs_f64() * 1e3
        ),
        None => println!(
            "no PSI event while the pod grew to {} MiB (line at {} MiB)",
            usage / MIB,
            threshold / MIB
        ),
    }
    println!("kernel OOM kills in the pod: {oom_kills}\n");
    Ok(())
}

/// Whether the PSI trigger on `file` has fired (POLLPRI), without waiting.
fn pressure_event(file: &fs::File) -> Result<bool> {
    let mut fd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    if ready < 0 {
        return Err(std::io::Error::last_os_error()).context("polling memory.pressure");
    }
    Ok(ready > 0 && fd.revents & libc::POLLPRI != 0)
}

/// Time to grow 16 MiB past 128 MiB, in a pod without and with memory.high
/// at 128 MiB (without swap, reclaim cannot free anonymous memory, so the
/// kernel throttles the allocating task instead).
fn memory_high(workload: &Path) -> Result<()> {
    println!("## memory.high as a tripwire at 128 MiB (no swap)\n");
    println!("| pod | time to grow 128 → 144 MiB | memory.events high |");
    println!("|---|---:|---:|");
    for high in [None, Some(128 * MIB)] {
        let tree = PrivateCgroupTree::new()?;
        tree.create("pod")?;
        tree.set_memory_limit("pod", POD_LIMIT)?;
        let dir = tree.dir(Controller::Memory, "pod");
        if let Some(high) = high {
            fs::write(dir.join("memory.high"), high.to_string())?;
        }
        let mut workload = Workload::spawn_in(&tree, "pod", workload)?;
        workload.alloc(128 * MIB)?;
        let started = Instant::now();
        let mut grown = 0;
        while grown < 16 * MIB && workload.alloc(4 * MIB).is_ok() {
            grown += 4 * MIB;
        }
        let took = started.elapsed();
        let events = fs::read_to_string(dir.join("memory.events"))?;
        let high_events = events
            .lines()
            .find_map(|l| l.strip_prefix("high "))
            .unwrap_or("?")
            .trim()
            .to_owned();
        println!(
            "| {} | {:.0} ms{} | {high_events} |",
            if high.is_some() {
                "memory.high=128Mi"
            } else {
                "no memory.high"
            },
            took.as_secs_f64() * 1e3,
            if grown < 16 * MIB {
                format!(" (stopped at +{} MiB)", grown / MIB)
            } else {
                String::new()
            }
        );
    }
    println!();
    Ok(())
}

/// A tmpfs of our own, unmounted and removed on drop.
struct PrivateTmpfs {
    dir: PathBuf,
}

impl PrivateTmpfs {
    fn mount() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("evictd-measure-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1g"),
        )
        .with_context(|| format!("mounting a tmpfs on {}", dir.display()))?;
        Ok(Self { dir })
    }
}

impl Drop for PrivateTmpfs {
    fn drop(&mut self) {
        let _ = umount2(&self.dir, MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(&self.dir);
    }
}
