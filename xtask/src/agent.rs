//! `cargo xtask build` and `cargo xtask run`: the agent with its eBPF
//! programs embedded, for this host or as one static binary (the container
//! image's).
use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Args;

use crate::{
    setup::{self, Toolchain},
    supply_chain,
};

#[derive(Args)]
pub struct BuildArgs {
    /// Build with cargo's release profile.
    #[arg(long)]
    release: bool,
    /// Build one statically linked binary for x86_64-unknown-linux-musl,
    /// the container image's (installs that Rust target, and as root
    /// Debian's musl-tools, when missing); checks it needs no dynamic
    /// loader and runs `--version`, writes its CycloneDX SBOM beside it
    /// (`evictd.cdx.json`), and prints both paths.
    #[arg(long = "static")]
    static_link: bool,
    /// Build exactly what Cargo.lock pins (cargo's --locked): fail rather
    /// than resolve anew. The image build uses it.
    #[arg(long)]
    locked: bool,
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
        let binary = build_static(&toolchain, args.release, args.locked)?;
        println!("xtask: static evictd: {}", binary.display());
        let sbom = binary.with_file_name("evictd.cdx.json");
        let components = supply_chain::sbom(
            &toolchain,
            &crate::workspace_root(),
            setup::STATIC_TARGET,
            &sbom,
        )?;
        println!(
            "xtask: its SBOM (CycloneDX 1.5, {components} crates): {}",
            sbom.display()
        );
        Ok(())
    } else {
        build(&toolchain, args.release, args.locked)
    }
}

/// `cargo xtask run`: builds the agent and runs it in the foreground,
/// passing its exit status on.
pub fn run_command(args: &RunArgs) -> Result<ExitCode> {
    let toolchain = setup::ensure()?;
    build(&toolchain, args.release, false)?;
    if !setup::is_root() {
        bail!(
            "evictd loads BPF programs and signals pods: run as root (or with CAP_BPF, CAP_PERFMON and CAP_KILL)"
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

/// Builds the agent for this host; `locked` is cargo's `--locked`.
pub fn build(toolchain: &Toolchain, release: bool, locked: bool) -> Result<()> {
    let mut cargo = toolchain.cargo_host();
    cargo.args(["build", "--package", "evictd"]);
    if release {
        cargo.arg("--release");
    }
    if locked {
        cargo.arg("--locked");
    }
    setup::step("build evictd", &mut cargo)
}

/// Builds the agent for [`setup::STATIC_TARGET`], checks that it needs no
/// dynamic loader (the image is `FROM scratch`) and that it runs, and
/// returns its path.
fn build_static(toolchain: &Toolchain, release: bool, locked: bool) -> Result<PathBuf> {
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
    if locked {
        cargo.arg("--locked");
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
