//! The agent as deploy/daemonset.yaml runs it: root with only the
//! capabilities the agent container adds (everything else dropped from its
//! bounding set, as a container runtime does), under the seccomp profile
//! it names (applied as a runtime applies a Localhost profile), and, where
//! a test asks, in a memory cgroup limited as the container's resources
//! limit it, or with every cgroup filesystem read-only but the pods'
//! cgroups, as its volume mounts have it.
use std::{
    io,
    path::{Path, PathBuf},
    process::Command,
};

use evictd::quantity::Quantity;
use serde_json::Value;

use crate::{Agent, Controller, PrivateCgroupTree, agent_binary};

/// The DaemonSet's agent container, from deploy/daemonset.yaml.
pub fn agent_container() -> io::Result<Value> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/daemonset.yaml");
    let text = std::fs::read_to_string(manifest)?;
    let daemonset: Value = serde_yaml_ng::from_str(&text).map_err(io::Error::other)?;
    daemonset["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "evictd")
        .cloned()
        .ok_or_else(|| io::Error::other("no evictd container in the DaemonSet"))
}

/// The capabilities the agent container adds, as setpriv names them.
///
/// # Panics
/// If the container is privileged, may escalate, or does not drop ALL
/// first: what it grants would then be more than its `add` list.
pub fn daemonset_capabilities(container: &Value) -> Vec<String> {
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    security["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|cap| cap.as_str())
        .map(str::to_lowercase)
        .collect()
}

/// The Localhost seccomp profile the agent container names, from deploy/.
///
/// # Panics
/// If the container's profile is not a Localhost one.
pub fn daemonset_seccomp_profile(container: &Value) -> PathBuf {
    let profile = &container["securityContext"]["seccompProfile"];
    assert_eq!(profile["type"], "Localhost");
    let name = profile["localhostProfile"].as_str().unwrap_or_default();
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/seccomp")).join(name)
}

/// The agent container's memory limit, bytes.
pub fn daemonset_memory_limit(container: &Value) -> io::Result<u64> {
    let limit = container["resources"]["limits"]["memory"]
        .as_str()
        .ok_or_else(|| io::Error::other("the agent container has no memory limit"))?;
    let quantity = Quantity::parse(limit).map_err(io::Error::other)?;
    u64::try_from(quantity.value()).map_err(io::Error::other)
}

/// `setpriv` keeping only `capabilities` (uid 0 keeps exactly what the
/// bounding set allows across exec), then `command`.
pub fn with_capabilities(capabilities: &[String], command: &[String]) -> Vec<String> {
    let keep: String = capabilities.iter().map(|cap| format!(",+{cap}")).collect();
    let mut line = vec![
        "setpriv".to_owned(),
        format!("--bounding-set=-all{keep}"),
        format!("--inh-caps=-all{keep}"),
    ];
    line.extend(command.iter().cloned());
    line
}

/// The agent with `args`, started as the DaemonSet starts it, with
/// `capabilities` (the DaemonSet's own, or fewer), under the profile
/// `seccomp_launcher` (the `evictd-seccomp` test tool) applies, in cgroup
/// `cgroup` of `tree` from its first instruction: everything it ever
/// allocates is charged there.
pub fn start_as_daemonset(
    seccomp_launcher: &Path,
    capabilities: &[String],
    tree: &PrivateCgroupTree,
    cgroup: &str,
    args: &[String],
) -> io::Result<Agent> {
    let container = agent_container()?;
    let line = with_capabilities(
        capabilities,
        &under_profile(seccomp_launcher, &container, args),
    );
    // The shell joins the cgroup in every hierarchy, then becomes setpriv,
    // which becomes the agent: one process throughout.
    let procs: Vec<String> = [Controller::Memory, Controller::Pids]
        .into_iter()
        .map(|controller| {
            tree.dir(controller, cgroup)
                .join("cgroup.procs")
                .display()
                .to_string()
        })
        .collect();
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            r#"for procs in $EVICTD_CGROUP_PROCS; do echo $$ > "$procs"; done; exec "$@""#,
            "sh",
        ])
        .args(&line)
        .env("EVICTD_CGROUP_PROCS", procs.join(" "));
    Agent::spawn(command)
}

/// A shell that, in a mount namespace of its own (gone when the agent
/// exits), makes every cgroup filesystem read-only except `writable` (a
/// path relative to each hierarchy's root, where it exists), checks that
/// `read_only_file` is not writable any more, then runs `command`.
fn in_narrowed_cgroupfs(writable: &str, read_only_file: &Path, command: &[String]) -> Command {
    let script = r#"
set -eu
writable=$1 probe=$2; shift 2
for target in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
  mount -o remount,bind,ro "$target"
done
for target in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
  if [ -d "$target/$writable" ]; then
    mount --bind "$target/$writable" "$target/$writable"
    mount -o remount,bind,rw "$target/$writable"
  fi
done
if [ -w "$probe" ]; then echo "$probe is still writable" >&2; exit 97; fi
exec "$@"
"#;
    let mut shell = Command::new("unshare");
    shell
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(writable)
        .arg(read_only_file)
        .args(command);
    shell
}

/// The agent with `args` on the node of `node_cgroup` (relative to the
/// hierarchy root), confined as the DaemonSet confines it: its
/// capabilities, its profile (applied by `seccomp_launcher`, the
/// `evictd-seccomp` test tool), and every cgroup filesystem read-only but
/// the node's pods' cgroups, as its volume mounts have it.
/// `node_memory_dir` is the node cgroup in the memory hierarchy, whose
/// `cgroup.procs` must end up read-only.
pub fn confined_agent(
    seccomp_launcher: &Path,
    node_cgroup: &str,
    node_memory_dir: &Path,
    args: &[String],
) -> io::Result<Agent> {
    let container = agent_container()?;
    let command = in_narrowed_cgroupfs(
        &format!("{}/kubepods", node_cgroup.trim_start_matches('/')),
        &node_memory_dir.join("cgroup.procs"),
        &with_capabilities(
            &daemonset_capabilities(&container),
            &under_profile(seccomp_launcher, &container, args),
        ),
    );
    Agent::spawn(command)
}

/// The agent with `args` under the seccomp profile `container` names, as
/// `seccomp_launcher` applies it.
fn under_profile(seccomp_launcher: &Path, container: &Value, args: &[String]) -> Vec<String> {
    let mut line = vec![
        seccomp_launcher.display().to_string(),
        daemonset_seccomp_profile(container).display().to_string(),
        agent_binary().display().to_string(),
    ];
    line.extend(args.iter().cloned());
    line
}
