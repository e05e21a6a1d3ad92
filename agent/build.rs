//! Builds the eBPF programs (crate `evictd-ebpf`) for bpfel-unknown-none and
//! places the object in OUT_DIR, where `bpf.rs` embeds it.
//!
//! Where bpf-linker is missing (a plain `cargo check` or clippy on a machine
//! that never ran `cargo xtask setup`), an empty object is written instead so
//! the host code still type-checks; loading it fails at run time with a clear
//! error. `cargo xtask` sets EVICTD_REQUIRE_EBPF=1, which turns that case into
//! a build failure, so nothing it builds can carry the empty object.
//! AYA_BUILD_SKIP=1 (aya-build's own switch) asks for the empty object on
//! purpose: `cargo xtask fuzz` builds only the parsers, under sanitizers.
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, bail};
use aya_build::{Package, Toolchain};

const REQUIRE: &str = "EVICTD_REQUIRE_EBPF";
const SKIP: &str = "AYA_BUILD_SKIP";
/// Toolchain used for the eBPF crate (needs `-Z build-std`); `stable` works
/// too when RUSTC_BOOTSTRAP=1 is set, see README.
const TOOLCHAIN: &str = "EVICTD_EBPF_TOOLCHAIN";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed={REQUIRE}");
    println!("cargo:rerun-if-env-changed={TOOLCHAIN}");
    println!("cargo:rerun-if-env-changed={SKIP}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let required = env::var(REQUIRE).is_ok_and(|v| v == "1");
    if env::var(SKIP).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        if required {
            bail!("{SKIP} and {REQUIRE} are both set: build the programs or skip them, not both");
        }
        return write_stub(&out_dir);
    }
    let linker_found = which_bpf_linker();
    if !linker_found {
        if required {
            bail!("{REQUIRE}=1 but bpf-linker is not on PATH; run `cargo xtask setup`");
        }
        println!(
            "cargo:warning=bpf-linker not found: building evictd without its eBPF programs \
             (run `cargo xtask build` for a working agent)"
        );
        return write_stub(&out_dir);
    }
    let toolchain = env::var(TOOLCHAIN).unwrap_or_else(|_| "nightly".to_owned());
    let root_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?)
        .join("../ebpf")
        .canonicalize()
        .context("locating the ebpf crate")?;
    let root_dir = root_dir.to_str().context("ebpf crate path is not UTF-8")?;
    aya_build::build_ebpf(
        [Package {
            name: "evictd-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}

/// The empty object `bpf.rs` embeds when the programs are not built.
fn write_stub(out_dir: &std::path::Path) -> anyhow::Result<()> {
    fs::write(out_dir.join("evictd"), []).context("writing the stub eBPF object")
}

fn which_bpf_linker() -> bool {
    env::var_os("PATH")
        .is_some_and(|paths| env::split_paths(&paths).any(|dir| dir.join("bpf-linker").is_file()))
}
