//! Installs what building Rust eBPF needs, as PLATFORM.md describes: a
//! nightly toolchain with rust-src (for `-Z build-std=core`), and bpf-linker
//! built against that toolchain's own libLLVM (no system LLVM needed).
//! Idempotent; takes well under a second when everything is there.
//! It also installs `protoc` (Debian's protobuf-compiler) for the CRI API's
//! build script. [`ensure_static`] adds what the static (musl) build of the
//! agent needs.
use std::{
    env,
    ffi::OsString,
    fs,
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

/// bpf-linker release known to work with LLVM 22 (see PLATFORM.md).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Names the toolchain that builds the eBPF crate: read here to pin one
/// (the container image pins a dated nightly, as `nightly` moves to newer
/// LLVMs than bpf-linker supports), set for the agent's build.rs.
const TOOLCHAIN_VARIABLE: &str = "EVICTD_EBPF_TOOLCHAIN";

/// Rust target of the static agent (the container image's): musl's libc is
/// linked into the binary.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// Debian package with `musl-gcc`, the C compiler the cc crate uses for
/// [`STATIC_TARGET`] (ring builds C and assembly).
const MUSL_PACKAGE: &str = "musl-tools";

/// Debian package with `protoc`, which the `k8s-cri` crate's build script
/// runs to compile the CRI API's `.proto` files.
const PROTOC_PACKAGE: &str = "protobuf-compiler";

/// Toolchain that builds the eBPF crate.
pub struct Toolchain {
    name: String,
    /// Stable needs RUSTC_BOOTSTRAP=1 for `-Z build-std`.
    bootstrap: bool,
    path: OsString,
}

impl Toolchain {
    /// cargo for host crates, with everything the agent's build.rs needs.
    pub fn cargo_host(&self) -> Command {
        let mut cargo = Command::new(env!("CARGO"));
        self.environment(&mut cargo);
        cargo
    }

    /// PATH with cargo's bin directory first.
    pub fn path(&self) -> &OsString {
        &self.path
    }

    /// cargo of the eBPF toolchain.
    pub fn cargo_ebpf(&self) -> Command {
        let mut cargo = self.cargo_unstable();
        self.environment(&mut cargo);
        cargo
    }

    /// cargo of this toolchain, for what needs unstable flags, without the
    /// agent's eBPF build settings.
    pub fn cargo_unstable(&self) -> Command {
        let mut cargo = Command::new("rustup");
        cargo.args(["run", &self.name, "cargo"]);
        cargo.env("PATH", &self.path);
        if self.bootstrap {
            cargo.env("RUSTC_BOOTSTRAP", "1");
        }
        // rustup's proxy would otherwise keep using the outer toolchain.
        cargo.env_remove("RUSTC").env_remove("CARGO");
        cargo
    }

    fn environment(&self, command: &mut Command) {
        command
            .env("PATH", &self.path)
            // A build that cannot embed the programs fails instead of
            // producing an agent that can only poll.
            .env("EVICTD_REQUIRE_EBPF", "1")
            .env(TOOLCHAIN_VARIABLE, &self.name);
        if self.bootstrap {
            command.env("RUSTC_BOOTSTRAP", "1");
        }
    }
}

/// The toolchain for what needs unstable flags (`-Z build-std` for the eBPF
/// crate, sanitizer coverage for fuzzing): the one [`TOOLCHAIN_VARIABLE`]
/// names, else the installed nightly, else stable with RUSTC_BOOTSTRAP=1.
pub fn unstable_toolchain() -> Result<Toolchain> {
    let path = path_with_cargo_bin()?;
    if let Some(name) = env::var(TOOLCHAIN_VARIABLE)
        .ok()
        .filter(|name| !name.is_empty())
    {
        // Only a nightly takes unstable flags without RUSTC_BOOTSTRAP.
        let bootstrap = !name.starts_with("nightly");
        println!("xtask: toolchain {name} (from {TOOLCHAIN_VARIABLE})");
        return Ok(Toolchain {
            name,
            bootstrap,
            path,
        });
    }
    let installed = output(Command::new("rustup").args(["toolchain", "list"]))?;
    let (name, bootstrap) = if installed.lines().any(|l| l.starts_with("nightly")) {
        ("nightly".to_owned(), false)
    } else {
        println!("xtask: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1");
        ("stable".to_owned(), true)
    };
    Ok(Toolchain {
        name,
        bootstrap,
        path,
    })
}

pub fn ensure() -> Result<Toolchain> {
    let started = Instant::now();
    let toolchain = unstable_toolchain()?;
    let name = &toolchain.name;
    let components = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        name,
    ]))?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        step(
            &format!("install rust-src for {name}"),
            Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", name]),
        )?;
    }
    ensure_protoc()?;
    if !bpf_linker_works(&toolchain.path) {
        install_bpf_linker(&toolchain)?;
        if !bpf_linker_works(&toolchain.path) {
            bail!("bpf-linker was installed but does not start; see the output above");
        }
    }
    println!(
        "xtask: setup ok (toolchain {}, bpf-linker {BPF_LINKER_VERSION}) in {:.1}s",
        toolchain.name,
        started.elapsed().as_secs_f64()
    );
    Ok(toolchain)
}

