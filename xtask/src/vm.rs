//! `cargo xtask test --vm`: the privileged integration suite inside a Linux
//! guest under QEMU, on a kernel and cgroup layout the host may not have
//! (Debian's 6.1 on pure cgroup v2 by default). See `shared/VM.md` for the
//! measured recipe this follows.
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
    fs,
    io::{Read as _, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::setup::{self, Toolchain};

/// Debian packages the harness runs (binary → package).
const HOST_TOOLS: [(&str, &str); 6] = [
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("busybox", "busybox-static"),
    ("cpio", "cpio"),
    ("modprobe", "kmod"),
    ("xz", "xz-utils"),
    ("dpkg-deb", "dpkg"),
];
/// Modules the guest loads to reach its 9p shares (with their dependencies).
const GUEST_MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];
/// Guest RAM: the sandbox node tests fill a 512 MiB node; the rest is the
/// guest kernel, the test process and the agent. Costs about a third of it
/// on the host (untouched pages are never backed).
const GUEST_MEMORY_MIB: u32 = 1536;
/// Under TCG everything runs several times slower than on the host.
const TCG_TIME_SCALE: u32 = 4;
/// Cgroup v2 only, with PSI: what most Kubernetes nodes run.
const KERNEL_COMMAND_LINE: &str = "console=ttyS0 quiet loglevel=3 panic=-1 \
     cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 psi=1";

/// Bounds of each step (all generous against measured times, for a
/// machine shared with other builds).
const APT_LIMIT: Duration = Duration::from_secs(15 * 60);
const TOOL_LIMIT: Duration = Duration::from_secs(5 * 60);
const BUILD_LIMIT: Duration = Duration::from_secs(60 * 60);
/// One test executable in the guest (the slowest took about a minute).
const GUEST_TEST_LIMIT: Duration = Duration::from_secs(20 * 60);
/// The whole guest: boot, every test executable, power off.
const GUEST_LIMIT: Duration = Duration::from_secs(50 * 60);

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
mount --bind /run-share "/host$evictd_run" || fail "cannot mount the run directory"
ip link set lo up
# What systemd does on a v2 host: let cgroups below the root use memory and pids.
echo "+memory +pids" > /host/sys/fs/cgroup/cgroup.subtree_control
chroot /host /bin/sh "$evictd_run/run.sh" 2>&1 | tee /run-share/log
poweroff -f
"#;

/// `cargo xtask test --vm --kernel VERSION`.
pub fn test(toolchain: &Toolchain, target: &Path, version: &str) -> Result<()> {
    if !host_tools_ready()? {
        return Ok(());
    }
    let kernel = Kernel::cached(version)?;
    let executables = build_tests(toolchain)?;
    let tests = executables
        .iter()
        .map(|exe| quoted(exe))
        .collect::<Result<Vec<_>>>()?
        .join(" ");
    let limit = GUEST_TEST_LIMIT.as_secs();
    let script = format!(
        r#"status=0
for test in {tests}; do
    echo "== $test"
    timeout -k 10 {limit} "$test" --ignored --test-threads=1 || status=1
done
return $status
"#
    );
    let what = format!("{} test executables", executables.len());
    in_guest(&kernel, target, &what, &script)
        .with_context(|| format!("integration tests in the Linux {} guest", kernel.release))
}

/// Runs `command` (already built, on this host's filesystem) as root in the
/// guest; fails if it fails. Skips like [`test`] where QEMU is missing.
pub fn run(target: &Path, version: &str, command: &[PathBuf], args: &[String]) -> Result<()> {
    if !host_tools_ready()? {
        return Ok(());
    }
    let kernel = Kernel::cached(version)?;
    let mut line = command
        .iter()
        .map(|part| quoted(part))
        .collect::<Result<Vec<_>>>()?;
    for arg in args {
        line.push(quoted(Path::new(arg))?);
    }
    let script = format!("{}\n", line.join(" "));
    in_guest(&kernel, target, &line.join(" "), &script)
}

/// Boots `kernel` with a fresh run directory under `target/vm` and runs
/// `script` there; the log stays in the run directory.
fn in_guest(kernel: &Kernel, target: &Path, what: &str, script: &str) -> Result<()> {
    let run = target
        .join("vm")
        .join(format!("run-{}", std::process::id()));
    let result = boot(kernel, &run, what, script);
    // The initramfs is rebuilt for every run; the log stays.
    let _ = fs::remove_dir_all(run.join("initramfs"));
    let _ = fs::remove_file(run.join("initramfs.cpio"));
    println!("xtask: vm log: {}", run.join("log").display());
    result
}

