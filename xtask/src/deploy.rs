//! `cargo xtask deploy-check`: renders every kustomization under deploy/
//! with a pinned kubectl, validates each rendered object against the
//! Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields
//! fail), checks what no schema covers (the PodMonitor, a CRD, against the
//! DaemonSet it scrapes) and has evictd itself parse the eviction config.
//! Offline once the pinned tools are cached under target/deploy-check.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::Deserialize as _;
use serde_json::Value;

use crate::setup::{self, Toolchain};

/// kubectl from Debian bookworm (the only registry here that carries one):
/// apt verifies it against the signed archive, and the digest below pins
/// the exact file. Its kustomize is v2.0.3, the oldest any supported kubectl
/// embeds, so what renders here renders everywhere; a newer `kubectl` on
/// PATH renders the same kustomizations too.
const KUBECTL_PACKAGE: &str = "kubernetes-client";
const KUBECTL_PACKAGE_VERSION: &str = "1.20.5+really1.20.2-1.1+deb12u1";
const KUBECTL_PACKAGE_SHA256: &str =
    "087c42dc26c847740043cdaa8b16db666be5591a1da957f822922aa1b677494e";

/// Kubernetes releases whose schemas every object must satisfy: the oldest
/// API the agent's client speaks (k8s-openapi's v1_33) and the newest the
/// pinned validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.34.0"];

/// The kustomizations users apply (README, Deploying).
const KUSTOMIZATIONS: [&str; 2] = ["deploy", "deploy/monitoring"];

pub fn check(toolchain: &Toolchain, root: &Path, target: &Path) -> Result<()> {
    let work = target.join("deploy-check");
    fs::create_dir_all(&work)?;
    let pinned = pinned_kubectl(&work)?;
    let validator = validator(root, &work)?;
    let mut renderers = vec![(format!("kubectl {KUBECTL_PACKAGE_VERSION}"), pinned)];
    if let Some(version) = kubectl_on_path() {
        renderers.push((
            format!("kubectl on PATH ({version})"),
            PathBuf::from("kubectl"),
        ));
    }
    for (renderer, kubectl) in &renderers {
        let mut objects = Vec::new();
        for kustomization in KUSTOMIZATIONS {
            objects.extend(render(kubectl, &root.join(kustomization), renderer)?);
        }
        let (core, custom): (Vec<Value>, Vec<Value>) =
            objects.into_iter().partition(is_kubernetes_api);
        let file = work.join("rendered.yaml");
        let text: Vec<String> = core
            .iter()
            .map(serde_yaml_ng::to_string)
            .collect::<Result<_, _>>()?;
        fs::write(&file, text.join("---\n"))?;
        for version in KUBERNETES_VERSIONS {
            setup::step(
                &format!("validate what {renderer} rendered against Kubernetes {version}"),
                Command::new(&validator)
                    .args(["--strict", "--kubernetes-version", version])
                    .arg(&file),
            )?;
        }
        for object in &custom {
            check_custom(object, &core)?;
        }
    }
    setup::step(
        "evictd parses deploy/eviction.yaml",
        toolchain
            .cargo_host()
            .args(["run", "--quiet", "--package", "evictd", "--", "thresholds"])
            .arg("--config")
            .arg(root.join("deploy/eviction.yaml")),
    )
}

/// The pinned kubectl, downloaded (checksum verified) and unpacked once.
fn pinned_kubectl(work: &Path) -> Result<PathBuf> {
    let dir = work.join(format!("kubectl-{KUBECTL_PACKAGE_VERSION}"));
    let kubectl = dir.join("usr/bin/kubectl");
    if kubectl.is_file() {
        return Ok(kubectl);
    }
    let package = format!("{KUBECTL_PACKAGE}={KUBECTL_PACKAGE_VERSION}");
    let download = |update: bool| -> Result<()> {
        if update {
            setup::step("apt-get update", Command::new("apt-get").arg("update"))?;
        }
        setup::step(
            &format!("download {package}"),
            Command::new("apt-get")
                .args(["download", &package])
                .current_dir(work),
        )
    };
    // A fresh machine may not have the package lists yet.
    if download(false).is_err() {
        ensure!(
            setup::is_root(),
            "apt-get cannot find {package}: run `apt-get update` (root) and retry"
        );
        download(true)?;
    }
    let deb = fs::read_dir(work)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(KUBECTL_PACKAGE) && n.ends_with(".deb"))
        })
        .context("apt-get download left no .deb")?;
    let digest = sha256(&deb)?;
    if digest != KUBECTL_PACKAGE_SHA256 {
        fs::remove_file(&deb)?;
        bail!(
            "{}: sha256 {digest}, expected {KUBECTL_PACKAGE_SHA256}",
            deb.display()
        );
    }
    setup::step(
        "unpack kubectl",
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir),
    )?;
    fs::remove_file(&deb)?;
    Ok(kubectl)
}