/// What the static build needs besides [`ensure`]: the [`STATIC_TARGET`]
/// standard library for the toolchain `cargo_host` builds with, and
/// `musl-gcc` (Debian's musl-tools, installed with apt-get as root).
pub fn ensure_static(toolchain: &Toolchain) -> Result<()> {
    // The `rustc` that `cargo_host`'s cargo runs: rustup's proxy on this
    // PATH, resolving the same toolchain (RUSTUP_TOOLCHAIN is inherited).
    let rustc = |args: &[&str]| {
        output(
            Command::new("rustc")
                .env("PATH", &toolchain.path)
                .args(args),
        )
    };
    let libdir = rustc(&["--print", "target-libdir", "--target", STATIC_TARGET])?;
    if !Path::new(libdir.trim()).is_dir() {
        let sysroot = PathBuf::from(rustc(&["--print", "sysroot"])?.trim());
        // rustup keeps each toolchain in a directory named after it.
        let name = sysroot
            .file_name()
            .and_then(|name| name.to_str())
            .with_context(|| format!("no toolchain name in the sysroot {}", sysroot.display()))?;
        step(
            &format!("install the {STATIC_TARGET} target for {name}"),
            Command::new("rustup").args(["target", "add", STATIC_TARGET, "--toolchain", name]),
        )?;
    }
    ensure_debian_tool(
        "musl-gcc",
        MUSL_PACKAGE,
        "the static build needs musl-gcc for the C in ring",
    )
}

/// `protoc`, which building the agent needs for the CRI API (the `k8s-cri`
/// crate's build script compiles its `.proto` files).
pub fn ensure_protoc() -> Result<()> {
    ensure_debian_tool(
        "protoc",
        PROTOC_PACKAGE,
        "building the CRI API (crate k8s-cri, which the agent talks to container runtimes with) needs protoc",
    )
}

