//! What to watch: `--watch-memory PATH=Q[,Q...]`, `--watch-pids PATH=N[,N...]`
//! and `--watch-node-pids N[,N...]`. A PATH is a cgroup path relative to the
//! hierarchy root; a `*` segment matches any one cgroup name, now or later
//! (`/kubepods/burstable/*` watches every burstable pod).
use std::{fs, path::Path};

use crate::{
    kernel::bpf::ScopeKind,
    quantity::Quantity,
    scopes::levels::{Levels, MAX_THRESHOLDS},
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error("watch {0:?}: expected PATH=THRESHOLD[,THRESHOLD...]")]
    Syntax(String),
    #[error("watch {spec:?}: cgroup path must start with '/'")]
    Relative { spec: String },
    #[error("watch {spec:?}: threshold {text:?}: {reason}")]
    Threshold {
        spec: String,
        text: String,
        reason: String,
    },
    #[error("watch {spec:?}: at most {MAX_THRESHOLDS} thresholds per scope")]
    TooMany { spec: String },
}

/// A cgroup path with optional `*` segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupPattern {
    segments: Vec<String>,
}

impl CgroupPattern {
    fn parse(text: &str, spec: &str) -> Result<Self, WatchError> {
        if !text.starts_with('/') {
            return Err(WatchError::Relative {
                spec: spec.to_owned(),
            });
        }
        Ok(Self {
            segments: text
                .split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }

    pub fn matches(&self, path: &str) -> bool {
        let mut parts = path.split('/').filter(|s| !s.is_empty());
        self.segments.iter().all(|segment| {
            parts
                .next()
                .is_some_and(|part| segment == "*" || segment == part)
        }) && parts.next().is_none()
    }

    /// Every existing cgroup under `root` (a hierarchy mount point) that
    /// matches, as paths relative to `root`.
    pub(crate) fn expand(&self, root: &Path) -> Vec<String> {
        let mut found = vec![String::new()];
        for segment in &self.segments {
            found = found
                .into_iter()
                .flat_map(|prefix| {
                    if segment != "*" {
                        return vec![format!("{prefix}/{segment}")];
                    }
                    let dir = root.join(prefix.trim_start_matches('/'));
                    fs::read_dir(dir)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|entry| format!("{prefix}/{}", entry.file_name().to_string_lossy()))
                        .collect()
                })
                .filter(|path| root.join(path.trim_start_matches('/')).is_dir())
                .collect();
        }
        found
            .into_iter()
            .map(|path| {
                if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                }
            })
            .collect()
    }
}

impl std::fmt::Display for CgroupPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.segments.join("/"))
    }
}

/// Where a watch applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Cgroups(CgroupPattern),
    /// Every task on the node (`pid.available`'s count).
    NodeTasks,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    pub kind: ScopeKind,
    pub target: Target,
    /// Ascending, without duplicates.
    pub thresholds: Vec<u64>,
}

impl WatchSpec {
    /// `PATH=Q[,Q...]`, Q a Kubernetes quantity of bytes ("512Mi").
    pub fn memory(spec: &str) -> Result<Self, WatchError> {
        Self::cgroup(ScopeKind::Memory, spec)
    }

    /// `PATH=N[,N...]`, N a task count.
    pub fn pids(spec: &str) -> Result<Self, WatchError> {
        Self::cgroup(ScopeKind::Pids, spec)
    }

    fn cgroup(kind: ScopeKind, spec: &str) -> Result<Self, WatchError> {
        let (path, list) = spec
            .split_once('=')
            .ok_or_else(|| WatchError::Syntax(spec.to_owned()))?;
        Ok(Self {
            kind,
            target: Target::Cgroups(CgroupPattern::parse(path, spec)?),
            thresholds: parse_thresholds(spec, list)?,
        })
    }

