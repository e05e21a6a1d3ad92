//! What goes into evictd, checked and listed:
//! - `cargo deny --frozen check licenses bans sources` against deny.toml
//!   (offline: the crates come from the lock file and the local cache),
//!   with cargo-deny installed from crates.io at a pinned version;
//! - a CycloneDX SBOM of the static binary, written beside it by
//!   `cargo xtask build --release --static`, from `cargo metadata` and
//!   Cargo.lock (see [`sbom`] for why not `cargo cyclonedx`).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::setup::{self, Toolchain};

/// The cargo-deny release deny.toml is written for.
const CARGO_DENY_VERSION: &str = "0.20.2";

/// Installs cargo-deny when missing (or another version), then checks the
/// dependency graph's licenses, bans and sources.
pub fn deny(toolchain: &Toolchain, root: &Path) -> Result<()> {
    let installed = Command::new("cargo-deny")
        .arg("--version")
        .env("PATH", toolchain.path())
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
    if installed.as_deref() != Some(&format!("cargo-deny {CARGO_DENY_VERSION}")) {
        setup::step(
            &format!("install cargo-deny {CARGO_DENY_VERSION} from crates.io"),
            toolchain
                .cargo_host()
                .args(["install", "--locked", "--version", CARGO_DENY_VERSION])
                .arg("cargo-deny")
                // Its release profile optimizes fully with fat LTO in one
                // codegen unit: minutes of CI on two cores for a tool that
                // reads a few hundred manifests. Built unoptimized it
                // compiles in 40% of the CPU time and checks evictd's graph
                // in under 3 s (docs/operations.md, Supply chain, has the numbers).
                .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
                .env("CARGO_PROFILE_RELEASE_LTO", "false")
                .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "256")
                .env("CARGO_PROFILE_RELEASE_DEBUG", "0"),
        )?;
    }
    // --frozen reads only what is on disk: fetch every locked crate first.
    setup::step(
        "fetch the locked crates",
        toolchain
            .cargo_host()
            .args(["fetch", "--locked"])
            .current_dir(root),
    )?;
    setup::step(
        "cargo deny check licenses bans sources",
        toolchain
            .cargo_host()
            .args(["deny", "--frozen", "check", "licenses", "bans", "sources"])
            .current_dir(root),
    )
}

/// Writes a CycloneDX 1.5 SBOM of the `evictd` binary built for `target`
/// to `out`: every crate from Cargo.lock that the build used, with its
/// version, package URL, license expression and the registry's SHA-256.
/// Crates linked into the binary (the agent's normal dependencies, and the
/// eBPF programs' crates, whose bytecode the binary embeds) are `required`;
/// build scripts' and proc-macros' crates, used only to build it, are
/// `excluded`, CycloneDX's scope for what does not ship.
///
/// Generated here rather than by `cargo cyclonedx`: installing that from
/// crates.io compiles for about 290 CPU-seconds (docs/operations.md, Supply chain),
/// which CI would pay on every run, for what `cargo metadata` and the lock
/// file already say.
pub fn sbom(toolchain: &Toolchain, root: &Path, target: &str, out: &Path) -> Result<usize> {
    let metadata = setup::output(
        toolchain
            .cargo_host()
            .args([
                "metadata",
                "--format-version",
                "1",
                "--locked",
                "--filter-platform",
                target,
            ])
            .current_dir(root),
    )?;
    let metadata: Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    let lock = fs::read_to_string(root.join("Cargo.lock")).context("reading Cargo.lock")?;
    let bom = bill_of_materials(&metadata, &checksums(&lock))?;
    let count = bom["components"].as_array().map_or(0, Vec::len);
    fs::write(out, serde_json::to_vec_pretty(&bom)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(count)
}

/// `(name, version)` -> the registry's SHA-256, from Cargo.lock's
/// `[[package]]` entries (crates from the registry carry a `checksum`).
fn checksums(lock: &str) -> BTreeMap<(String, String), String> {
    let mut checksums = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|line| {
                let (name, value) = line.split_once(" = ")?;
                (name.trim() == key).then(|| value.trim().trim_matches('"').to_owned())
            })
        };
        if let (Some(name), Some(version), Some(checksum)) =
            (field("name"), field("version"), field("checksum"))
        {
            checksums.insert((name, version), checksum);
        }
    }
    checksums
}