/// `binary` on PATH, from Debian's `package`, installed with apt-get as
/// root when missing; `why` says what needs it.
fn ensure_debian_tool(binary: &str, package: &str, why: &str) -> Result<()> {
    if which(binary).is_some() {
        return Ok(());
    }
    ensure!(
        is_root() && which("apt-get").is_some(),
        "{why}: install Debian's {package} (`apt-get install {package}`; as root on Debian, xtask installs it)"
    );
    step(
        "apt-get update",
        Command::new("apt-get").args(["update", "-qq"]),
    )?;
    step(
        &format!("apt-get install {package}"),
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    ensure!(
        which(binary).is_some(),
        "{package} is installed but {binary} is not on PATH"
    );
    Ok(())
}

fn bpf_linker_works(path: &OsString) -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .env("PATH", path)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn install_bpf_linker(toolchain: &Toolchain) -> Result<()> {
    let name = &toolchain.name;
    let sysroot = PathBuf::from(
        output(
            Command::new("rustc")
                .arg(format!("+{name}"))
                .args(["--print", "sysroot"]),
        )?
        .trim(),
    );
    let version = output(Command::new("rustc").arg(format!("+{name}")).arg("-vV"))?;
    let llvm_major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc -vV does not name its LLVM version")?
        .to_owned();
    let library = fs::read_dir(sysroot.join("lib"))
        .with_context(|| format!("listing {}/lib", sysroot.display()))?
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .find(|file| file.starts_with("libLLVM.so.") || file.starts_with("libLLVM-"))
        .with_context(|| format!("no libLLVM in {}/lib", sysroot.display()))?;
    // bpf-linker links against `$LLVM_PREFIX/lib/libLLVM.so` and keeps that
    // directory as its rpath, where the loader then looks for the soname.
    let prefix = cache_dir()?.join(format!("llvm-{name}"));
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for link in ["libLLVM.so", library.as_str()] {
        let link = lib.join(link);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(sysroot.join("lib").join(&library), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    step(
        &format!("build bpf-linker {BPF_LINKER_VERSION} against {library} (about a minute)"),
        Command::new(env!("CARGO"))
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{llvm_major}"),
            ])
            .env("LLVM_PREFIX", &prefix)
            .env("PATH", &toolchain.path),
    )
}

/// `~/.cache/evictd` (or under `$XDG_CACHE_HOME`).
pub fn cache_dir() -> Result<PathBuf> {
    let base = match env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("evictd"))
}

/// PATH with cargo's bin directory first, where `cargo install` puts
/// bpf-linker, even when the caller's PATH lacks it.
fn path_with_cargo_bin() -> Result<OsString> {
    let cargo_home = match env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(env::var_os("HOME").context("HOME is not set")?).join(".cargo"),
    };
    let current = env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![cargo_home.join("bin")];
    paths.extend(env::split_paths(&current));
    env::join_paths(paths).context("building PATH")
}

pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|uids| uids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// An ELF64 executable without a `PT_INTERP` program header needs no
/// dynamic loader: it runs on an empty root (`FROM scratch`, an initramfs).
pub fn is_static_elf(path: &Path) -> Result<bool> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(elf_without_interp(&bytes))
}

/// [`is_static_elf`] on the file's bytes (little-endian ELF64).
fn elf_without_interp(bytes: &[u8]) -> bool {
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
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    const PT_INTERP: u32 = 3;
    (0..usize::from(phnum)).all(|i| {
        let at = phoff as usize + i * usize::from(phentsize);
        bytes
            .get(at..at + 4)
            .is_some_and(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != PT_INTERP)
    })
}

/// `binary` on PATH or in the sbin directories (root's tools).
pub fn which(binary: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
}

/// Runs one announced step; fails quoting the command.
pub fn step(what: &str, command: &mut Command) -> Result<()> {
    step_bounded(what, command, Duration::MAX)
}

/// Like [`step`], but the command is killed (by its pid, and only it) if it
/// runs longer than `limit`.
pub fn step_bounded(what: &str, command: &mut Command, limit: Duration) -> Result<()> {
    bounded_step(what, command, limit, None)
}

/// Like [`step_bounded`], with every line of the command's stdout and of
/// the step's own printed after `[prefix] `: for steps that run side by
/// side.
pub fn step_bounded_prefixed(
    what: &str,
    command: &mut Command,
    limit: Duration,
    prefix: &str,
) -> Result<()> {
    bounded_step(what, command, limit, Some(prefix))
}

