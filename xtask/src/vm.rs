//! `cargo xtask test --vm`: the privileged integration suite inside a Linux
//! guest under QEMU, on a kernel and cgroup layout the host may not have
//! (Debian's 6.1, 6.12 or 7.2 on pure cgroup v2; 6.1 by default). See
//! `shared/VM.md` for the measured recipe this follows.
//!
//! 1. QEMU, a static busybox, cpio, kmod and xz come from apt (installed
//!    when missing and run as root; otherwise the run is skipped, except in
//!    CI, where a skip would hide a red suite).
//! 2. The kernel package is downloaded once into `~/.cache/evictd/vm`; the
//!    uncompressed image (decompressing under emulation costs seconds) and
//!    the virtio/9p modules are kept, the rest of the package is dropped.
//! 3. The host builds the agent and the test executables.
//! 4. A busybox initramfs loads the modules, mounts the host's `/` read-only
//!    over 9p and a writable run directory at its host path, and runs the
//!    test executables chrooted into the host's root: the same binaries, the
//!    same paths. Their output streams to this terminal; the exit status and
//!    the log come back through the run directory.
//!
//! Software emulation (TCG) unless the CPU offers vmx/svm; the guest's
//! deadlines are stretched by `EVICTD_TEST_TIME_SCALE` under TCG. Every step
//! is bounded in time, and only the QEMU this started is ever killed.
use std::{
    collections::BTreeSet,
    fs::{self, File},
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use crate::setup::{self, Toolchain};
use kernel::Kernel;

mod kernel;

/// The guest kernel series when none is named.
pub const DEFAULT_KERNEL: &str = "6.1";
/// What `--kernel all` boots in turn: Debian's cgroup v2 kernels from the
/// oldest supported series to the newest packaged (bookworm's 6.1 and
/// 6.12, trixie-backports' 7.2).
pub const ALL_KERNELS: [&str; 3] = ["6.1", "6.12", "7.2"];
/// The help of every `--kernel`.
pub const KERNEL_HELP: &str = "Kernel of the guest: a series (6.1, 6.12, 7.2: the newest \
     Debian package of it, from bookworm or trixie-backports), an exact Debian version \
     (6.1.0-56, 6.12.117+deb12), a comma-separated list of them (6.1,7.2), or all (6.1, \
     6.12 and 7.2). The tests of several kernels boot side by side, as many at once as \
     the host has cores for (one per guest under software emulation), each line of \
     their output prefixed with the kernel asked for";

/// `--kernel` of the commands that boot the guest with `--vm`.
#[derive(Args)]
pub struct GuestKernel {
    #[arg(
        long,
        value_name = "VERSION",
        default_value = DEFAULT_KERNEL,
        requires = "vm",
        help = KERNEL_HELP
    )]
    pub kernel: String,
}

