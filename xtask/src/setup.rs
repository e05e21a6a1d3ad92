//! Installs what building Rust eBPF needs, as PLATFORM.md describes: a
//! nightly toolchain with rust-src (for `-Z build-std=core`), and bpf-linker
//! built against that toolchain's own libLLVM (no system LLVM needed).
//! Idempotent; takes well under a second when everything is there.
use std::{
    env,
    ffi::OsString,
    fs,
    io::Read as _,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// bpf-linker release known to work with LLVM 22 (see PLATFORM.md).
const BPF_LINKER_VERSION: &str = "0.13.0";

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
            .env("EVICTD_EBPF_TOOLCHAIN", &self.name);
        if self.bootstrap {
            command.env("RUSTC_BOOTSTRAP", "1");
        }
    }
}

/// The installed nightly, or stable with RUSTC_BOOTSTRAP=1 where there is
/// none: the toolchain for what needs unstable flags (`-Z build-std` for
/// the eBPF crate, sanitizer coverage for fuzzing).
pub fn unstable_toolchain() -> Result<Toolchain> {
    let path = path_with_cargo_bin()?;
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

/// Runs one announced step; fails quoting the command.
pub fn step(what: &str, command: &mut Command) -> Result<()> {
    step_bounded(what, command, Duration::MAX)
}

/// Like [`step`], but the command is killed (by its pid, and only it) if it
/// runs longer than `limit`.
pub fn step_bounded(what: &str, command: &mut Command, limit: Duration) -> Result<()> {
    println!("xtask: == {what}");
    let started = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let status = wait_bounded(&mut child, limit).with_context(|| what.to_owned())?;
    if !status.success() {
        bail!("{what} failed ({status}): {command:?}");
    }
    println!(
        "xtask: == {what}: ok in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
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

fn output(command: &mut Command) -> Result<String> {
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
}
