//! `cargo xtask test`: fmt, clippy, unit tests, the deploy/ check and the
//! privileged integration tests on this host; or, with `--vm`, the
//! privileged tests in a QEMU guest on another kernel.
use anyhow::{Result, bail};
use clap::Args;

use crate::{agent, deploy, setup, supply_chain, vm};

/// Where the integration tests find the Prometheus server
/// (tests/src/prometheus.rs reads it).
const PROMETHEUS_ENV: &str = "EVICTD_PROMETHEUS";

#[derive(Args)]
pub struct TestArgs {
    /// Skip the integration tests that need root and a real kernel.
    #[arg(long, conflicts_with = "vm")]
    no_privileged: bool,
    /// Run the privileged integration tests in a Linux guest under QEMU
    /// (Debian kernel package, cgroup v2 only) instead of on this host.
    /// Installs QEMU with apt-get when run as root; skips with a message
    /// where QEMU is unavailable.
    #[arg(long)]
    vm: bool,
    #[command(flatten)]
    kernel: vm::GuestKernel,
    /// With --vm: the guests (kernel series, comma-separated, among
    /// --kernel's) that also run the containerd tiers (default: every
    /// guest). CI names the guest that ends first, so that the two side by
    /// side still end together.
    #[arg(long, value_name = "VERSIONS", requires = "vm")]
    containerd_on: Option<String>,
}

pub fn run(args: &TestArgs) -> Result<()> {
    let toolchain = setup::ensure()?;
    let target = crate::target_dir()?;
    if args.vm {
        return vm::test(
            &toolchain,
            &target,
            &args.kernel.kernel,
            args.containerd_on.as_deref(),
        );
    }
    setup::step(
        "rustfmt",
        toolchain
            .cargo_host()
            .args(["fmt", "--all", "--", "--check"]),
    )?;
    setup::step(
        "clippy (host crates)",
        toolchain
            .cargo_host()
            .args(["clippy", "--all-targets", "--", "-D", "warnings"]),
    )?;
    setup::step(
        "clippy (eBPF crate)",
        toolchain
            .cargo_ebpf()
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
            )
            .args(["clippy", "--package", "evictd-ebpf", "--release"])
            .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
            .arg("--target-dir")
            .arg(target.join("ebpf-clippy"))
            .args(["--", "-D", "warnings"]),
    )?;
    supply_chain::deny(&toolchain, &crate::workspace_root())?;
    setup::step("unit tests", toolchain.cargo_host().arg("test"))?;
    deploy::check(&toolchain, &crate::workspace_root(), &target)?;
    if args.no_privileged {
        println!("xtask: skipping the privileged integration tests (--no-privileged)");
        return Ok(());
    }
    if !setup::is_root() {
        bail!(
            "the integration tests load BPF programs and build cgroups: run `cargo xtask test` as root \
             (or pass --no-privileged to skip them)"
        );
    }
    // The end-to-end tests run the agent binary itself, and a real
    // Prometheus (the one deploy-check unpacked).
    agent::build(&toolchain, false, false)?;
    let prometheus = deploy::prometheus(&target)?;
    setup::step(
        "privileged integration tests",
        toolchain
            .cargo_host()
            .env(PROMETHEUS_ENV, &prometheus)
            .args([
                "test",
                "--package",
                "evictd-integration",
                "--",
                "--ignored",
                // They share the kernel's cgroup and BPF state.
                "--test-threads=1",
            ]),
    )
}