/// Whether QEMU and the initramfs tools are there, installing them where
/// possible. `Ok(false)`: skip, with the reason printed.
fn host_tools_ready() -> Result<bool> {
    let missing = || -> Vec<&str> {
        HOST_TOOLS
            .iter()
            .filter(|(binary, _)| which(binary).is_none())
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
    if setup::is_root() && which("apt-get").is_some() {
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
    which("busybox").is_some_and(|path| is_static_elf(&path).unwrap_or(false))
}

/// An ELF64 executable without a `PT_INTERP` program header needs no
/// dynamic loader.
fn is_static_elf(path: &Path) -> Result<bool> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if !bytes.starts_with(b"\x7fELF\x02") {
        return Ok(false);
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return Ok(false);
    };
    const PT_INTERP: u32 = 3;
    Ok((0..usize::from(phnum)).all(|i| {
        let at = phoff as usize + i * usize::from(phentsize);
        bytes
            .get(at..at + 4)
            .is_some_and(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != PT_INTERP)
    }))
}

fn which(binary: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
}

/// A guest kernel in the cache: its image, its release, and the modules
/// the initramfs loads, in load order.
struct Kernel {
    image: PathBuf,
    release: String,
    modules: Vec<PathBuf>,
}

impl Kernel {
    /// The newest Debian `linux-image-<VERSION>…-amd64-unsigned` package
    /// (VERSION is `6.1`, or exact: `6.1.0-56`), downloaded and unpacked
    /// once. Offline, the newest one already in the cache.
    fn cached(version: &str) -> Result<Self> {
        let cache = setup::cache_dir()?.join("vm");
        fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
        let mut listed = newest_package(version);
        if listed.is_err() && setup::is_root() {
            // A fresh machine may have no package lists yet.
            setup::step_bounded(
                "apt-get update",
                Command::new("apt-get").args(["update", "-qq"]),
                APT_LIMIT,
            )?;
            listed = newest_package(version);
        }
        let package = match listed {
            Ok(package) => package,
            Err(e) => newest_cached(&cache, version).with_context(|| {
                format!(
                    "no kernel package for {version:?} from apt ({e:#}) nor in {}",
                    cache.display()
                )
            })?,
        };
        let dir = cache.join(&package);
        if !dir.join("complete").exists() {
            unpack(&package, &dir)?;
        }
        let release = fs::read_to_string(dir.join("release"))?.trim().to_owned();
        let order = fs::read_to_string(dir.join("modules/order"))?;
        let modules = order
            .lines()
            .map(|name| dir.join("modules").join(name))
            .collect();
        let image = ["vmlinux", "vmlinuz"]
            .map(|name| dir.join(name))
            .into_iter()
            .find(|path| path.exists())
            .context("no kernel image in the cache")?;
        println!(
            "xtask: guest kernel {release} ({package}) from {}",
            dir.display()
        );
        Ok(Self {
            image,
            release,
            modules,
        })
    }
}

/// Debian's generic amd64 flavour only: the cloud flavour has no 9p.
fn package_matches(name: &str, version: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("linux-image-")
        .and_then(|rest| rest.strip_suffix("-amd64-unsigned"))
    else {
        return false;
    };
    // rest is e.g. 6.1.0-56: a version and an ABI number, nothing else.
    let Some((kernel, abi)) = rest.split_once('-') else {
        return false;
    };
    let exact = rest == version;
    let series = kernel
        .strip_prefix(version)
        .is_some_and(|tail| tail.starts_with('.'));
    (exact || series) && !abi.is_empty() && abi.chars().all(|c| c.is_ascii_digit())
}

/// Newest first: by kernel version, then ABI number.
fn package_order(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

fn newest_package(version: &str) -> Result<String> {
    let names = setup::output_bounded(
        Command::new("apt-cache").args(["pkgnames", "linux-image-"]),
        TOOL_LIMIT,
    )?;
    names
        .lines()
        .filter(|name| package_matches(name, version))
        .max_by_key(|name| package_order(name))
        .map(str::to_owned)
        .with_context(|| format!("apt knows no linux-image-{version}*-amd64-unsigned package"))
}

fn newest_cached(cache: &Path, version: &str) -> Result<String> {
    fs::read_dir(cache)?
        .flatten()
        .filter(|entry| entry.path().join("complete").exists())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| package_matches(name, version))
        .max_by_key(|name| package_order(name))
        .context("nothing cached")
}

/// Downloads `package` into `dir` and keeps what booting needs.
fn unpack(package: &str, dir: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    setup::step_bounded(
        &format!("download {package}"),
        Command::new("apt-get")
            // Downloading into a directory the _apt sandbox user cannot
            // write needs this, or apt warns and falls back to root anyway.
            .args(["download", "-qq", "-o", "APT::Sandbox::User=root", package])
            .current_dir(dir),
        APT_LIMIT,
    )?;
    let deb = fs::read_dir(dir)?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let root = dir.join("root");
    setup::step_bounded(
        "unpack the kernel package",
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        TOOL_LIMIT,
    )?;
    let release = fs::read_dir(root.join("lib/modules"))?
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .next()
        .context("the package has no lib/modules/<release>")?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    match decompress_image(&vmlinuz, &dir.join("vmlinux")) {
        Ok(()) => {}
        Err(e) => {
            println!("xtask: booting the compressed image (slower under TCG): {e:#}");
            fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
        }
    }
    let modules = dir.join("modules");
    fs::create_dir_all(&modules)?;
    let order = module_order(&root, &release)?;
    let mut names = Vec::new();
    for source in order {
        let name = source
            .file_name()
            .and_then(|n| n.to_str())
            .context("module file name")?;
        let (name, compressed) = match name.strip_suffix(".xz") {
            Some(plain) => (plain.to_owned(), true),
            None => (name.to_owned(), false),
        };
        // busybox insmod reads plain modules only (newer Debian kernels
        // ship them xz-compressed).
        if compressed {
            xz_decompress(&source, None, &modules.join(&name))?;
        } else {
            fs::copy(&source, modules.join(&name))?;
        }
        names.push(name);
    }
    fs::write(modules.join("order"), names.join("\n") + "\n")?;
    fs::write(dir.join("release"), &release)?;
    fs::remove_dir_all(&root)?;
    fs::remove_file(&deb)?;
    fs::write(dir.join("complete"), "")?;
    Ok(())
}

/// Module files to insmod, dependencies first, for [`GUEST_MODULES`];
/// modules built into the kernel are left out.
fn module_order(root: &Path, release: &str) -> Result<Vec<PathBuf>> {
    // The package ships no modules.dep: make one for modprobe to read.
    setup::step_bounded(
        "depmod",
        Command::new("depmod").arg("-b").arg(root).arg(release),
        TOOL_LIMIT,
    )?;
    let mut order: Vec<PathBuf> = Vec::new();
    for module in GUEST_MODULES {
        let text = setup::output_bounded(
            Command::new("modprobe").arg("-d").arg(root).args([
                "-S",
                release,
                "--show-depends",
                module,
            ]),
            TOOL_LIMIT,
        )?;
        for line in text.lines() {
            let Some(path) = line
                .strip_prefix("insmod ")
                .and_then(|r| r.split_whitespace().next())
            else {
                continue; // "builtin <name>"
            };
            let path = PathBuf::from(path);
            if !order.contains(&path) {
                order.push(path);
            }
        }
    }
    Ok(order)
}

/// The uncompressed kernel (an ELF that QEMU boots through its PVH entry)
/// from the xz stream inside a bzImage: decompressing it in the guest takes
/// seconds under TCG, here a second once.
fn decompress_image(vmlinuz: &Path, vmlinux: &Path) -> Result<()> {
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    let image = fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let start = image
        .windows(XZ_MAGIC.len())
        .position(|w| w == XZ_MAGIC)
        .context("no xz stream in the kernel image")?;
    xz_decompress(vmlinuz, Some(&image[start..]), vmlinux)?;
    let mut magic = [0u8; 4];
    fs::File::open(vmlinux)?.read_exact(&mut magic)?;
    if &magic != b"\x7fELF" {
        let _ = fs::remove_file(vmlinux);
        bail!("the decompressed kernel is not an ELF image");
    }
    Ok(())
}

/// `xz -dc --single-stream` of `input` (or of the file `source`) into
/// `output`; trailing data after the stream (a bzImage's) is ignored.
fn xz_decompress(source: &Path, input: Option<&[u8]>, output: &Path) -> Result<()> {
    let out = fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut xz = Command::new("xz");
    xz.args(["-dc", "--single-stream"]).stdout(out);
    match input {
        Some(_) => xz.stdin(Stdio::piped()),
        None => xz.stdin(fs::File::open(source)?),
    };
    let mut child = xz.spawn().context("starting xz")?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        let bytes = bytes.to_vec();
        // Fed from a thread so a full pipe cannot stall the bounded wait.
        thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let status = setup::wait_bounded(&mut child, TOOL_LIMIT)
        .with_context(|| format!("decompressing {}", source.display()))?;
    if !status.success() {
        bail!("xz failed on {} ({status})", source.display());
    }
    Ok(())
}

/// Builds the agent and the integration test executables on the host (the
/// guest runs them from the host's filesystem) and returns the executables.
fn build_tests(toolchain: &Toolchain) -> Result<Vec<PathBuf>> {
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
    let executables: Vec<PathBuf> = json
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["profile"]["test"] == true
        })
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .collect();
    if executables.is_empty() {
        bail!("cargo built no test executable for evictd-integration");
    }
    Ok(executables)
}

