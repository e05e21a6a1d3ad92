//! `cargo xtask build` and `cargo xtask run`: the agent with its eBPF
//! programs embedded, for this host or as one static binary (the container
//! image's).
use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Args;

use crate::setup::{self, Toolchain};

#[derive(Args)]
pub struct BuildArgs {
    /// Build with cargo's release profile.
    #[arg(long)]
    release: bool,
    /// Build one statically linked binary for x86_64-unknown-linux-musl,
    /// the container image's (installs that Rust target, and as root
    /// Debian's musl-tools, when missing); checks it needs no dynamic
    /// loader and runs `--version`, and prints its path.
    #[arg(long = "static")]
    static_link: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// Build with cargo's release profile.
    #[arg(long)]
    release: bool,
    /// Arguments for evictd.
    #[arg(last = true)]
    args: Vec<String>,
}

/// `cargo xtask build`.
pub fn build_command(args: &BuildArgs) -> Result<()> {
    let toolchain = setup::ensure()?;
    if args.static_link {
        let binary = build_static(&toolchain, args.release)?;
        println!("xtask: static evictd: {}", binary.display());
        Ok(())
    } else {
        build(&toolchain, args.release)
    }
}

/// `cargo xtask run`: builds the agent and runs it in the foreground,
/// passing its exit status on.
pub fn run_command(args: &RunArgs) -> Result<ExitCode> {
    let toolchain = setup::ensure()?;
    build(&toolchain, args.release)?;
    if !setup::is_root() {
        bail!(
            "evictd loads BPF programs: run as root (or with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)"
        );
    }
    let binary = crate::target_dir()?
        .join(profile_dir(args.release))
        .join("evictd");
    // Ctrl-C reaches the agent directly (same process group); wait for it to
    // shut down cleanly and pass its status on.
    let status = Command::new(&binary)
        .args(&args.args)
        .status()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

/// The target directory's subdirectory of a profile.
pub fn profile_dir(release: bool) -> &'static str {
    if release { "release" } else { "debug" }
}

pub fn build(toolchain: &Toolchain, release: bool) -> Result<()> {
    let mut cargo = toolchain.cargo_host();
    cargo.args(["build", "--package", "evictd"]);
    if release {
        cargo.arg("--release");
    }
    setup::step("build evictd", &mut cargo)
}

/// Builds the agent for [`setup::STATIC_TARGET`], checks that it needs no
/// dynamic loader (the image is `FROM scratch`) and that it runs, and
/// returns its path.
fn build_static(toolchain: &Toolchain, release: bool) -> Result<PathBuf> {
    setup::ensure_static(toolchain)?;
    let mut cargo = toolchain.cargo_host();
    cargo.args([
        "build",
        "--package",
        "evictd",
        "--target",
        setup::STATIC_TARGET,
    ]);
    if release {
        cargo.arg("--release");
    }
    setup::step("build evictd (static)", &mut cargo)?;
    let binary = crate::target_dir()?
        .join(setup::STATIC_TARGET)
        .join(profile_dir(release))
        .join("evictd");
    ensure!(
        setup::is_static_elf(&binary)?,
        "{} is not statically linked (no ELF64, or it names a dynamic loader in PT_INTERP)",
        binary.display()
    );
    let version = setup::output(Command::new(&binary).arg("--version"))?;
    println!(
        "xtask: {} is static (no PT_INTERP) and runs: {}",
        binary.display(),
        version.trim()
    );
    Ok(binary)
}
