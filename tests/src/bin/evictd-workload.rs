//! A process the integration tests steer through stdin, one command per line.
//! Each command gets one line on stdout, `ok ...` or `err ...`, written only
//! once its effect is complete:
//!
//! - `alloc BYTES [RATE]`: allocate BYTES more (in 1 MiB chunks) and touch
//!   every page, so it is resident and charged, RATE bytes/s when given
//!   (paced by the clock per 1 MiB); answers `ok <bytes held>`.
//! - `free BYTES`: drop chunks from the end until at least BYTES are gone
//!   (or none is left), returning the pages to the kernel; `ok <bytes held>`.
//! - `fork N [RATE]`: start N children that sleep until killed, RATE a
//!   second (default: as fast as it can); `ok <children>`.
//! - `reap N`: SIGKILL and wait for the N newest children; `ok <children>`.
//! - `fork-exit N`: start a fresh child (small, whatever this process
//!   holds: a fork copies the parent's page tables) that forks N children
//!   one after another, each exiting at once (no exec) and reaped before
//!   the next: a task born and freed N times, what the kernel's fork and
//!   exit hooks see; answers `ok <ns the N forks took>`.
//! - `threads N`: start one child that runs N threads beside its main one,
//!   all sleeping until killed (one more process, N + 1 more tasks);
//!   `ok <children>` once the threads run.
//! - `hop N SECS`: start a fork bomb that does not grow but moves: N
//!   processes, each forever forking a successor and exiting, so their pids
//!   keep changing (what defeats killing by pid list without freezing).
//!   They are children of a `hop-root` child that reaps them (a child
//!   subreaper, so no zombies pile up on init), and all exit after SECS at
//!   most; `ok <children>`.
//! - `ignore-sigterm`: ignore SIGTERM from now on (children started later
//!   inherit it); `ok ignoring`.
//! - `exit-on-sigterm`: exit with status 143 (128 + SIGTERM, what a shell
//!   reports for a process SIGTERM ended) on SIGTERM; `ok exiting`. As a
//!   container's pid 1 the workload needs a handler for SIGTERM to reach
//!   it at all: the kernel drops signals a namespace's init does not handle.
//! - `bomb RATE LOG USAGE`: answers `ok bombing`, then allocates and
//!   touches 1 MiB chunks at RATE bytes/s (0: as fast as it can) until
//!   killed, appending after each 64 KiB touched a 24-byte record to the
//!   file LOG: CLOCK_MONOTONIC ns, bytes held, and the value then in the
//!   file USAGE (a cgroup's page counter; with /proc/vmstat the machine's
//!   working set as kubelet computes it on the root), little-endian u64s
//!   (one write each, so a SIGKILL loses nothing written).
//! - `fork-bomb LOG`: answers `ok forking`, then forks sleeping children as
//!   fast as it can until killed, appending (ns, children) records to LOG;
//!   a fork the kernel refuses (pids.max) is recorded with the top bit of
//!   the count set, and retried.
//! - `write BYTES PATH`: write BYTES to the file PATH (created or
//!   replaced) and sync it, so the disk use is there; `ok <bytes>`.
//! - `read PATH`: read the file PATH to its end through the page cache
//!   (what a pod scanning a file does); `ok <bytes read>`.
//! - `cycle PATH`: read the file PATH to its end, again and again, on a
//!   thread of its own until the process ends (a working set the size of
//!   the file, in use); answers `ok cycling` at once.
//! - `log BYTES`: write BYTES of text to stderr (a container's log);
//!   `ok <bytes>`.
//! - `map-shared PATH`: open PATH and map one page of it shared, on a
//!   thread of its own, which holds the process's mmap lock for as long as
//!   the mapping takes (the integration tests' `StuckFile` makes that
//!   forever); answers `ok mapping` at once.
//! - `touch BYTES [RATE]`: map BYTES of fresh anonymous memory (4 KiB
//!   pages: no transparent huge pages) and write one byte of every page, so
//!   each page is one page fault and one charge, at RATE bytes/s when given
//!   (paced by the clock per 1 MiB); answers `ok <ns the touching took>`.
//!   The mapping is kept until `unmap`; one at a time.
//! - `touch-until BYTES LEVEL USAGE`: as `touch`, but stops at the first
//!   page after which the file USAGE (a cgroup's page counter) reads at
//!   least LEVEL, pinned to one CPU meanwhile; `ok <bytes touched>`, or
//!   `err` when BYTES ran out first. The last pages charged are then
//!   typically still in that CPU's LRU batch, not on a list. Kept until
//!   `exit`.
//! - `unmap`: munmap what `touch` mapped; `ok <ns the munmap took>`.
//! - `kill-large BYTES`: start a child that touches BYTES as `touch` does
//!   and waits; once it holds them, SIGKILL it and wait for it;
//!   `ok <ns from the SIGKILL until it was reaped>` (by then the kernel has
//!   freed its memory: a process's address space is torn down before its
//!   parent can reap it).
//! - `pid`: `ok <pid>`.
//! - `exit`: `ok exit`, then exit (children die with it).
//!
//! In a container (`cargo xtask test`'s containerd tier) the commands come
//! over a unix socket instead: `evictd-workload connect SOCKET` connects to
//! SOCKET, which the test listens on, and serves the same protocol there;
//! `evictd-workload pause` sleeps until SIGTERM or SIGINT (a pod sandbox's
//! process, as Kubernetes' pause).
//!
//! Children are this binary run as `evictd-workload sleep-child <parent pid>`
//! (or `hold-child <parent pid> <bytes>` for `kill-large`):
//! a fresh exec, so they share none of the parent's allocations (a plain
//! fork would keep copy-on-write references that stop `free` from returning
//! memory).
use std::{
    fs::{File, OpenOptions},
    io::{self, BufRead, BufReader, Write},
    os::unix::{fs::FileExt as _, net::UnixStream},
    process::{Child, Command, Stdio},
    ptr::NonNull,
    time::{Duration, Instant},
};