#[derive(Args)]
pub struct VmArgs {
    #[arg(long, value_name = "VERSION", default_value = DEFAULT_KERNEL, help = KERNEL_HELP)]
    kernel: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `cargo xtask vm -- COMMAND`.
pub fn command(args: &VmArgs) -> Result<()> {
    let (program, rest) = args.command.split_first().context("no command")?;
    run(
        &crate::target_dir()?,
        &args.kernel,
        &[PathBuf::from(program)],
        rest,
    )
}

/// Debian packages the harness runs (binary → package).
const HOST_TOOLS: [(&str, &str); 8] = [
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("busybox", "busybox-static"),
    ("cpio", "cpio"),
    ("modprobe", "kmod"),
    ("xz", "xz-utils"),
    // 6.12's and 7.2's images are zstd-compressed.
    ("zstd", "zstd"),
    ("dpkg-deb", "dpkg"),
    ("mkfs.ext4", "e2fsprogs"),
];
/// Integration test targets the guest does not run, and why.
const HOST_ONLY_TESTS: [(&str, &str); 3] = [
    ("cri_client", DISK_ONLY_REASON),
    ("runtime_disk", DISK_ONLY_REASON),
    (
        "prometheus",
        "it checks what a Prometheus server makes of the agent's metrics and alert rules, \
         which no kernel changes",
    ),
];
const DISK_ONLY_REASON: &str = "they count disk usage, which cgroup v2 does not change, and \
     the guest has no disk: every directory it can write is a tmpfs, which kubelet's rule \
     does not count as disk, and it loads no loop module for runtime_disk's filesystems";
/// The containerd tiers: pods a real containerd runs through CRI, in the
/// guest with kubelet's cgroupfs layout on cgroup v2 (`--containerd-on`
/// picks the guests that run them).
const CONTAINERD_TESTS: [&str; 2] = ["confined_kills", "containerd"];
/// The guest's scratch disk (in the run directory, sparse), and its size.
const SCRATCH_DISK: &str = "scratch.img";
const SCRATCH_DISK_BYTES: u64 = 2 << 30;
/// Guest RAM: the sandbox node tests fill a 512 MiB node; the rest is the
/// guest kernel, the page cache of the host binaries, the test process and
/// the agent. QEMU peaked at 1.07 GB resident for the whole suite.
const GUEST_MEMORY_MIB: u32 = 1536;
/// Under TCG everything runs several times slower than on the host.
const TCG_TIME_SCALE: u32 = 4;
/// Cgroup v2 only, with PSI: what most Kubernetes nodes run. A soft lockup
/// ends the guest at once with both CPUs' stacks in the log (loglevel 5
/// lets the traces through) instead of hanging until the guest's limit.
const KERNEL_COMMAND_LINE: &str = "console=ttyS0 quiet loglevel=5 panic=-1 \
     softlockup_panic=1 softlockup_all_cpu_backtrace=1 \
     cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 psi=1";

/// Bounds of each step (all generous against measured times, for a
/// machine shared with other builds).
const APT_LIMIT: Duration = Duration::from_secs(15 * 60);
const TOOL_LIMIT: Duration = Duration::from_secs(5 * 60);
const BUILD_LIMIT: Duration = Duration::from_secs(60 * 60);
/// One test executable in the guest (the slowest, kill, took about 4
/// minutes).
const GUEST_TEST_LIMIT: Duration = Duration::from_secs(10 * 60);
/// The whole guest: boot, every test executable, power off (about 15
/// minutes); bounded well inside CI's hour.
const GUEST_LIMIT: Duration = Duration::from_secs(30 * 60);

/// The guest's /init. `evictd_run` (from the kernel command line) is the
/// host path of the run directory, mounted read-write at the same path.
const INIT: &str = r#"#!/bin/busybox sh
# evictd's VM guest: reach the host over 9p, run the tests there, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for module in $(cat /modules/order); do
    insmod "/modules/$module" || echo "evictd-vm: insmod $module failed"
done
fail() { echo "evictd-vm: $*"; poweroff -f; }
[ -n "$evictd_run" ] || fail "no evictd_run= on the kernel command line"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 run /run-share || fail "no run share"
# cache=loose: the host's files do not change under the guest, and file
# pages then land in the guest's page cache as on a disk.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro host /host || fail "no host share"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
mount -t tmpfs tmpfs /host/tmp
# containerd's shims bind their sockets under /run/containerd/s whatever its
# configured state directory, and runc keeps its state under /run.
mount -t tmpfs tmpfs /host/run
mount --bind /run-share "/host$evictd_run" || fail "cannot mount the run directory"
# The tests' scratch directory (CARGO_TARGET_TMPDIR) on a disk of its own:
# file pages there are reclaimed and refault as on the host's disk.
mount -t ext4 /dev/vda "/host$evictd_scratch" || fail "cannot mount the scratch disk"
ip link set lo up
# What systemd does on a v2 host: let cgroups below the root use memory and pids.
echo "+memory +pids" > /host/sys/fs/cgroup/cgroup.subtree_control
chroot /host /bin/sh "$evictd_run/run.sh" 2>&1 | tee /run-share/log
poweroff -f
"#;

/// `cargo xtask test --vm --kernel VERSION`; the containerd tiers only in
/// the guests `containerd_on` names (every guest when `None`).
pub fn test(
    toolchain: &Toolchain,
    target: &Path,
    version: &str,
    containerd_on: Option<&str>,
) -> Result<()> {
    let booted = asked_kernels(version)?;
    let containerd_series = containerd_on.map(asked_kernels).transpose()?;
    if let Some(unbooted) = containerd_series
        .iter()
        .flatten()
        .find(|series| !booted.contains(series))
    {
        bail!("--containerd-on {unbooted}: not among the guests --kernel {version} boots");
    }
    if !host_tools_ready()? {
        return Ok(());
    }
    visible_in_guest(target)?;
    let executables = build_tests(toolchain)?;
    let limit = GUEST_TEST_LIMIT.as_secs();
    each_kernel(version, SUITE.side_by_side, |kernel, prefix| {
        let series = prefix.unwrap_or(version);
        let with_containerd = containerd_series
            .as_ref()
            .is_none_or(|named| named.iter().any(|s| s == series));
        let chosen: Vec<_> = executables
            .iter()
            .filter(|(name, _)| with_containerd || !CONTAINERD_TESTS.contains(&name.as_str()))
            .collect();
        let tests = chosen
            .iter()
            .map(|(_, exe)| quoted(exe))
            .collect::<Result<Vec<_>>>()?
            .join(" ");
        let script = format!(
            r#"status=0
for test in {tests}; do
    echo "== $test"
    timeout -k 10 {limit} "$test" --ignored --test-threads=1 || status=1
done
return $status
"#
        );
        let what = format!(
            "{} test executables ({} the containerd tiers)",
            chosen.len(),
            if with_containerd { "with" } else { "without" }
        );
        in_guest(kernel, target, &what, &script, &SUITE, prefix)
            .with_context(|| format!("integration tests in the Linux {} guest", kernel.release))
    })
}

/// The guest's size and time bound, and whether guests of several kernels
/// may boot side by side (not where they measure time).
pub struct GuestSpec {
    pub memory_mib: u32,
    pub limit: Duration,
    pub side_by_side: bool,
}

/// The test suite's guest.
const SUITE: GuestSpec = GuestSpec {
    memory_mib: GUEST_MEMORY_MIB,
    limit: GUEST_LIMIT,
    side_by_side: true,
};

/// `cargo xtask vm`'s: a command that may measure (measure-triggers does).
const COMMAND: GuestSpec = GuestSpec {
    side_by_side: false,
    ..SUITE
};

/// Runs the script `script(run directory)` returns as root in the guest
/// on each kernel `version` names, and returns each kernel's run
/// directory (writable from the guest at the same path); fails if the
/// script fails. `Ok(None)` where QEMU is missing (skipped, as [`test`]).
pub fn run_script(
    target: &Path,
    version: &str,
    spec: &GuestSpec,
    what: &str,
    script: impl Fn(&Path) -> Result<String> + Sync,
) -> Result<Option<Vec<(String, PathBuf)>>> {
    if !host_tools_ready()? {
        return Ok(None);
    }
    visible_in_guest(target)?;
    let runs = Mutex::new(Vec::new());
    each_kernel(version, spec.side_by_side, |kernel, prefix| {
        let run = run_dir(target, kernel);
        in_guest(kernel, target, what, &script(&run)?, spec, prefix)?;
        runs.lock()
            .map_err(|_| anyhow!("a guest's thread panicked"))?
            .push((kernel.release.clone(), run));
        Ok(())
    })?;
    let runs = runs
        .into_inner()
        .map_err(|_| anyhow!("a guest's thread panicked"))?;
    Ok(Some(runs))
}

/// Runs `command` (already built, on this host's filesystem) as root in the
/// guest; fails if it fails. Skips like [`test`] where QEMU is missing.
pub fn run(target: &Path, version: &str, command: &[PathBuf], args: &[String]) -> Result<()> {
    if !host_tools_ready()? {
        return Ok(());
    }
    visible_in_guest(target)?;
    let mut line = command
        .iter()
        .map(|part| quoted(part))
        .collect::<Result<Vec<_>>>()?;
    for arg in args {
        line.push(quoted(Path::new(arg))?);
    }
    let script = format!("{}\n", line.join(" "));
    each_kernel(version, COMMAND.side_by_side, |kernel, prefix| {
        in_guest(kernel, target, &line.join(" "), &script, &COMMAND, prefix)
    })
}

/// Runs `guest` on each kernel `asked` names (see [`KERNEL_HELP`]). One
/// kernel runs with its output as it is; several boot in turn, or with
/// `side_by_side` [`guests_at_once`] at a time, `guest` given the series
/// to prefix their output with; then says how each went and fails if any
/// failed.
fn each_kernel(
    asked: &str,
    side_by_side: bool,
    guest: impl Fn(&Kernel, Option<&str>) -> Result<()> + Sync,
) -> Result<()> {
    let series = asked_kernels(asked)?;
    if let [one] = series.as_slice() {
        return guest(&Kernel::cached(one)?, None);
    }
    // Fetched one after the other: apt and the cache are shared.
    let kernels: Vec<_> = series
        .iter()
        .map(|series| (series.as_str(), Kernel::cached(series)))
        .collect();
    let at_once = if side_by_side { guests_at_once() } else { 1 };
    println!(
        "xtask: == Linux {}: {at_once} guest(s) at a time",
        series.join(", ")
    );
    let mut outcomes = Vec::new();
    for batch in kernels.chunks(at_once) {
        thread::scope(|scope| {
            let running: Vec<_> = batch
                .iter()
                .map(|(series, kernel)| {
                    let guest = &guest;
                    let thread = scope.spawn(move || {
                        let started = Instant::now();
                        let outcome = match kernel {
                            Ok(kernel) => {
                                guest(kernel, Some(series)).map(|()| kernel.release.clone())
                            }
                            Err(e) => Err(anyhow!("{e:#}")),
                        };
                        (outcome, started.elapsed())
                    });
                    (*series, thread)
                })
                .collect();
            for (series, thread) in running {
                let (outcome, elapsed) = thread.join().unwrap_or_else(|_| {
                    (Err(anyhow!("the guest's thread panicked")), Duration::ZERO)
                });
                if let Err(e) = &outcome {
                    eprintln!("xtask: Linux {series}: {e:#}");
                }
                outcomes.push((series, outcome, elapsed));
            }
        });
    }
    let mut failed = Vec::new();
    for (series, outcome, elapsed) in &outcomes {
        let secs = elapsed.as_secs();
        match outcome {
            Ok(release) => println!("xtask: Linux {series}: ok ({release}, {secs}s)"),
            Err(_) => {
                println!("xtask: Linux {series}: FAILED ({secs}s)");
                failed.push(*series);
            }
        }
    }
    if !failed.is_empty() {
        bail!("the guest failed on Linux {}", failed.join(", "));
    }
    Ok(())
}

/// The kernels `asked` names, in order, each once.
pub fn asked_kernels(asked: &str) -> Result<Vec<String>> {
    let mut kernels: Vec<String> = Vec::new();
    for part in asked.split(',').map(str::trim) {
        if part.is_empty() {
            bail!("--kernel {asked:?}: an empty name in the list");
        }
        let named = if part == "all" {
            ALL_KERNELS.to_vec()
        } else {
            vec![part]
        };
        for kernel in named {
            if !kernels.iter().any(|k| k == kernel) {
                kernels.push(kernel.to_owned());
            }
        }
    }
    Ok(kernels)
}

/// Guests that boot side by side: each takes one host thread under TCG
/// (`thread=single`, see [`boot`]), one per vCPU under KVM; never more than
/// the host's cores, so that no guest's deadlines stretch past what
/// `EVICTD_TEST_TIME_SCALE` allows for.
fn guests_at_once() -> usize {
    let cores = host_cores();
    let threads_per_guest = if hardware_virtualization() {
        guest_cpus()
    } else {
        1
    };
    (cores / threads_per_guest).max(1)
}

fn host_cores() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// vCPUs of a guest: two, so that the agent and a workload run at once,
/// as on a node.
fn guest_cpus() -> usize {
    host_cores().min(2)
}

/// The guest mounts a fresh tmpfs on /tmp (the tests write there), which
/// hides a target directory under the host's /tmp: said at once, rather
/// than as a mount error after the build.
fn visible_in_guest(target: &Path) -> Result<()> {
    let existing = target
        .ancestors()
        .find(|path| path.exists())
        .unwrap_or(target);
    let path = existing.canonicalize()?;
    if path.starts_with("/tmp") {
        bail!(
            "{} is under /tmp, which the VM guest covers with its own tmpfs: \
             run the VM tests from a checkout (or CARGO_TARGET_DIR) outside /tmp",
            path.display()
        );
    }
    Ok(())
}

/// Boots `kernel` with a fresh run directory under `target/vm` and runs
/// `script` there; the log stays in the run directory.
fn in_guest(
    kernel: &Kernel,
    target: &Path,
    what: &str,
    script: &str,
    spec: &GuestSpec,
    prefix: Option<&str>,
) -> Result<()> {
    let run = run_dir(target, kernel);
    let result = boot(
        kernel,
        &run,
        &target.join("tmp"),
        what,
        script,
        spec,
        prefix,
    );
    // The initramfs and the scratch disk are made for every run; the log
    // stays.
    let _ = fs::remove_dir_all(run.join("initramfs"));
    let _ = fs::remove_file(run.join("initramfs.cpio"));
    let _ = fs::remove_file(run.join(SCRATCH_DISK));
    println!("xtask: vm log: {}", run.join("log").display());
    result
}

/// One directory per kernel: `--kernel all` boots several.
fn run_dir(target: &Path, kernel: &Kernel) -> PathBuf {
    target
        .join("vm")
        .join(format!("run-{}-{}", std::process::id(), kernel.release))
}

/// Whether QEMU and the initramfs tools are there, installing them where
/// possible. `Ok(false)`: skip, with the reason printed.
fn host_tools_ready() -> Result<bool> {
    let missing = || -> Vec<&str> {
        HOST_TOOLS
            .iter()
            .filter(|(binary, _)| setup::which(binary).is_none())
            .map(|(_, package)| *package)
            .chain((!static_busybox()).then_some("busybox-static"))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let needed = missing();
    if needed.is_empty() {
        return Ok(true);
    }
    if setup::is_root() && setup::which("apt-get").is_some() {
        println!(
            "xtask: the VM needs {}; installing with apt-get",
            needed.join(" ")
        );
        setup::step_bounded(
            "apt-get update",
            Command::new("apt-get").args(["update", "-qq"]),
            APT_LIMIT,
        )?;
        setup::step_bounded(
            "apt-get install",
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&needed)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            APT_LIMIT,
        )?;
    }
    let still = missing();
    if still.is_empty() {
        return Ok(true);
    }
    let message = format!(
        "the VM tests need {} (Debian: apt-get install {}; as root `cargo xtask test --vm` installs them)",
        still.join(", "),
        still.join(" ")
    );
    if std::env::var_os("CI").is_some() {
        bail!("{message}; CI must not skip the VM suite");
    }
    println!("xtask: SKIPPING the VM tests: {message}");
    Ok(false)
}

/// `/bin/busybox` from busybox-static: the initramfs has no libc.
fn static_busybox() -> bool {
    setup::which("busybox").is_some_and(|path| setup::is_static_elf(&path).unwrap_or(false))
}

/// Builds the agent and the integration test executables on the host (the
/// guest runs them from the host's filesystem) and returns the executables.
fn build_tests(toolchain: &Toolchain) -> Result<Vec<(String, PathBuf)>> {
    setup::step_bounded(
        "build evictd",
        toolchain
            .cargo_host()
            .args(["build", "--package", "evictd"]),
        BUILD_LIMIT,
    )?;
    println!("xtask: == build the integration tests");
    let json = setup::output_bounded(
        toolchain.cargo_host().args([
            "test",
            "--package",
            "evictd-integration",
            "--no-run",
            "--message-format=json",
        ]),
        BUILD_LIMIT,
    )?;
    let executables: Vec<(String, PathBuf)> = json
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["profile"]["test"] == true
        })
        .filter(|message| {
            let name = message["target"]["name"].as_str().unwrap_or("");
            let host_only = HOST_ONLY_TESTS.iter().find(|(test, _)| *test == name);
            if let Some((_, reason)) = host_only {
                println!("xtask: the {name} tests run on the host only: {reason}");
            }
            host_only.is_none()
        })
        .filter_map(|message| {
            let name = message["target"]["name"].as_str()?;
            let executable = message["executable"].as_str()?;
            Some((name.to_owned(), PathBuf::from(executable)))
        })
        .collect();
    if executables.is_empty() {
        bail!("cargo built no test executable for evictd-integration");
    }
    Ok(executables)
}

