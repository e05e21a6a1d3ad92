//! The seccomp profile the agent runs under in a cluster
//! (deploy/seccomp/evictd.json: exactly the syscalls the agent makes, found
//! by tracing it through the privileged tests), embedded so that a binary
//! and its profile always match. `evictd seccomp-profile --install DIR`
//! writes it where kubelet looks for `Localhost` profiles; the DaemonSet's
//! init container does that before the agent starts.
use std::path::{Path, PathBuf};

use crate::state::{StateDir, StateError};

pub const PROFILE: &str = include_str!("../../../deploy/seccomp/evictd.json");

/// The file name the DaemonSet's `localhostProfile` names.
pub const FILE_NAME: &str = "evictd.json";

/// Writes the profile into `dir` (created if missing), atomically: kubelet
/// starting a container at the same moment reads the old file or the new.
pub fn install(dir: &Path) -> Result<PathBuf, StateError> {
    let dir = StateDir::open_shared(dir)?;
    dir.write(FILE_NAME, PROFILE.as_bytes())?;
    Ok(dir.path().join(FILE_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_allows_what_the_agent_needs_and_refuses_the_rest() {
        let profile: serde_json::Value = serde_json::from_str(PROFILE).unwrap();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        let allowed: Vec<&str> = profile["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| rule["action"] == "SCMP_ACT_ALLOW")
            .flat_map(|rule| rule["names"].as_array().unwrap())
            .map(|name| name.as_str().unwrap())
            .collect();
        for needed in [
            "bpf",
            "pidfd_open",
            "pidfd_send_signal",
            "process_mrelease",
            // The zone's backstop timer.
            "timerfd_create",
            "timerfd_settime",
            // A reaper moving off its victim's CPU.
            "sched_getaffinity",
            "sched_setaffinity",
            // A decision's time on and off the CPU.
            "getrusage",
            // A state file's failed write removes its temporary file; the
            // state directory, the agent's own, is brought to mode 0700.
            "unlink",
            "geteuid",
            "fchmod",
            // An executable --pre-kill-hook: its stderr pipe, its own
            // process group and standard streams, its kill at the
            // deadline, its reaping (clone and execve are there already).
            "pipe2",
            "setpgid",
            "dup2",
            "kill",
            "wait4",
        ] {
            assert!(allowed.contains(&needed), "{needed} is not allowed");
        }
        // Raw tracepoints attach through bpf() itself.
        for refused in [
            "perf_event_open",
            "mount",
            "ptrace",
            "init_module",
            "kexec_load",
            "unshare",
        ] {
            assert!(!allowed.contains(&refused), "{refused} is allowed");
        }
    }

    #[test]
    fn install_writes_the_profile_whole_and_leaves_kubelets_directory_as_it_is() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let seccomp = dir.path().join("seccomp");
        let path = install(&seccomp).unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), PROFILE);
        let mode = std::fs::metadata(&seccomp).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }
}
