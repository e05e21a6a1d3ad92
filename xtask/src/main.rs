//! `cargo xtask`: the project's developer commands. Each one installs what it
//! needs first (see `setup`), so a fresh clone needs nothing else.
mod bench;
mod deploy;
mod fuzz;
mod setup;
mod supply_chain;
mod vm;

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::{Parser, Subcommand};
use setup::Toolchain;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "evictd developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building the eBPF programs needs (idempotent).
    Setup,
    /// Build the agent with its eBPF programs embedded.
    Build {
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
        /// Build exactly what Cargo.lock pins (cargo's --locked): fail
        /// rather than resolve anew. The image build uses it.
        #[arg(long)]
        locked: bool,
    },
    /// Build and run the agent (needs root). Arguments after `--` go to evictd.
    Run {
        #[arg(long)]
        release: bool,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Measure each eBPF program's cost per invocation under memory churn
    /// (needs root; turns kernel.bpf_stats_enabled on for the run).
    BpfCost {
        /// Free/re-touch rounds of 128 MiB.
        #[arg(long, default_value_t = 40)]
        rounds: u32,
        /// Extra agent arguments, e.g. `-- --memory-check-step 1Mi`.
        #[arg(last = true)]
        agent_args: Vec<String>,
    },
    /// A sandbox node with pods of every QoS class, a memory hog, evictd in
    /// event mode, and a timeline of what happened (needs root).
    Demo,
    /// evictd's event mode against polling (10s, 1s, 100ms), a PSI trigger
    /// and cgroup v1 memcg thresholds, on a 2 GiB sandbox node with a memory
    /// bomb at several rates and a fork bomb (needs root). Writes bench.json,
    /// bench.md and bench.png to results/ (release build).
    Bench {
        /// Smoke test: one round at 1 GiB/s and the fork bomb, 2 s idle, on
        /// the debug build, into target/bench-quick; fails unless every mode
        /// produced results.
        #[arg(long)]
        quick: bool,
        /// Where the results go.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// evictd-bench arguments, e.g. `-- --runs 20 --rates 256Mi,1Gi`
        /// (`-- --help` lists them).
        #[arg(last = true)]
        bench_args: Vec<String>,
    },
    /// Run every cargo-fuzz target in fuzz/ for a bounded time (installs
    /// cargo-fuzz when missing) and print what each did.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Targets to run; all when none is named.
        targets: Vec<String>,
    },
    /// Run a command as root in the Linux guest of `cargo xtask test --vm`
    /// (chrooted into this host's /, so host binaries and paths work).
    Vm {
        /// Kernel of the guest (as for `cargo xtask test --vm`).
        #[arg(long, value_name = "VERSION", default_value = "6.1")]
        kernel: String,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Measure each memory trigger the kernel offers: how far past a
    /// threshold it reports, what its programs cost; and PSI and memory.high
    /// on cgroup v2 (needs root; --vm: in the QEMU guest).
    MeasureTriggers {
        /// Crossings measured per hook and scenario.
        #[arg(long, default_value_t = 10)]
        runs: u32,
        /// Measure in the Linux guest of `cargo xtask test --vm`.
        #[arg(long)]
        vm: bool,
        /// Kernel of the guest (as for `cargo xtask test --vm`).
        #[arg(long, value_name = "VERSION", default_value = "6.1", requires = "vm")]
        kernel: String,
    },
    /// Render deploy/ with a pinned kubectl and validate every object against
    /// the Kubernetes OpenAPI schemas (installs the pinned tools under
    /// target/deploy-check on first use).
    DeployCheck,
    /// fmt check, clippy, cargo-deny (licenses, bans, sources; installs it
    /// when missing), unit tests, the deploy/ check, then the privileged
    /// integration tests.
    /// With --vm: only the privileged integration tests, inside a QEMU guest
    /// on another kernel with pure cgroup v2.
    Test {
        /// Skip the integration tests that need root and a real kernel.
        #[arg(long, conflicts_with = "vm")]
        no_privileged: bool,
        /// Run the privileged integration tests in a Linux guest under QEMU
        /// (Debian kernel package, cgroup v2 only) instead of on this host.
        /// Installs QEMU with apt-get when run as root; skips with a message
        /// where QEMU is unavailable.
        #[arg(long)]
        vm: bool,
        /// Kernel series (`6.1`) or exact Debian ABI (`6.1.0-56`) of the
        /// guest: the newest matching linux-image-*-amd64-unsigned package.
        #[arg(long, value_name = "VERSION", default_value = "6.1", requires = "vm")]
        kernel: String,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<ExitCode> {
    match task {
        Task::Setup => {
            setup::ensure()?;
        }
        Task::Build {
            release,
            static_link,
            locked,
        } => {
            let toolchain = setup::ensure()?;
            if static_link {
                let binary = build_static(&toolchain, release, locked)?;
                println!("xtask: static evictd: {}", binary.display());
                let sbom = binary.with_file_name("evictd.cdx.json");
                let components =
                    supply_chain::sbom(&toolchain, &workspace_root(), setup::STATIC_TARGET, &sbom)?;
                println!(
                    "xtask: its SBOM (CycloneDX 1.5, {components} crates): {}",
                    sbom.display()
                );
            } else {
                build(&toolchain, release, locked)?;
            }
        }
        Task::Run { release, args } => {
            let toolchain = setup::ensure()?;
            build(&toolchain, release, false)?;
            if !setup::is_root() {
                bail!(
                    "evictd loads BPF programs and signals pods: run as root (or with CAP_BPF, CAP_PERFMON and CAP_KILL)"
                );
            }
            let binary = target_dir()?
                .join(if release { "release" } else { "debug" })
                .join("evictd");
            // Ctrl-C reaches the agent directly (same process group); wait
            // for it to shut down cleanly and pass its status on.
            let status = Command::new(&binary)
                .args(&args)
                .status()
                .with_context(|| format!("starting {}", binary.display()))?;
            return Ok(ExitCode::from(
                status.code().unwrap_or(1).clamp(0, 255) as u8
            ));
        }
        Task::Test {
            vm: true, kernel, ..
        } => {
            let toolchain = setup::ensure()?;
            vm::test(&toolchain, &target_dir()?, &kernel)?;
        }
        Task::Test { no_privileged, .. } => test(no_privileged)?,
        Task::DeployCheck => {
            let toolchain = setup::ensure()?;
            deploy::check(&toolchain, &workspace_root(), &target_dir()?)?;
        }
        Task::Fuzz { seconds, targets } => fuzz::run(seconds, &targets)?,
        Task::Bench {
            quick,
            out,
            bench_args,
        } => bench::run(quick, out, &bench_args)?,
        Task::Demo => {
            let release = build_release_tools("the demo sandboxes pods in cgroups")?;
            setup::step(
                "demo",
                Command::new(release.join("evictd-demo"))
                    .arg(release.join("evictd"))
                    .arg(release.join("evictd-workload")),
            )?;
        }
        Task::Vm { kernel, command } => {
            let (program, args) = command.split_first().context("no command")?;
            vm::run(&target_dir()?, &kernel, &[PathBuf::from(program)], args)?;
        }
        Task::MeasureTriggers { runs, vm, kernel } => {
            let release = build_release_tools("measuring triggers")?;
            let command = [
                release.join("evictd-memory-triggers"),
                release.join("evictd-workload"),
            ];
            if vm {
                vm::run(&target_dir()?, &kernel, &command, &[runs.to_string()])?;
            } else {
                setup::step(
                    "measure",
                    Command::new(&command[0])
                        .arg(&command[1])
                        .arg(runs.to_string()),
                )?;
            }
        }
        Task::BpfCost { rounds, agent_args } => {
            let release = build_release_tools("measuring BPF programs")?;
            setup::step(
                "measure",
                Command::new(release.join("evictd-bpf-cost"))
                    .arg(release.join("evictd"))
                    .arg(release.join("evictd-workload"))
                    .arg(rounds.to_string())
                    .args(&agent_args),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the agent and the integration crate's tools in release mode and
/// returns their directory; `why_root` says why the task needs root.
fn build_release_tools(why_root: &str) -> Result<PathBuf> {
    build_tools(true, why_root)
}

/// As [`build_release_tools`], in the debug profile.
fn build_debug_tools(why_root: &str) -> Result<PathBuf> {
    build_tools(false, why_root)
}

fn build_tools(release: bool, why_root: &str) -> Result<PathBuf> {
    let toolchain = setup::ensure()?;
    build(&toolchain, release, false)?;
    let mut cargo = toolchain.cargo_host();
    cargo.args(["build", "--package", "evictd-integration", "--bins"]);
    if release {
        cargo.arg("--release");
    }
    setup::step("build the workload tools", &mut cargo)?;
    if !setup::is_root() {
        bail!("{why_root}: run as root");
    }
    Ok(target_dir()?.join(if release { "release" } else { "debug" }))
}

fn build(toolchain: &Toolchain, release: bool, locked: bool) -> Result<()> {
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
    let binary = target_dir()?
        .join(setup::STATIC_TARGET)
        .join(if release { "release" } else { "debug" })
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

fn test(no_privileged: bool) -> Result<()> {
    let toolchain = setup::ensure()?;
    let target = target_dir()?;

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
    supply_chain::deny(&toolchain, &workspace_root())?;
    setup::step("unit tests", toolchain.cargo_host().arg("test"))?;
    deploy::check(&toolchain, &workspace_root(), &target)?;
    if no_privileged {
        println!("xtask: skipping the privileged integration tests (--no-privileged)");
        return Ok(());
    }
    if !setup::is_root() {
        bail!(
            "the integration tests load BPF programs and build cgroups: run `cargo xtask test` as root \
             (or pass --no-privileged to skip them)"
        );
    }
    // The end-to-end tests run the agent binary itself.
    build(&toolchain, false, false)?;
    setup::step(
        "privileged integration tests",
        toolchain.cargo_host().args([
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

fn workspace_root() -> PathBuf {
    // xtask/ is a direct child of the workspace root.
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn target_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")
}