/// Boots the guest on `kernel` and runs `script` in it (chrooted into the
/// host's `/`, with `scratch` on an ext4 disk of its own); fails unless it
/// exits 0. With a `prefix`, each line of the guest's output is printed
/// after it.
fn boot(
    kernel: &Kernel,
    run: &Path,
    scratch: &Path,
    what: &str,
    script: &str,
    spec: &GuestSpec,
    prefix: Option<&str>,
) -> Result<()> {
    let _ = fs::remove_dir_all(run);
    fs::create_dir_all(run).with_context(|| format!("creating {}", run.display()))?;
    let run = run.canonicalize()?;
    let run_text = run.to_str().context("run directory path is not UTF-8")?;
    if run_text.contains(|c: char| c.is_whitespace() || c == '\'') {
        bail!("the run directory {run_text:?} must not contain spaces or quotes");
    }
    let kvm = hardware_virtualization();
    let time_scale = if kvm { 1 } else { TCG_TIME_SCALE };
    fs::write(run.join("run.sh"), guest_script(&run, script, time_scale)?)?;
    let initramfs = run.join("initramfs.cpio");
    build_initramfs(kernel, &run.join("initramfs"), &initramfs)?;
    fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let scratch = scratch.canonicalize()?;
    let scratch_text = scratch.to_str().context("scratch path is not UTF-8")?;
    if scratch_text.contains(|c: char| c.is_whitespace() || c == '\'') {
        bail!("the scratch directory {scratch_text:?} must not contain spaces or quotes");
    }
    let disk = run.join(SCRATCH_DISK);
    // Sparse: it takes on the host what the tests write.
    File::create(&disk)?.set_len(SCRATCH_DISK_BYTES)?;
    setup::step_bounded(
        "mkfs.ext4 (the guest's scratch disk)",
        Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk),
        TOOL_LIMIT,
    )?;
    let disk_text = disk.to_str().context("run directory path is not UTF-8")?;

    let mut qemu = Command::new("qemu-system-x86_64");
    if kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        // One host thread for every vCPU: with a thread per vCPU, a vCPU can
        // keep running its stale translation of kernel text that the other
        // just patched (a tracepoint's static key flipping as evictd attaches
        // or detaches its precise hooks), and both spin there for good
        // (soft lockups at `__alloc_pages`, an int3 retried forever). A 256
        // MiB translation cache instead of QEMU's 1 GiB default: the guest
        // runs a kernel and a few binaries, and the host is shared.
        qemu.args(["-accel", "tcg,thread=single,tb-size=256"]);
    }
    let cpus = guest_cpus();
    qemu.args([
        "-smp",
        &cpus.to_string(),
        "-m",
        &spec.memory_mib.to_string(),
    ])
    .arg("-kernel")
    .arg(&kernel.image)
    .arg("-initrd")
    .arg(&initramfs)
    .args([
        "-append",
        &format!("{KERNEL_COMMAND_LINE} evictd_run={run_text} evictd_scratch={scratch_text}"),
    ])
    .args([
        "-drive",
        &format!(
            "file={},format=raw,if=virtio,cache=unsafe",
            disk_text.replace(',', ",,")
        ),
    ])
    .args([
        "-display",
        "none",
        "-serial",
        "stdio",
        "-monitor",
        "none",
        "-no-reboot",
    ])
    .args(["-virtfs", &virtfs(run_text, "run", false)])
    .args(["-virtfs", &virtfs("/", "host", true)])
    .stdin(Stdio::null());
    let accel = if kvm {
        "KVM"
    } else {
        "TCG, software emulation"
    };
    let started = Instant::now();
    let step = format!(
        "guest Linux {} ({accel}, {cpus} CPUs, {} MiB, cgroup v2): {what}",
        kernel.release, spec.memory_mib
    );
    match prefix {
        None => setup::step_bounded(&step, &mut qemu, spec.limit)?,
        Some(prefix) => setup::step_bounded_prefixed(&step, &mut qemu, spec.limit, prefix)?,
    }
    let status = fs::read_to_string(run.join("exit-code"))
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok())
        .context("the guest left no exit code (it crashed or ran out of memory; see the log)")?;
    println!(
        "xtask: vm: exit status {status} in the guest after {:.0}s",
        started.elapsed().as_secs_f64()
    );
    if status != 0 {
        bail!("exit status {status} in the guest");
    }
    Ok(())
}