    /// `N[,N...]` tasks on the whole node.
    pub fn node_pids(spec: &str) -> Result<Self, WatchError> {
        Ok(Self {
            kind: ScopeKind::Pids,
            target: Target::NodeTasks,
            thresholds: parse_thresholds(spec, spec)?,
        })
    }

    pub(crate) fn levels(&self, hysteresis: u64) -> Levels {
        Levels::new(self.thresholds.clone(), hysteresis)
    }
}

fn parse_thresholds(spec: &str, list: &str) -> Result<Vec<u64>, WatchError> {
    let mut values = list
        .split(',')
        .map(|text| {
            let bad = |reason: String| WatchError::Threshold {
                spec: spec.to_owned(),
                text: text.to_owned(),
                reason,
            };
            let quantity = Quantity::parse(text).map_err(|e| bad(e.to_string()))?;
            if quantity.is_negative() {
                return Err(bad("must not be negative".into()));
            }
            Ok(quantity.value() as u64)
        })
        .collect::<Result<Vec<_>, _>>()?;
    values.sort_unstable();
    values.dedup();
    if values.len() > MAX_THRESHOLDS {
        return Err(WatchError::TooMany {
            spec: spec.to_owned(),
        });
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_memory_watches_with_quantities() {
        let spec = WatchSpec::memory("/kubepods=1Gi,512Mi").unwrap();
        assert_eq!(spec.thresholds, vec![512 << 20, 1 << 30]);
        assert_eq!(spec.levels(7).band(1, 0).fall_below, (512 << 20) - 7);
    }

    #[test]
    fn rejects_bad_watches_quoting_them() {
        let err = WatchSpec::memory("/kubepods").unwrap_err();
        assert_eq!(
            err.to_string(),
            "watch \"/kubepods\": expected PATH=THRESHOLD[,THRESHOLD...]"
        );
        let err = WatchSpec::memory("kubepods=1Gi").unwrap_err();
        assert!(matches!(err, WatchError::Relative { .. }));
        let err = WatchSpec::pids("/a=10,-1").unwrap_err();
        assert!(
            err.to_string().contains("\"-1\": must not be negative"),
            "{err}"
        );
        let err = WatchSpec::memory("/a=1Xi").unwrap_err();
        assert!(err.to_string().contains("\"1Xi\""), "{err}");
        let err = WatchSpec::node_pids("1,2,3,4,5").unwrap_err();
        assert!(matches!(err, WatchError::TooMany { .. }));
    }

    #[test]
    fn patterns_match_one_segment_per_star() {
        let pattern = CgroupPattern::parse("/kubepods/*", "").unwrap();
        assert!(pattern.matches("/kubepods/pod1"));
        assert!(!pattern.matches("/kubepods"));
        assert!(!pattern.matches("/kubepods/burstable/pod2"));
        let root = CgroupPattern::parse("/", "").unwrap();
        assert!(root.matches("/"));
        assert_eq!(root.to_string(), "/");
    }

    #[test]
    fn expands_against_a_directory_tree() {
        let dir = std::env::temp_dir().join(format!("evictd-watch-{}", std::process::id()));
        for leaf in [
            "kubepods/pod-a",
            "kubepods/pod-b",
            "kubepods/burstable/pod-c",
        ] {
            fs::create_dir_all(dir.join(leaf)).unwrap();
        }
        fs::write(dir.join("kubepods/not-a-cgroup"), "").unwrap();
        let pattern = CgroupPattern::parse("/kubepods/*", "").unwrap();
        let mut found = pattern.expand(&dir);
        found.sort();
        assert_eq!(
            found,
            ["/kubepods/burstable", "/kubepods/pod-a", "/kubepods/pod-b"]
        );
        let missing = CgroupPattern::parse("/nope", "").unwrap();
        assert!(missing.expand(&dir).is_empty());
        assert_eq!(CgroupPattern::parse("/", "").unwrap().expand(&dir), ["/"]);
        fs::remove_dir_all(dir).unwrap();
    }
}
