//! `cargo xtask deploy-check`: renders every kustomization under deploy/
//! with a pinned kubectl, validates each rendered object against the
//! Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields
//! fail), checks what no schema covers (the PodMonitor, a CRD, against the
//! DaemonSet it scrapes; the PrometheusRule against the alert rules), runs
//! promtool's check and unit tests of the alert rules, and has evictd
//! itself parse the eviction config. Offline once the pinned tools are
//! cached under target/deploy-check.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::Deserialize as _;
use serde_json::Value;

use crate::setup::{self, Toolchain};

/// A Debian package pinned to one file: apt verifies it against the signed
/// archive, and the digest pins the exact file.
struct PinnedDeb {
    package: &'static str,
    version: &'static str,
    sha256: &'static str,
}

/// kubectl from Debian bookworm (the only registry here that carries one).
/// Its kustomize is v2.0.3, the oldest any supported kubectl embeds, so
/// what renders here renders everywhere; a newer `kubectl` on PATH renders
/// the same kustomizations too.
const KUBECTL: PinnedDeb = PinnedDeb {
    package: "kubernetes-client",
    version: "1.20.5+really1.20.2-1.1+deb12u1",
    sha256: "087c42dc26c847740043cdaa8b16db666be5591a1da957f822922aa1b677494e",
};

/// Prometheus 2.42 from Debian bookworm: promtool checks and unit-tests the
/// alert rules, and the integration tests run the server against a live
/// agent. Unpacked, not installed: no service starts.
const PROMETHEUS: PinnedDeb = PinnedDeb {
    package: "prometheus",
    version: "2.42.0+ds-5+deb12u1",
    sha256: "81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55",
};

/// The alert rules (a Prometheus rules file), their promtool unit tests,
/// and the PrometheusRule that must carry the same groups.
const ALERTS: &str = "deploy/monitoring/alerts.yaml";
const ALERTS_TESTS: &str = "alerts.test.yaml";

/// Kubernetes releases whose schemas every object must satisfy: the oldest
/// API the agent's client speaks (k8s-openapi's v1_33) and the newest the
/// pinned validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.34.0"];

/// The kustomizations users apply (README, Deploying).
const KUSTOMIZATIONS: [&str; 2] = ["deploy", "deploy/monitoring"];

pub fn check(toolchain: &Toolchain, root: &Path, target: &Path) -> Result<()> {
    let work = target.join("deploy-check");
    fs::create_dir_all(&work)?;
    let pinned = unpacked(&work, &KUBECTL)?.join("usr/bin/kubectl");
    let validator = validator(root, &work)?;
    let rules = check_rules(root, target)?;
    let mut renderers = vec![(format!("kubectl {}", KUBECTL.version), pinned)];
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
            check_custom(object, &core, &rules)?;
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

/// The Prometheus server, unpacked under `target` (downloaded once).
pub fn prometheus(target: &Path) -> Result<PathBuf> {
    let work = target.join("deploy-check");
    fs::create_dir_all(&work)?;
    Ok(unpacked(&work, &PROMETHEUS)?.join("usr/bin/prometheus"))
}

/// promtool's check and unit tests of the alert rules; their groups, which
/// the PrometheusRule must carry.
fn check_rules(root: &Path, target: &Path) -> Result<Value> {
    let promtool = prometheus(target)?.with_file_name("promtool");
    let alerts = root.join(ALERTS);
    setup::step(
        "promtool check rules",
        Command::new(&promtool)
            .args(["check", "rules"])
            .arg(&alerts),
    )?;
    setup::step(
        "promtool test rules (the alerts' unit tests)",
        Command::new(&promtool)
            .args(["test", "rules", ALERTS_TESTS])
            .current_dir(alerts.parent().context("alerts file without a directory")?),
    )?;
    let text = fs::read_to_string(&alerts).with_context(|| format!("reading {ALERTS}"))?;
    let rules: Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {ALERTS}"))?;
    Ok(rules["groups"].clone())
}

/// `pinned`'s files, downloaded (checksum verified) and unpacked once
/// under `work`.
fn unpacked(work: &Path, pinned: &PinnedDeb) -> Result<PathBuf> {
    let PinnedDeb {
        package,
        version,
        sha256: expected,
    } = pinned;
    let dir = work.join(format!("{package}-{version}"));
    if dir.join("usr/bin").is_dir() {
        return Ok(dir);
    }
    let package_version = format!("{package}={version}");
    let download = |update: bool| -> Result<()> {
        if update {
            setup::step("apt-get update", Command::new("apt-get").arg("update"))?;
        }
        setup::step(
            &format!("download {package_version}"),
            Command::new("apt-get")
                .args(["download", &package_version])
                .current_dir(work),
        )
    };
    // A fresh machine may not have the package lists yet.
    if download(false).is_err() {
        ensure!(
            setup::is_root(),
            "apt-get cannot find {package_version}: run `apt-get update` (root) and retry"
        );
        download(true)?;
    }
    let deb_prefix = format!("{package}_");
    let deb = fs::read_dir(work)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&deb_prefix) && n.ends_with(".deb"))
        })
        .context("apt-get download left no .deb")?;
    let digest = sha256(&deb)?;
    if &digest != expected {
        fs::remove_file(&deb)?;
        bail!("{}: sha256 {digest}, expected {expected}", deb.display());
    }
    // Unpacked beside its final place and renamed: an interrupted unpack
    // leaves no half directory that looks whole.
    let partial = work.join(format!("{package}-{version}.partial"));
    let _ = fs::remove_dir_all(&partial);
    setup::step(
        &format!("unpack {package}"),
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial),
    )?;
    fs::rename(&partial, &dir)?;
    fs::remove_file(&deb)?;
    Ok(dir)
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
fn check_custom(object: &Value, core: &[Value], rules: &Value) -> Result<()> {
    let kind = object["kind"].as_str().unwrap_or_default();
    ensure!(
        object["apiVersion"] == "monitoring.coreos.com/v1",
        "{kind} ({}): no check for this custom resource",
        object["apiVersion"]
    );
    match kind {
        "PodMonitor" => check_pod_monitor(object, core),
        "PrometheusRule" => {
            ensure!(
                &object["spec"]["groups"] == rules,
                "the PrometheusRule's groups differ from {ALERTS}'s"
            );
            println!(
                "xtask: PrometheusRule (CRD, no schema in kubernetes-validate): the groups of {ALERTS}, which promtool checked and tested"
            );
            Ok(())
        }
        _ => bail!("{kind}: no check for this custom resource"),
    }
}

/// The PodMonitor scrapes the DaemonSet's pods: namespace, selector, port
/// and path.
fn check_pod_monitor(object: &Value, core: &[Value]) -> Result<()> {
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