/// `-virtfs` for a 9p share of host `path` (commas doubled, as QEMU's
/// option syntax wants). `remap` keeps inode numbers of the host's several
/// filesystems apart.
fn virtfs(path: &str, tag: &str, readonly: bool) -> String {
    let mut option = format!(
        "local,path={},mount_tag={tag},security_model=none,multidevs=remap",
        path.replace(',', ",,")
    );
    if readonly {
        option.push_str(",readonly=on");
    }
    option
}

/// KVM only where the CPU offers it (VM.md: `/dev/kvm` can exist without).
fn hardware_virtualization() -> bool {
    let flags = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    Path::new("/dev/kvm").exists()
        && flags
            .lines()
            .filter(|line| line.starts_with("flags"))
            .any(|line| line.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// `path` in single quotes for the guest's shell.
pub fn quoted(path: &Path) -> Result<String> {
    let text = path.to_str().context("path is not UTF-8")?;
    if text.contains('\'') {
        bail!("path {text:?} contains a quote");
    }
    Ok(format!("'{text}'"))
}

/// The script the guest runs, chrooted into the host's root: `body`, its
/// exit status written back to the run directory.
fn guest_script(run: &Path, body: &str, time_scale: u32) -> Result<String> {
    Ok(format!(
        r#"# Written by cargo xtask; runs in the guest, chrooted into the host's /.
export EVICTD_TEST_TIME_SCALE={time_scale} RUST_BACKTRACE=1 HOME=/tmp
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "guest: Linux $(uname -r), $(nproc) CPUs, $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup"
main() {{
{body}}}
main
echo $? > {run}/exit-code
"#,
        run = quoted(run)?,
    ))
}

/// A newc cpio of busybox, /init and the kernel's 9p modules.
fn build_initramfs(kernel: &Kernel, tree: &Path, archive: &Path) -> Result<()> {
    for dir in [
        "bin",
        "modules",
        "proc",
        "sys",
        "dev",
        "host",
        "run-share",
        "tmp",
    ] {
        fs::create_dir_all(tree.join(dir))?;
    }
    let busybox = setup::which("busybox").context("busybox")?;
    fs::copy(&busybox, tree.join("bin/busybox"))?;
    let init = tree.join("init");
    fs::write(&init, INIT)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let mut order = String::new();
    for module in &kernel.modules {
        let name = module.file_name().context("module name")?;
        fs::copy(module, tree.join("modules").join(name))?;
        order += &format!("{}\n", name.to_string_lossy());
    }
    fs::write(tree.join("modules/order"), order)?;
    let mut entries = Vec::new();
    list_tree(tree, Path::new("."), &mut entries)?;
    let out = fs::File::create(archive)?;
    let mut cpio = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(tree)
        .stdin(Stdio::piped())
        .stdout(out)
        .spawn()
        .context("starting cpio")?;
    if let Some(mut stdin) = cpio.stdin.take() {
        let list = entries.join("\n") + "\n";
        thread::spawn(move || {
            let _ = stdin.write_all(list.as_bytes());
        });
    }
    let status = setup::wait_bounded(&mut cpio, TOOL_LIMIT)?;
    if !status.success() {
        bail!("cpio failed ({status})");
    }
    Ok(())
}

fn list_tree(root: &Path, relative: &Path, entries: &mut Vec<String>) -> Result<()> {
    entries.push(relative.display().to_string());
    let dir = root.join(relative);
    if dir.is_dir() {
        let mut children: Vec<_> = fs::read_dir(&dir)?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        children.sort();
        for child in children {
            list_tree(root, &relative.join(child), entries)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_list_is_each_named_kernel_once_in_order() {
        assert_eq!(asked_kernels("7.2").unwrap(), ["7.2"]);
        assert_eq!(asked_kernels("7.2, 6.1").unwrap(), ["7.2", "6.1"]);
        assert_eq!(asked_kernels("6.1,all").unwrap(), ["6.1", "6.12", "7.2"]);
        assert!(asked_kernels("6.1,").is_err());
        assert!(asked_kernels("").is_err());
    }

    #[test]
    fn virtfs_doubles_commas_in_paths() {
        assert_eq!(
            virtfs("/a,b", "run", false),
            "local,path=/a,,b,mount_tag=run,security_model=none,multidevs=remap"
        );
        assert!(virtfs("/", "host", true).ends_with(",readonly=on"));
    }
}