/// Dependencies of `id` in the resolve graph whose kinds include one of
/// `kinds` (`null` for normal, `"build"`).
fn dependencies<'a>(nodes: &'a BTreeMap<&str, &Value>, id: &str, kinds: &[Value]) -> Vec<&'a str> {
    nodes
        .get(id)
        .and_then(|node| node["deps"].as_array())
        .into_iter()
        .flatten()
        .filter(|dep| {
            dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|kind| kinds.contains(&kind["kind"]))
        })
        .filter_map(|dep| dep["pkg"].as_str())
        .collect()
}

/// Everything reachable from `start` through `kinds` edges, not entering
/// packages `stop` rejects (those are still returned, but not walked).
fn closure<'a>(
    nodes: &'a BTreeMap<&str, &Value>,
    start: &[&'a str],
    kinds: &[Value],
    stop: &dyn Fn(&str) -> bool,
) -> BTreeSet<&'a str> {
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut todo: Vec<&str> = start.to_vec();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) || stop(id) {
            continue;
        }
        todo.extend(dependencies(nodes, id, kinds));
    }
    seen
}

fn bill_of_materials(
    metadata: &Value,
    checksums: &BTreeMap<(String, String), String>,
) -> Result<Value> {
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .context("cargo metadata without packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata without a resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let id_of = |name: &str| {
        packages
            .iter()
            .find(|(_, p)| p["name"] == name && p["source"].is_null())
            .map(|(id, _)| *id)
            .with_context(|| format!("no workspace package {name}"))
    };
    let agent = id_of("evictd")?;
    let programs = id_of("evictd-ebpf")?;
    let is_proc_macro = |id: &str| {
        packages[id]["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.contains(&json!("proc-macro")))
            })
    };
    let normal = [Value::Null];
    let any = [Value::Null, json!("build")];
    // In the binary: the agent's runtime closure and the eBPF programs',
    // leaving out proc-macros and what only they use.
    let shipped = closure(&nodes, &[agent, programs], &normal, &|id| is_proc_macro(id));
    let shipped: BTreeSet<&str> = shipped
        .into_iter()
        .filter(|id| !is_proc_macro(id))
        .collect();
    let all = closure(&nodes, &[agent], &any, &|_| false);

    let reference = |id: &str| {
        let package = packages[id];
        let name = package["name"].as_str().unwrap_or_default();
        let version = package["version"].as_str().unwrap_or_default();
        format!("pkg:cargo/{name}@{version}")
    };
    let mut components = Vec::new();
    for &id in all.iter().filter(|id| **id != agent) {
        let package = packages[id];
        let name = package["name"].as_str().unwrap_or_default();
        let version = package["version"].as_str().unwrap_or_default();
        let mut component = json!({
            "type": "library",
            "bom-ref": reference(id),
            "name": name,
            "version": version,
            "purl": reference(id),
            "scope": if shipped.contains(id) { "required" } else { "excluded" },
        });
        if let Some(license) = package["license"].as_str() {
            component["licenses"] = json!([{"expression": license}]);
        }
        match checksums.get(&(name.to_owned(), version.to_owned())) {
            Some(sha256) => component["hashes"] = json!([{"alg": "SHA-256", "content": sha256}]),
            // Only the workspace's own crates come without one.
            None if package["source"].is_null() => {}
            None => bail!("{name} {version}: no checksum in Cargo.lock"),
        }
        if let Some(repository) = package["repository"].as_str() {
            component["externalReferences"] = json!([{"type": "vcs", "url": repository}]);
        }
        components.push(component);
    }
    let dependencies: Vec<Value> = all
        .iter()
        .map(|&id| {
            let depends_on: BTreeSet<String> = dependencies(&nodes, id, &any)
                .into_iter()
                .map(reference)
                .collect();
            json!({"ref": reference(id), "dependsOn": depends_on})
        })
        .collect();
    let agent_package = packages[agent];
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "cargo xtask build --static"}]},
            "component": {
                "type": "application",
                "bom-ref": reference(agent),
                "name": "evictd",
                "version": agent_package["version"],
                "purl": reference(agent),
                "licenses": [{"expression": agent_package["license"]}],
            },
        },
        "components": components,
        "dependencies": dependencies,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(name: &str, proc_macro: bool, registry: bool) -> Value {
        json!({
            "id": format!("{name}-id"), "name": name, "version": "1.0.0",
            "license": "MIT", "repository": format!("https://example.org/{name}"),
            "source": if registry { json!("registry+https://github.com/rust-lang/crates.io-index") } else { Value::Null },
            "targets": [{"kind": [if proc_macro { "proc-macro" } else { "lib" }]}],
        })
    }

    fn node(name: &str, deps: &[(&str, Value)]) -> Value {
        let deps: Vec<Value> = deps
            .iter()
            .map(|(dep, kind)| json!({"pkg": format!("{dep}-id"), "dep_kinds": [{"kind": kind}]}))
            .collect();
        json!({"id": format!("{name}-id"), "deps": deps})
    }

    #[test]
    fn shipped_crates_are_required_and_build_only_ones_excluded() {
        let metadata = json!({
            "packages": [
                package("evictd", false, false), package("evictd-ebpf", false, false),
                package("tokio", false, true), package("serde_derive", true, true),
                package("syn", false, true), package("cc", false, true),
                package("aya-ebpf", false, true), package("criterion", false, true),
            ],
            "resolve": {"nodes": [
                node("evictd", &[("tokio", Value::Null), ("serde_derive", Value::Null),
                                 ("cc", json!("build")), ("evictd-ebpf", json!("build")),
                                 ("criterion", json!("dev"))]),
                node("evictd-ebpf", &[("aya-ebpf", Value::Null)]),
                node("serde_derive", &[("syn", Value::Null)]),
                node("tokio", &[]), node("syn", &[]), node("cc", &[]),
                node("aya-ebpf", &[]), node("criterion", &[]),
            ]},
        });
        let lock = "version = 4\n\n[[package]]\nname = \"tokio\"\nversion = \"1.0.0\"\n\
                    checksum = \"ab12\"\n\n[[package]]\nname = \"evictd\"\nversion = \"1.0.0\"\n";
        let mut sums = checksums(lock);
        for name in ["serde_derive", "syn", "cc", "aya-ebpf"] {
            sums.insert((name.into(), "1.0.0".into()), "00".into());
        }
        let bom = bill_of_materials(&metadata, &sums).unwrap();
        let scope = |name: &str| {
            bom["components"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .map(|c| c["scope"].as_str().unwrap().to_owned())
        };
        assert_eq!(scope("tokio").as_deref(), Some("required"));
        assert_eq!(scope("aya-ebpf").as_deref(), Some("required"));
        assert_eq!(scope("evictd-ebpf").as_deref(), Some("required"));
        assert_eq!(scope("serde_derive").as_deref(), Some("excluded"));
        assert_eq!(scope("syn").as_deref(), Some("excluded"));
        assert_eq!(scope("cc").as_deref(), Some("excluded"));
        assert_eq!(
            scope("criterion"),
            None,
            "dev-dependencies are not built into it"
        );
        let tokio = bom["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "tokio")
            .unwrap();
        assert_eq!(tokio["purl"], "pkg:cargo/tokio@1.0.0");
        assert_eq!(tokio["hashes"][0]["content"], "ab12");
        assert_eq!(bom["metadata"]["component"]["name"], "evictd");
    }

    #[test]
    fn a_registry_crate_without_a_checksum_is_an_error() {
        let metadata = json!({
            "packages": [package("evictd", false, false), package("evictd-ebpf", false, false),
                         package("tokio", false, true)],
            "resolve": {"nodes": [node("evictd", &[("tokio", Value::Null)]),
                                  node("evictd-ebpf", &[]), node("tokio", &[])]},
        });
        let error = bill_of_materials(&metadata, &BTreeMap::new()).unwrap_err();
        assert!(error.to_string().contains("tokio"), "{error}");
    }
}
