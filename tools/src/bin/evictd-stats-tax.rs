//! `evictd-stats-tax ROUNDS` (run by `cargo xtask stats-tax`): what an empty
//! BPF program costs a system call, and what `kernel.bpf_stats_enabled`
//! adds to it. `bpf-cost` and the bench read each program's nanoseconds per
//! run from the kernel's statistics, which time every run with two clock
//! reads; a node with statistics off (the default) pays neither the reads
//! nor the bookkeeping, so the figures they report include a price the node
//! does not pay. This measures it from outside, with no agent.
//!
//! Raw tracepoint programs of two instructions (`r0 = 0; exit`) are
//! attached to `sys_enter`, which runs on every system call on the node,
//! and `getppid`, the cheapest system call, is timed in batches: with no
//! program, one, two with statistics off, and two with statistics on. The
//! first program also moves every system call to the traced entry path;
//! the second adds only its own run, which is what a program costs a hook.
//! Each round runs the four in an order rotated by the round, so the
//! machine's noise spreads over all of them; medians over the rounds are
//! printed, with the kernel's own count for an empty program: what the
//! statistics report for a program that does nothing, which is in every
//! figure they give.
//!
//! The programs are loaded with the `bpf` system call rather than aya, which
//! loads programs from an ELF object: two instructions need no object. They
//! are attached only while their configuration is timed, so the node's other
//! system calls pay them for a fraction of a second per round.
use std::{
    ffi::CStr,
    fs,
    os::fd::{AsRawFd as _, OwnedFd},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use evictd::kernel::bpf::bpf_syscall;
use evictd_integration::BpfStats;

/// `enum bpf_cmd`.
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
/// `enum bpf_prog_type`.
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
/// `r0 = 0` (`BPF_ALU64 | BPF_MOV | BPF_K`) and `exit` (`BPF_JMP | BPF_EXIT`),
/// every other field zero.
const EMPTY_PROGRAM: [u64; 2] = [0xb7, 0x95];
const TRACEPOINT: &CStr = c"sys_enter";
const LICENSE: &CStr = c"GPL";
const PROGRAM_NAME: &[u8] = b"evictd_stats_tx";

/// System calls timed per configuration and round.
const CALLS_PER_BATCH: u32 = 500_000;

/// The `BPF_PROG_LOAD` prefix of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// The `BPF_RAW_TRACEPOINT_OPEN` prefix of `union bpf_attr`.
#[repr(C)]
struct RawTracepointOpenAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// What is attached to the tracepoint while a batch is timed.
struct Config {
    name: &'static str,
    programs: usize,
    statistics: bool,
}

/// The second program costs only its own run: the first one also moved
/// every system call to the traced entry path.
const CONFIGS: [Config; 4] = [
    Config {
        name: "no program",
        programs: 0,
        statistics: false,
    },
    Config {
        name: "one empty program, statistics off",
        programs: 1,
        statistics: false,
    },
    Config {
        name: "two empty programs, statistics off",
        programs: 2,
        statistics: false,
    },
    Config {
        name: "two empty programs, statistics on",
        programs: 2,
        statistics: true,
    },
];

fn main() -> Result<()> {
    let usage = "usage: evictd-stats-tax ROUNDS";
    let rounds: usize = std::env::args()
        .nth(1)
        .context(usage)?
        .parse()
        .context("ROUNDS")?;
    if rounds == 0 {
        bail!("ROUNDS must be at least 1; {usage}");
    }
    let load = || load_empty_program().context("loading an empty program");
    let programs = [load()?, load()?];
    let mut timings = CONFIGS.map(|_| Vec::with_capacity(rounds));
    let (mut kernel_runs, mut kernel_ns) = (0u64, 0u64);
    println!(
        "stats-tax: {rounds} rounds of {CALLS_PER_BATCH} getppid calls per configuration; empty programs on raw tracepoint {}",
        TRACEPOINT.to_string_lossy()
    );
    for round in 0..rounds {
        for step in 0..CONFIGS.len() {
            let index = (round + step) % CONFIGS.len();
            let config = &CONFIGS[index];
            let _statistics = if config.statistics {
                BpfStats::on()
            } else {
                BpfStats::off()
            }
            .context("setting kernel.bpf_stats_enabled")?;
            let _links = programs[..config.programs]
                .iter()
                .map(attach)
                .collect::<std::io::Result<Vec<_>>>()
                .context("attaching the empty programs")?;
            let before = run_counters(&programs)?;
            timings[index].push(time_batch());
            let after = run_counters(&programs)?;
            kernel_runs += after.0 - before.0;
            kernel_ns += after.1 - before.1;
        }
    }
    let medians = timings.map(|mut batch| median(&mut batch));
    println!("\n| configuration | ns per getppid (median of {rounds}) |");
    println!("|---|---:|");
    for (config, median) in CONFIGS.iter().zip(medians) {
        println!("| {} | {median:.1} |", config.name);
    }
    let [none, one, two, two_counted] = medians;
    println!(
        "\nthe first program (the traced entry path and one run): {:.1} ns",
        one - none
    );
    println!(
        "one more empty program's run, statistics off: {:.1} ns",
        two - one
    );
    println!(
        "what statistics add to each run: {:.1} ns",
        (two_counted - two) / 2.0
    );
    if kernel_runs > 0 {
        println!(
            "the kernel's statistics for an empty program: {kernel_runs} runs, {:.1} ns per run",
            kernel_ns as f64 / kernel_runs as f64
        );
    }
    Ok(())
}

/// Nanoseconds per `getppid` over one batch.
fn time_batch() -> f64 {
    let started = Instant::now();
    for _ in 0..CALLS_PER_BATCH {
        // SAFETY: getppid takes no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    started.elapsed().as_nanos() as f64 / f64::from(CALLS_PER_BATCH)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn load_empty_program() -> std::io::Result<OwnedFd> {
    let mut prog_name = [0; 16];
    prog_name[..PROGRAM_NAME.len()].copy_from_slice(PROGRAM_NAME);
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
        insn_cnt: EMPTY_PROGRAM.len() as u32,
        insns: EMPTY_PROGRAM.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        prog_name,
        ..ProgLoadAttr::default()
    };
    bpf_syscall(BPF_PROG_LOAD, &attr)
}

/// Attached until the returned link is dropped.
fn attach(program: &OwnedFd) -> std::io::Result<OwnedFd> {
    let attr = RawTracepointOpenAttr {
        name: TRACEPOINT.as_ptr() as u64,
        prog_fd: program.as_raw_fd() as u32,
        _pad: 0,
    };
    bpf_syscall(BPF_RAW_TRACEPOINT_OPEN, &attr)
}

/// The programs' summed `run_cnt` and `run_time_ns` from their fdinfo,
/// which count only while statistics are on.
fn run_counters(programs: &[OwnedFd]) -> Result<(u64, u64)> {
    let mut totals = (0, 0);
    for program in programs {
        let path = format!("/proc/self/fdinfo/{}", program.as_raw_fd());
        let info = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let field = |name: &str| -> Result<u64> {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
                .with_context(|| format!("{path} has no {name}"))
        };
        totals.0 += field("run_cnt:")?;
        totals.1 += field("run_time_ns:")?;
    }
    Ok(totals)
}
