//! `--pod-metadata FILE`: pod metadata from a JSON list of pods in the
//! snapshot schema, re-read whenever the file changes. Whatever writes the
//! file may be caught in the middle (truncated, half-written) or replace it
//! non-atomically (briefly missing): the last copy that parsed keeps
//! answering lookups, with one warning per bad version of the file and
//! `evictd_pod_metadata_reload_failures_total` counting them, so that a bad
//! moment of the file never costs an eviction.
use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use tracing::{info, warn};

use crate::{
    decide::snapshot::PodSnapshot,
    metrics::Metrics,
    node::inventory::{InventoryError, PodMetadataSource},
};

/// What identifies one version of the file: its modification time and
/// length, or `None` while it does not exist. A writer that truncates and
/// rewrites changes at least one of them.
type Version = Option<(SystemTime, u64)>;

pub struct MetadataFile {
    path: PathBuf,
    /// The version `pods` was read from.
    loaded: Version,
    /// A version that could not be used: it is not read again (each lookup
    /// would otherwise re-read a broken file) and warned about once.
    rejected: Option<Version>,
    pods: HashMap<String, PodSnapshot>,
    /// Counts the copies of `pods` loaded.
    generation: u64,
    metrics: Option<Arc<Metrics>>,
}

impl MetadataFile {
    /// Reads the file; at startup there is no earlier copy to fall back on,
    /// so a missing or malformed file is the user's error.
    pub fn open(path: &Path) -> Result<Self, InventoryError> {
        let mut file = Self {
            path: path.to_owned(),
            loaded: None,
            rejected: None,
            pods: HashMap::new(),
            generation: 0,
            metrics: None,
        };
        let version = file
            .version()
            .map_err(|source| InventoryError::MetadataRead {
                path: file.path.clone(),
                source,
            })?;
        file.pods = file.read()?;
        file.loaded = version;
        Ok(file)
    }

    /// Counts reload failures from now on.
    pub fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    fn version(&self) -> io::Result<Version> {
        match fs::metadata(&self.path) {
            Ok(metadata) => Ok(Some((metadata.modified()?, metadata.len()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read(&self) -> Result<HashMap<String, PodSnapshot>, InventoryError> {
        let text = fs::read(&self.path).map_err(|source| InventoryError::MetadataRead {
            path: self.path.clone(),
            source,
        })?;
        let pods: Vec<PodSnapshot> =
            serde_json::from_slice(&text).map_err(|source| InventoryError::MetadataParse {
                path: self.path.clone(),
                source,
            })?;
        Ok(pods
            .into_iter()
            .filter(|pod| !pod.uid.is_empty())
            .map(|pod| (pod.uid.clone(), pod))
            .collect())
    }

    /// Re-reads the file if it changed; keeps the last good copy when the
    /// new one cannot be read.
    fn reload_if_changed(&mut self) {
        let version = match self.version() {
            Ok(version) => version,
            Err(source) => {
                // Not even a stat: a permission or I/O problem, reported as
                // a read failure of an unknown version.
                self.reject(
                    None,
                    &InventoryError::MetadataRead {
                        path: self.path.clone(),
                        source,
                    },
                );
                return;
            }
        };
        if version == self.loaded || self.rejected == Some(version) {
            return;
        }
        let result = match version {
            None => Err(InventoryError::MetadataRead {
                path: self.path.clone(),
                source: io::ErrorKind::NotFound.into(),
            }),
            Some(_) => self.read(),
        };
        match result {
            Ok(pods) => {
                if self.rejected.take().is_some() {
                    info!(path = %self.path.display(), pods = pods.len(), "pod metadata file readable again");
                    self.set_stale(false);
                }
                self.pods = pods;
                self.loaded = version;
                self.generation += 1;
            }
            Err(e) => self.reject(version, &e),
        }
    }

    fn reject(&mut self, version: Version, error: &InventoryError) {
        if self.rejected == Some(version) {
            return;
        }
        self.rejected = Some(version);
        let reason = match error {
            InventoryError::MetadataParse { .. } => "malformed",
            _ => "unreadable",
        };
        warn!(error = %error, reason, pods = self.pods.len(),
            "pod metadata file cannot be used; evictd keeps using its last good copy");
        if let Some(metrics) = &self.metrics {
            metrics
                .pod_metadata_reload_failures
                .with_label_values(&[reason])
                .inc();
        }
        self.set_stale(true);
    }

    fn set_stale(&self, stale: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.pod_metadata_stale.set(i64::from(stale));
        }
    }
}

impl PodMetadataSource for MetadataFile {
    fn lookup(&mut self, uid: &str) -> Result<Option<PodSnapshot>, InventoryError> {
        Ok(self.pods.get(uid).cloned())
    }

    /// One stat of the file per listing, not one per pod.
    fn refresh(&mut self) {
        self.reload_if_changed();
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        MetadataFile::set_metrics(self, metrics);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const WEB: &str = r#"[{"namespace": "shop", "name": "web", "uid": "u-web", "containers": []}]"#;
    const WEB_AND_DB: &str = r#"[{"namespace": "shop", "name": "web", "uid": "u-web", "containers": []},
        {"namespace": "shop", "name": "db", "uid": "u-db", "containers": []}]"#;

    /// Writes `text` with a modification time of its own (filesystems with
    /// coarse timestamps could otherwise give two writes the same one).
    fn write(path: &Path, text: &str, second: u64) {
        fs::write(path, text).unwrap();
        let file = fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + second))
            .unwrap();
    }

    /// As a listing looks a pod up: the file refreshed first.
    fn name(file: &mut MetadataFile, uid: &str) -> Option<String> {
        file.refresh();
        file.lookup(uid).unwrap().map(|pod| pod.name)
    }

    #[test]
    fn a_half_written_or_missing_file_keeps_the_last_good_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        write(&path, WEB, 1);
        let metrics = Metrics::new().unwrap();
        let mut file = MetadataFile::open(&path).unwrap();
        file.set_metrics(metrics.clone());
        assert_eq!(name(&mut file, "u-web").as_deref(), Some("web"));

        // A writer caught in the middle: truncated JSON.
        write(&path, &WEB_AND_DB[..40], 2);
        assert_eq!(name(&mut file, "u-web").as_deref(), Some("web"));
        assert_eq!(name(&mut file, "u-db"), None);
        // Replaced non-atomically: briefly gone.
        fs::remove_file(&path).unwrap();
        assert_eq!(name(&mut file, "u-web").as_deref(), Some("web"));
        let text = metrics.render();
        assert!(
            text.contains(r#"evictd_pod_metadata_reload_failures_total{reason="malformed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"evictd_pod_metadata_reload_failures_total{reason="unreadable"} 1"#),
            "{text}"
        );
        assert!(text.contains("evictd_pod_metadata_stale 1"), "{text}");

        // The writer finishes: the new copy is used.
        write(&path, WEB_AND_DB, 3);
        assert_eq!(name(&mut file, "u-db").as_deref(), Some("db"));
        assert!(metrics.render().contains("evictd_pod_metadata_stale 0"));
    }

    #[test]
    fn a_bad_version_is_counted_once_however_often_it_is_looked_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        write(&path, WEB, 1);
        let metrics = Metrics::new().unwrap();
        let mut file = MetadataFile::open(&path).unwrap();
        file.set_metrics(metrics.clone());
        write(&path, "{not json", 2);
        for _ in 0..5 {
            assert_eq!(name(&mut file, "u-web").as_deref(), Some("web"));
        }
        assert!(
            metrics
                .render()
                .contains(r#"evictd_pod_metadata_reload_failures_total{reason="malformed"} 1"#)
        );
    }
}