use nix::{
    sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity},
    sys::{
        prctl,
        signal::{SigHandler, Signal, signal},
        wait::{wait, waitpid},
    },
    unistd::{ForkResult, Pid, fork, getppid, pause},
};

const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;
/// The bomb's log resolution: one record per 64 KiB touched, a quarter of
/// a millisecond at 256 MiB/s, so that an agent killing within a
/// millisecond of the crossing rarely stops the bomb before it logs it.
const PAGES_PER_RECORD: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("sleep-child") => sleep_child(args.get(2).and_then(|p| p.parse().ok())),
        Some("threads-child") => threads_child(
            args.get(2).and_then(|n| n.parse().ok()).unwrap_or(0),
            args.get(3).and_then(|p| p.parse().ok()),
        ),
        Some("hold-child") => hold_child(
            args.get(2).and_then(|p| p.parse().ok()),
            args.get(3).and_then(|b| b.parse().ok()).unwrap_or(0),
        ),
        Some("forker-child") => forker_child(
            args.get(2).and_then(|p| p.parse().ok()),
            args.get(3).and_then(|n| n.parse().ok()).unwrap_or(0),
        ),
        Some("hop-root") => hop_root(
            args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1),
            Duration::from_secs(args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1)),
        ),
        Some("pause") => sandbox_pause(),
        Some("connect") => {
            let Some(stream) = args.get(2).and_then(|path| UnixStream::connect(path).ok()) else {
                std::process::exit(1);
            };
            let Ok(reader) = stream.try_clone() else {
                std::process::exit(1);
            };
            return serve(BufReader::new(reader), stream);
        }
        _ => {}
    }
    serve(io::stdin().lock(), io::stdout().lock());
}