fn sha256(file: &Path) -> Result<String> {
    let output = Command::new("sha256sum")
        .arg(file)
        .output()
        .context("running sha256sum")?;
    ensure!(output.status.success(), "sha256sum {}", file.display());
    let text = String::from_utf8(output.stdout)?;
    text.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

/// kubernetes-validate and its dependencies, at the pinned versions, in a
/// virtualenv of their own.
fn validator(root: &Path, work: &Path) -> Result<PathBuf> {
    let venv = work.join("venv");
    let validator = venv.join("bin/kubernetes-validate");
    let requirements = root.join("xtask/deploy-check-requirements.txt");
    let stamp = venv.join("requirements.txt");
    if validator.is_file() && fs::read(&stamp).ok() == Some(fs::read(&requirements)?) {
        return Ok(validator);
    }
    setup::step(
        "create the validator's virtualenv",
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )?;
    setup::step(
        "install kubernetes-validate",
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--no-deps", "--requirement"])
            .arg(&requirements),
    )?;
    fs::copy(&requirements, &stamp)?;
    Ok(validator)
}

/// The version of a `kubectl` on PATH, if there is one.
fn kubectl_on_path() -> Option<String> {
    let output = Command::new("kubectl")
        .args(["version", "--client", "--output", "json"])
        .output()
        .ok()?;
    let version: Value = serde_json::from_slice(&output.stdout).ok()?;
    version["clientVersion"]["gitVersion"]
        .as_str()
        .map(str::to_owned)
}

fn render(kubectl: &Path, dir: &Path, renderer: &str) -> Result<Vec<Value>> {
    println!("xtask: == {renderer}: kubectl kustomize {}", dir.display());
    let output = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| format!("starting {}", kubectl.display()))?;
    ensure!(
        output.status.success(),
        "{renderer}: kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)?;
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let object = Value::deserialize(document)
            .with_context(|| format!("{renderer}: rendered {}", dir.display()))?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    ensure!(!objects.is_empty(), "{} rendered nothing", dir.display());
    Ok(objects)
}

/// Whether the object's API is one the Kubernetes schemas describe (core
/// `v1` and the `*.k8s.io` and built-in groups), not a CRD's.
fn is_kubernetes_api(object: &Value) -> bool {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    match api_version.split_once('/') {
        None => true,
        Some((group, _)) => !group.contains('.') || group.ends_with(".k8s.io"),
    }
}

/// Custom resources have no schema in kubernetes-validate and their CRDs
/// are not vendored here: each kind is checked for what makes it work
/// against the objects it refers to, or the check fails on an unknown kind.
fn check_custom(object: &Value, core: &[Value]) -> Result<()> {
    let kind = object["kind"].as_str().unwrap_or_default();
    ensure!(
        kind == "PodMonitor" && object["apiVersion"] == "monitoring.coreos.com/v1",
        "{kind} ({}): no check for this custom resource",
        object["apiVersion"]
    );
    let daemonset = core
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .context("no DaemonSet for the PodMonitor to scrape")?;
    ensure!(
        object["metadata"]["namespace"] == daemonset["metadata"]["namespace"],
        "the PodMonitor is in another namespace than the DaemonSet"
    );
    let selector = object["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("PodMonitor without spec.selector.matchLabels")?;
    let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    for (key, value) in selector {
        ensure!(
            &labels[key] == value,
            "PodMonitor selects {key}={value}, the DaemonSet's pods are labelled {labels}"
        );
    }
    let ports: Vec<&Value> = daemonset["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .map(|p| &p["name"])
        .collect();
    let endpoints = object["spec"]["podMetricsEndpoints"]
        .as_array()
        .context("PodMonitor without podMetricsEndpoints")?;
    for endpoint in endpoints {
        ensure!(
            ports.contains(&&endpoint["port"]),
            "PodMonitor scrapes port {}, the DaemonSet's container ports are {ports:?}",
            endpoint["port"]
        );
        ensure!(
            endpoint["path"] == "/metrics",
            "PodMonitor scrapes {}, evictd serves /metrics",
            endpoint["path"]
        );
    }
    println!(
        "xtask: PodMonitor (CRD, no schema in kubernetes-validate): selector, namespace and port match the DaemonSet"
    );
    Ok(())
}