fn bounded_step(
    what: &str,
    command: &mut Command,
    limit: Duration,
    prefix: Option<&str>,
) -> Result<()> {
    let tag = prefix
        .map(|prefix| format!("[{prefix}] "))
        .unwrap_or_default();
    println!("{tag}xtask: == {what}");
    let started = Instant::now();
    if prefix.is_some() {
        command.stdout(Stdio::piped());
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let relay = child.stdout.take().map(|stdout| {
        let tag = tag.clone();
        thread::spawn(move || relay_lines(stdout, &tag))
    });
    let status = wait_bounded(&mut child, limit).with_context(|| what.to_owned());
    // The pipe closes with the child, killed or not: the relay ends.
    if let Some(relay) = relay {
        let _ = relay.join();
    }
    let status = status?;
    if !status.success() {
        bail!("{what} failed ({status}): {command:?}");
    }
    println!(
        "{tag}xtask: == {what}: ok in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Prints each line read from `from` after `tag`, whatever its bytes (a
/// serial console's are not always UTF-8), until end of file: a relay that
/// stopped early would leave the writer blocked on a full pipe.
fn relay_lines(from: impl Read, tag: &str) {
    let mut from = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                println!("{tag}{}", text.trim_end_matches(['\n', '\r']));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The stdout of `command` (stderr passes through), which must succeed
/// within `limit`.
pub fn output_bounded(command: &mut Command, limit: Duration) -> Result<String> {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let mut stdout = child.stdout.take().context("stdout not captured")?;
    // Read on a thread: a full pipe would otherwise stall the child and the
    // bounded wait with it.
    let reader = thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let status = wait_bounded(&mut child, limit).with_context(|| format!("{command:?}"))?;
    let text = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reading the output of {command:?}"))?
        .with_context(|| format!("reading the output of {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(text)
}

/// Waits for `child` at most `limit`; past it, SIGKILLs that child (by its
/// pid) and fails.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> Result<ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("killed after {limit:?} (pid {})", child.id());
        }
        thread::sleep(Duration::from_millis(100).min(limit));
    }
}

/// The stdout of `command`, which must succeed.
pub fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("starting {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("command output is not UTF-8")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn cargo_bin_comes_first_on_path() {
        let path = path_with_cargo_bin().unwrap();
        let first = env::split_paths(&path).next().unwrap();
        assert!(first.ends_with(Path::new(".cargo/bin")) || env::var_os("CARGO_HOME").is_some());
    }

    #[test]
    fn a_dynamically_linked_executable_needs_a_loader() {
        // This test binary itself is dynamically linked.
        let me = std::env::current_exe().unwrap();
        assert!(!is_static_elf(&me).unwrap());
    }

    /// An ELF64 header with its program headers right after it, of these types.
    fn elf_with_program_headers(types: &[u32]) -> Vec<u8> {
        let mut elf = vec![0; 64];
        elf[..5].copy_from_slice(b"\x7fELF\x02");
        elf[0x20..0x28].copy_from_slice(&64_u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56_u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&u16::try_from(types.len()).unwrap().to_le_bytes());
        for kind in types {
            let mut header = [0; 56];
            header[..4].copy_from_slice(&kind.to_le_bytes());
            elf.extend_from_slice(&header);
        }
        elf
    }

    #[test]
    fn only_an_elf_without_pt_interp_is_static() {
        const PT_LOAD: u32 = 1;
        const PT_DYNAMIC: u32 = 2;
        const PT_INTERP: u32 = 3;
        // static-pie (musl's default) keeps PT_DYNAMIC for its relocations.
        assert!(elf_without_interp(&elf_with_program_headers(&[
            PT_LOAD, PT_DYNAMIC
        ])));
        assert!(!elf_without_interp(&elf_with_program_headers(&[
            PT_LOAD, PT_INTERP
        ])));
        // Program headers cut off, or no ELF64 at all.
        assert!(!elf_without_interp(
            &elf_with_program_headers(&[PT_LOAD])[..66]
        ));
        assert!(!elf_without_interp(b"#!/bin/sh\n"));
    }
}