/// Answers the commands read from `input` on `output` until `exit` or the
/// end of `input`.
fn serve(input: impl BufRead, mut output: impl Write) {
    keep_large_allocations_mmapped();
    let mut workload = Workload::default();
    let stdout = &mut output;
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (reply, done) = match workload.run(line.trim()) {
            Ok(Some(reply)) => (format!("ok {reply}"), false),
            Ok(None) => ("ok exit".to_owned(), true),
            Err(e) => (format!("err {e}"), false),
        };
        if writeln!(stdout, "{reply}")
            .and_then(|()| stdout.flush())
            .is_err()
            || done
        {
            break;
        }
        if let Some(bomb) = workload.bomb.take() {
            bomb.detonate();
        }
    }
}

/// glibc serves allocations above `M_MMAP_THRESHOLD` (128 KiB by default)
/// with their own mmap and munmaps them on free, so a dropped 1 MiB chunk
/// goes back to the kernel (and out of the memcg's usage) at once. But by
/// default glibc raises the threshold to the size of each mmapped block
/// freed, after which 1 MiB chunks come from the heap and go back only when
/// the top of the heap is trimmed: in LIFO order, and keeping up to the
/// (also raised) trim threshold. Setting the threshold explicitly turns
/// that adjustment off, so every chunk stays its own mapping. (musl always
/// mmaps blocks this large.)
fn keep_large_allocations_mmapped() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator tuning; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// What Kubernetes' pause binary does as a pod sandbox's pid 1: sleep until
/// SIGTERM or SIGINT ends it (handled, or as pid 1 it would never see them).
fn sandbox_pause() -> ! {
    extern "C" fn exit_cleanly(_: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(0) }
    }
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only calls _exit.
        if unsafe { signal(sig, SigHandler::Handler(exit_cleanly)) }.is_err() {
            std::process::exit(1);
        }
    }
    loop {
        pause();
    }
}

extern "C" fn exit_on_sigterm(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(128 + libc::SIGTERM) }
}

/// Sleeps until killed, and is killed when the workload dies.
fn sleep_child(parent: Option<i32>) -> ! {
    die_with(parent);
    loop {
        pause();
    }
}

/// Exits unless `parent` is still this process's parent, and arranges to be
/// killed when it dies.
fn die_with(parent: Option<i32>) {
    // PDEATHSIG fires when the parent dies after this call; a parent that
    // died before it shows up as a different parent pid.
    let armed = prctl::set_pdeathsig(Signal::SIGKILL).is_ok();
    if !armed || parent.map(Pid::from_raw) != Some(getppid()) {
        std::process::exit(1);
    }
}

/// Touches `bytes`, says `ready` on stdout, and holds them until killed.
fn hold_child(parent: Option<i32>, bytes: usize) -> ! {
    die_with(parent);
    // Named, not `_`: the mapping lives until the process is killed.
    let Ok(_held) = Mapping::touch(bytes, None) else {
        std::process::exit(1);
    };
    let mut stdout = io::stdout().lock();
    if writeln!(stdout, "ready")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(1);
    }
    loop {
        pause();
    }
}

/// Starts `count` threads that sleep forever, says `ready` on stdout, and
/// sleeps until killed, like [`sleep_child`].
fn threads_child(count: usize, parent: Option<i32>) -> ! {
    let armed = prctl::set_pdeathsig(Signal::SIGKILL).is_ok();
    if !armed || parent.map(Pid::from_raw) != Some(getppid()) {
        std::process::exit(1);
    }
    for _ in 0..count {
        std::thread::spawn(|| {
            loop {
                std::thread::park();
            }
        });
    }
    let mut stdout = io::stdout().lock();
    if writeln!(stdout, "ready")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(1);
    }
    loop {
        pause();
    }
}

/// Paces work at a rate by the clock, not by a sleep per unit, so the rate
/// holds however long each unit takes.
struct Pacer {
    started: Instant,
    /// Units a second; `None`: as fast as it can.
    rate: Option<usize>,
}

impl Pacer {
    fn new(rate: Option<usize>) -> Self {
        Self {
            started: Instant::now(),
            rate,
        }
    }