/// Boots the guest on `kernel` and runs `script` in it (chrooted into the
/// host's `/`); fails unless it exits 0.
fn boot(kernel: &Kernel, run: &Path, what: &str, script: &str) -> Result<()> {
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

    let mut qemu = Command::new("qemu-system-x86_64");
    if kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        qemu.args(["-accel", "tcg,thread=multi"]);
    }
    let cpus = thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    qemu.args([
        "-smp",
        &cpus.to_string(),
        "-m",
        &GUEST_MEMORY_MIB.to_string(),
    ])
    .arg("-kernel")
    .arg(&kernel.image)
    .arg("-initrd")
    .arg(&initramfs)
    .args([
        "-append",
        &format!("{KERNEL_COMMAND_LINE} evictd_run={run_text}"),
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
    setup::step_bounded(
        &format!(
            "guest Linux {} ({accel}, {cpus} CPUs, {GUEST_MEMORY_MIB} MiB, cgroup v2): {what}",
            kernel.release
        ),
        &mut qemu,
        GUEST_LIMIT,
    )?;
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
fn quoted(path: &Path) -> Result<String> {
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
    let busybox = which("busybox").context("busybox")?;
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
    fn picks_the_generic_flavour_of_the_asked_series() {
        let version = "6.1";
        for name in [
            "linux-image-6.1.0-56-amd64-unsigned",
            "linux-image-6.1.0-9-amd64-unsigned",
        ] {
            assert!(package_matches(name, version), "{name}");
        }
        for name in [
            "linux-image-6.1.0-56-cloud-amd64-unsigned",
            "linux-image-6.1.0-56-rt-amd64-unsigned",
            "linux-image-6.12.0-1-amd64-unsigned",
            "linux-image-6.1.0-56-amd64",
            "linux-image-6.1.0-56-amd64-dbg",
        ] {
            assert!(!package_matches(name, version), "{name}");
        }
        assert!(package_matches(
            "linux-image-6.1.0-56-amd64-unsigned",
            "6.1.0-56"
        ));
        assert!(!package_matches(
            "linux-image-6.1.0-55-amd64-unsigned",
            "6.1.0-56"
        ));
        let newest = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-56-amd64-unsigned",
        ]
        .into_iter()
        .max_by_key(|name| package_order(name));
        assert_eq!(newest, Some("linux-image-6.1.0-56-amd64-unsigned"));
    }

    #[test]
    fn virtfs_doubles_commas_in_paths() {
        assert_eq!(
            virtfs("/a,b", "run", false),
            "local,path=/a,,b,mount_tag=run,security_model=none,multidevs=remap"
        );
        assert!(virtfs("/", "host", true).ends_with(",readonly=on"));
    }

    #[test]
    fn busybox_from_busybox_static_needs_no_loader() {
        // This test binary itself is dynamically linked.
        let me = std::env::current_exe().unwrap();
        assert!(!is_static_elf(&me).unwrap());
    }
}