    /// Waits until `done` units are due since the start.
    fn wait_for(&self, done: usize) {
        let Some(rate) = self.rate else { return };
        let due = Duration::from_secs_f64(done as f64 / rate.max(1) as f64);
        if let Some(wait) = due.checked_sub(self.started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

/// Fresh anonymous memory, every page touched once; unmapped on drop.
struct Mapping {
    start: NonNull<libc::c_void>,
    len: usize,
}

impl Mapping {
    /// Maps `bytes` (whole pages) and writes one byte of each page: one
    /// page fault and one memcg charge per 4 KiB page (huge pages are
    /// refused for the range, so the count does not depend on the
    /// machine's transparent huge page setting).
    /// Touches every page, at `rate` bytes/s when given.
    fn touch(bytes: usize, rate: Option<usize>) -> io::Result<Self> {
        let mapping = Self::map(bytes)?;
        let pacer = Pacer::new(rate);
        for offset in (0..mapping.len).step_by(PAGE) {
            if offset % CHUNK == 0 {
                pacer.wait_for(offset);
            }
            mapping.touch_page(offset);
        }
        Ok(mapping)
    }

    /// Touches page after page until `usage` reads at least `level`, on the
    /// CPU it started on (so the pages charged last wait in that CPU's LRU
    /// batch); the bytes touched, `None` if the mapping ran out first.
    fn touch_until(bytes: usize, level: u64, usage: &File) -> io::Result<(Self, Option<usize>)> {
        let mapping = Self::map(bytes)?;
        let _pinned = PinnedToThisCpu::new()?;
        for offset in (0..mapping.len).step_by(PAGE) {
            mapping.touch_page(offset);
            if read_counter(usage) >= level {
                return Ok((mapping, Some(offset + PAGE)));
            }
        }
        Ok((mapping, None))
    }

    /// Writes one byte of the page at `offset`: faults it in and charges it.
    fn touch_page(&self, offset: usize) {
        assert!(offset < self.len, "touch past the mapping");
        // SAFETY: offset < len, inside the writable mapping; volatile so the
        // write (the page fault) is not optimised away.
        unsafe {
            self.start
                .as_ptr()
                .cast::<u8>()
                .add(offset)
                .write_volatile(1)
        };
    }

    fn map(bytes: usize) -> io::Result<Self> {
        let len = bytes.div_ceil(PAGE).max(1) * PAGE;
        // SAFETY: a new private anonymous mapping at an address the kernel
        // picks; no existing memory is affected.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = NonNull::new(start).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let mapping = Self { start, len };
        // SAFETY: the range is exactly the mapping just made.
        if unsafe { libc::madvise(start.as_ptr(), len, libc::MADV_NOHUGEPAGE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(mapping)
    }
}

/// Keeps the process on the CPU it runs on until dropped.
struct PinnedToThisCpu {
    before: CpuSet,
}

impl PinnedToThisCpu {
    fn new() -> io::Result<Self> {
        let this = Pid::from_raw(0);
        let before = sched_getaffinity(this).map_err(io::Error::from)?;
        let mut only = CpuSet::new();
        only.set(sched_getcpu().map_err(io::Error::from)?)
            .map_err(io::Error::from)?;
        sched_setaffinity(this, &only).map_err(io::Error::from)?;
        Ok(Self { before })
    }
}

impl Drop for PinnedToThisCpu {
    fn drop(&mut self) {
        // Failing leaves the process pinned, which only a test notices.
        let _ = sched_setaffinity(Pid::from_raw(0), &self.before);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns; nothing
        // refers to it afterwards.
        unsafe { libc::munmap(self.start.as_ptr(), self.len) };
    }
}

/// Starts `count` hopping processes and reaps them, and their successors,
/// until none is left (at most `lifetime`).
fn hop_root(count: u32, lifetime: Duration) -> ! {
    let armed = prctl::set_pdeathsig(Signal::SIGKILL).is_ok();
    // Orphaned successors are re-parented here, not to init, and reaped.
    if !armed || prctl::set_child_subreaper(true).is_err() {
        std::process::exit(1);
    }
    let until = Instant::now() + lifetime;
    for _ in 0..count {
        // SAFETY: this process is single-threaded (freshly exec'd, no
        // threads started), so the child may run any code.
        if let Ok(ForkResult::Child) = unsafe { fork() } {
            hop(until);
        }
    }
    // ECHILD: every hopper has exited.
    while wait().is_ok() {}
    std::process::exit(0);
}

/// Forks a successor and exits, over and over, until `until`. The 1 ms
/// pause keeps the CPU cost low on a shared machine; it is still far
/// faster than a pid can be listed and then signalled reliably.
fn hop(until: Instant) -> ! {
    loop {
        if Instant::now() >= until {
            // SAFETY: _exit ends the process without running destructors
            // or atexit handlers, which a forked copy must not run twice.
            unsafe { libc::_exit(0) };
        }
        std::thread::sleep(Duration::from_millis(1));
        // SAFETY: single-threaded, as in hop_root. EAGAIN at pids.max: retry.
        if let Ok(ForkResult::Parent { .. }) = unsafe { fork() } {
            // SAFETY: as above; the successor carries on.
            unsafe { libc::_exit(0) };
        }
    }
}

/// Maps one page of `file` shared on a thread that then waits for good:
/// the mapping and the file live until the process ends. The thread is
/// spawned, not run here, because the mmap may never return.
/// Reads the file at `path` over and over on a thread of its own, until
/// the process ends: a working set the size of the file, cycled.
fn cycle_aside(path: String) {
    std::thread::spawn(move || while read_file(&path).is_ok() {});
}

fn map_shared_aside(file: File) {
    std::thread::spawn(move || {
        // SAFETY: a new shared read-only mapping of an open file at an
        // address the kernel picks; nothing reads it. Its result does not
        // matter: the tests look at where the thread waits.
        let _ = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        loop {
            std::thread::park();
        }
    });
}

/// Writes `bytes` of non-zero data (no sparse file) to `path` and syncs it.
fn write_file(path: &str, bytes: usize) -> io::Result<()> {
    let mut file = File::create(path)?;
    let chunk = vec![0x5a_u8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK);
        file.write_all(&chunk[..n])?;
        left -= n;
    }
    file.sync_all()
}

/// Reads the file at `path` through the page cache to its end; returns the
/// bytes read.
fn read_file(path: &str) -> io::Result<u64> {
    io::copy(&mut File::open(path)?, &mut io::sink())
}

/// Writes `bytes` of log lines to stderr.
fn write_log(bytes: usize) -> io::Result<()> {
    let line = [b'x'; 1023];
    let mut stderr = io::stderr().lock();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(1024);
        stderr.write_all(&line[..n - 1])?;
        stderr.write_all(b"\n")?;
        left -= n;
    }
    stderr.flush()
}

fn open_log(path: Option<&str>) -> Result<File, String> {
    let path = path.ok_or("a bomb needs a log file")?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{path}: {e}"))
}

/// A bomb armed by a command; it goes off once its answer is out.
enum Bomb {
    Memory {
        rate: usize,
        log: File,
        usage: Counter,
    },
    Tasks {
        log: File,
    },
}

impl Bomb {
    fn detonate(self) -> ! {
        match self {
            Self::Memory {
                rate,
                mut log,
                usage,
            } => memory_bomb(rate, &mut log, &usage),
            Self::Tasks { mut log } => fork_bomb(&mut log),
        }
    }
}

/// Appends the time and `values` as one record, in one write.
fn record(log: &mut File, values: &[u64]) {
    let mut bytes = evictd::kernel::bpf::monotonic_now_ns()
        .to_le_bytes()
        .to_vec();
    for value in values {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    // Nothing to do about a failed write: the bench sees a short log.
    let _ = log.write_all(&bytes);
}

/// The number in a cgroup file such as memory.usage_in_bytes, read afresh.
fn read_counter(file: &File) -> u64 {
    let mut text = [0u8; 32];
    let read = file.read_at(&mut text, 0).unwrap_or(0);
    std::str::from_utf8(&text[..read])
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// What the memory bomb logs as the node's memory: a cgroup's page
/// counter, or with /proc/vmstat the machine's working set as kubelet
/// computes it on the root.
enum Counter {
    PageCounter(File),
    MachineWorkingSet(File),
}

impl Counter {
    fn open(path: &str) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("{path}: {e}"))?;
        Ok(match path {
            evictd_integration::VMSTAT => Self::MachineWorkingSet(file),
            _ => Self::PageCounter(file),
        })
    }

    fn read(&self) -> u64 {
        match self {
            Self::PageCounter(file) => read_counter(file),
            Self::MachineWorkingSet(file) => {
                evictd_integration::read_working_set(file).unwrap_or(0)
            }
        }
    }
}

fn memory_bomb(rate: usize, log: &mut File, usage: &Counter) -> ! {
    let pacer = Pacer::new(Some(rate).filter(|&rate| rate > 0));
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        pacer.wait_for(chunks.len() * CHUNK);
        let held = chunks.len() * CHUNK;
        let mut chunk = vec![0u8; CHUNK];
        for (page, byte) in chunk.iter_mut().step_by(PAGE).enumerate() {
            *byte = 1;
            if (page + 1) % PAGES_PER_RECORD == 0 {
                record(log, &[(held + (page + 1) * PAGE) as u64, usage.read()]);
            }
        }
        chunks.push(chunk);
    }
}

fn fork_bomb(log: &mut File) -> ! {
    const REFUSED: u64 = 1 << 63;
    let mut children = 0u64;
    loop {
        // SAFETY: the workload is single-threaded, so the child may run any
        // code; it only arms PDEATHSIG and sleeps.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                let _ = prctl::set_pdeathsig(Signal::SIGKILL);
                loop {
                    pause();
                }
            }
            Ok(ForkResult::Parent { .. }) => {
                children += 1;
                record(log, &[children]);
            }
            Err(_) => {
                record(log, &[children | REFUSED]);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[derive(Default)]
struct Workload {
    chunks: Vec<Vec<u8>>,
    children: Vec<Child>,
    bomb: Option<Bomb>,
    /// What `touch` mapped, until `unmap`.
    touched: Option<Mapping>,
    /// What `touch-until` mapped, kept until exit.
    touched_until: Vec<Mapping>,
}

impl Workload {
    /// Runs one command line; `Ok(None)` means exit.
    fn run(&mut self, line: &str) -> Result<Option<String>, String> {
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or_default();
        let mut amount = || -> Result<usize, String> {
            let word = words
                .next()
                .ok_or_else(|| format!("{command} needs a number"))?;
            word.parse()
                .map_err(|_| format!("{command}: not a number: {word:?}"))
        };
        Ok(Some(match command {
            "alloc" => {
                let bytes = amount()?;
                let rate = words.next().map(str::parse).transpose();
                let rate = rate.map_err(|e| format!("alloc: rate: {e}"))?;
                self.alloc(bytes, rate);
                self.held().to_string()
            }
            "free" => {
                let count = amount()?.div_ceil(CHUNK).min(self.chunks.len());
                self.chunks.truncate(self.chunks.len() - count);
                self.held().to_string()
            }
            "fork" => {
                let count = amount()?;
                let rate = words.next().map(str::parse).transpose();
                let rate = rate.map_err(|e| format!("fork: rate: {e}"))?;
                self.fork(count, rate).map_err(|e| format!("fork: {e}"))?;
                self.children.len().to_string()
            }
            "reap" => {
                self.reap(amount()?).map_err(|e| format!("reap: {e}"))?;
                self.children.len().to_string()
            }
            "fork-exit" => fork_exit(amount()?)
                .map_err(|e| format!("fork-exit: {e}"))?
                .as_nanos()
                .to_string(),
            "threads" => {
                self.threads(amount()?)
                    .map_err(|e| format!("threads: {e}"))?;
                self.children.len().to_string()
            }
            "hop" => {
                let count = amount()?;
                let seconds = amount()?;
                self.hop(count, seconds).map_err(|e| format!("hop: {e}"))?;
                self.children.len().to_string()
            }
            "ignore-sigterm" => {
                // SAFETY: SIG_IGN installs no handler code; single-threaded.
                unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }
                    .map_err(|e| format!("ignore-sigterm: {e}"))?;
                "ignoring".to_owned()
            }
            "exit-on-sigterm" => {
                // SAFETY: the handler only calls _exit, which is
                // async-signal-safe.
                unsafe { signal(Signal::SIGTERM, SigHandler::Handler(exit_on_sigterm)) }
                    .map_err(|e| format!("exit-on-sigterm: {e}"))?;
                "exiting".to_owned()
            }
            "bomb" => {
                let rate = amount()?;
                let log = open_log(words.next())?;
                let usage = words.next().ok_or("a bomb needs a usage file")?;
                let usage = Counter::open(usage)?;
                self.bomb = Some(Bomb::Memory { rate, log, usage });
                "bombing".to_owned()
            }
            "fork-bomb" => {
                let log = open_log(words.next())?;
                self.bomb = Some(Bomb::Tasks { log });
                "forking".to_owned()
            }
            "write" => {
                let bytes = amount()?;
                let path = words.next().ok_or("write needs a path")?;
                write_file(path, bytes).map_err(|e| format!("write {path}: {e}"))?;
                bytes.to_string()
            }
            "read" => {
                let path = words.next().ok_or("read needs a path")?;
                read_file(path)
                    .map_err(|e| format!("read {path}: {e}"))?
                    .to_string()
            }
            "cycle" => {
                let path = words.next().ok_or("cycle needs a path")?;
                File::open(path).map_err(|e| format!("cycle {path}: {e}"))?;
                cycle_aside(path.to_owned());
                "cycling".to_owned()
            }
            "log" => {
                let bytes = amount()?;
                write_log(bytes).map_err(|e| format!("log: {e}"))?;
                bytes.to_string()
            }
            "map-shared" => {
                let path = words.next().ok_or("map-shared needs a path")?;
                let file = File::open(path).map_err(|e| format!("map-shared {path}: {e}"))?;
                map_shared_aside(file);
                "mapping".to_owned()
            }
            "touch" => {
                if self.touched.is_some() {
                    return Err("touch: unmap the last one first".into());
                }
                let bytes = amount()?;
                let rate = words.next().map(str::parse).transpose();
                let rate = rate.map_err(|e| format!("touch: rate: {e}"))?;
                let started = Instant::now();
                let mapping = Mapping::touch(bytes, rate).map_err(|e| format!("touch: {e}"))?;
                let took = started.elapsed();
                self.touched = Some(mapping);
                took.as_nanos().to_string()
            }
            "touch-until" => {
                let bytes = amount()?;
                let level = amount()? as u64;
                let usage = words.next().ok_or("touch-until needs a usage file")?;
                let usage = File::open(usage).map_err(|e| format!("{usage}: {e}"))?;
                let (mapping, touched) = Mapping::touch_until(bytes, level, &usage)
                    .map_err(|e| format!("touch-until: {e}"))?;
                self.touched_until.push(mapping);
                touched
                    .ok_or_else(|| {
                        format!("touch-until: {bytes} touched, usage still below {level}")
                    })?
                    .to_string()
            }
            "unmap" => {
                let mapping = self.touched.take().ok_or("unmap: nothing touched")?;
                let started = Instant::now();
                drop(mapping);
                started.elapsed().as_nanos().to_string()
            }
            "kill-large" => {
                let bytes = amount()?;
                kill_large(bytes)
                    .map_err(|e| format!("kill-large: {e}"))?
                    .as_nanos()
                    .to_string()
            }
            "pid" => std::process::id().to_string(),
            "exit" => return Ok(None),
            other => return Err(format!("unknown command {other:?}")),
        }))
    }

    fn held(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    fn alloc(&mut self, bytes: usize, rate: Option<usize>) {
        let pacer = Pacer::new(rate);
        for chunk in 0..bytes.div_ceil(CHUNK) {
            pacer.wait_for(chunk * CHUNK);
            // Zeroed mmapped memory is not yet backed by pages: writing one
            // byte of each page faults it in and charges it to the memcg.
            let mut chunk = vec![0u8; CHUNK];
            for byte in chunk.iter_mut().step_by(PAGE) {
                *byte = 1;
            }
            self.chunks.push(chunk);
        }
    }

    fn fork(&mut self, count: usize, rate: Option<usize>) -> io::Result<()> {
        let me = std::env::current_exe()?;
        let parent = std::process::id().to_string();
        let pacer = Pacer::new(rate);
        for forked in 0..count {
            pacer.wait_for(forked);
            // spawn returns once the child has exec'd: it exists and is
            // counted in pids.current.
            let child = Command::new(&me)
                .args(["sleep-child", &parent])
                .stdin(Stdio::null())
                // Not the workload's stdout: the test sees EOF there as soon
                // as the workload itself dies.
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            self.children.push(child);
        }
        Ok(())
    }

    fn threads(&mut self, count: usize) -> io::Result<()> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "threads-child",
                &count.to_string(),
                &std::process::id().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        // The child says `ready` once every thread has been spawned: a
        // thread exists (and is counted) when spawn returns.
        let mut ready = String::new();
        if let Some(stdout) = child.stdout.take() {
            io::BufReader::new(stdout).read_line(&mut ready)?;
        }
        if ready.trim() != "ready" {
            child.kill()?;
            child.wait()?;
            return Err(io::Error::other("the child did not start its threads"));
        }
        self.children.push(child);
        Ok(())
    }

    fn hop(&mut self, count: usize, seconds: usize) -> io::Result<()> {
        let child = Command::new(std::env::current_exe()?)
            .args(["hop-root", &count.to_string(), &seconds.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.children.push(child);
        Ok(())
    }

    fn reap(&mut self, count: usize) -> io::Result<()> {
        let keep = self.children.len().saturating_sub(count);
        for mut child in self.children.drain(keep..) {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

/// Has a fresh child fork `count` children one after another
/// ([`forker_child`]); returns how long its forks took.
fn fork_exit(count: usize) -> io::Result<Duration> {
    let output = Command::new(std::env::current_exe()?)
        .args([
            "forker-child",
            &std::process::id().to_string(),
            &count.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    match text.trim().parse() {
        Ok(ns) if output.status.success() => Ok(Duration::from_nanos(ns)),
        _ => Err(io::Error::other(format!(
            "the forker ended {} after {text:?}",
            output.status
        ))),
    }
}

/// Forks `count` children one after another, each exiting at once and
/// reaped before the next, then prints the ns that took.
fn forker_child(parent: Option<i32>, count: usize) -> ! {
    die_with(parent);
    let started = Instant::now();
    for _ in 0..count {
        // SAFETY: this process is single-threaded (freshly exec'd), and the
        // child only calls _exit.
        match unsafe { fork() } {
            // SAFETY: _exit runs no destructors or atexit handlers, which a
            // forked copy must not run twice.
            Ok(ForkResult::Child) => unsafe { libc::_exit(0) },
            Ok(ForkResult::Parent { child }) => {
                if waitpid(child, None).is_err() {
                    std::process::exit(1);
                }
            }
            Err(_) => std::process::exit(1),
        }
    }
    println!("{}", started.elapsed().as_nanos());
    std::process::exit(0);
}

/// Starts a child holding `bytes`, SIGKILLs it once it holds them, and
/// returns how long it took from the signal until it was reaped.
fn kill_large(bytes: usize) -> io::Result<Duration> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "hold-child",
            &std::process::id().to_string(),
            &bytes.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut ready = String::new();
    if let Some(stdout) = child.stdout.take() {
        BufReader::new(stdout).read_line(&mut ready)?;
    }
    if ready.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::other(format!(
            "the child did not get its {bytes} bytes"
        )));
    }
    let started = Instant::now();
    // Child::kill is SIGKILL to a child not yet reaped: never another process.
    child.kill()?;
    child.wait()?;
    Ok(started.elapsed())
}
