//! The agent's state directory (`--state-dir`, a hostPath in the DaemonSet):
//! small files that must outlive a restart of the agent, such as the
//! eviction-report journal. Every file is
//! - written whole and atomically: a temporary file beside it, fsynced, then
//!   renamed over it and the directory fsynced, so a crash or a kill leaves
//!   the old version or the new one, never half of either;
//! - bounded in size ([`MAX_FILE_BYTES`]): a larger one is refused on write
//!   and treated as corrupt on read;
//! - read at startup, where a missing file is no state and a corrupt one is
//!   a warning (it is set aside as `<name>.corrupt` for a person to look
//!   at), never a reason not to start.
use std::{
    fs, io,
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Ceiling on any one state file. The report journal holds at most a few
/// hundred reports of about a kilobyte.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("--state-dir {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("state file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "state file {path}: {size} bytes, more than the {MAX_FILE_BYTES} a state file may hold"
    )]
    TooLarge { path: PathBuf, size: u64 },
}

/// An opened state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Creates the directory (mode 0700: reports name pods) if needed.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|source| StateError::Open {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The contents of `name`, or `None` when it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let path = self.file(name);
        let io_error = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        let size = match fs::metadata(&path) {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(e)),
        };
        if size > MAX_FILE_BYTES {
            return Err(StateError::TooLarge { path, size });
        }
        fs::read(&path).map(Some).map_err(io_error)
    }

    /// Replaces `name` with `contents`, atomically.
    pub fn write(&self, name: &str, contents: &[u8]) -> Result<(), StateError> {
        let path = self.file(name);
        let size = contents.len() as u64;
        if size > MAX_FILE_BYTES {
            return Err(StateError::TooLarge { path, size });
        }
        let temporary = self.file(&format!(".{name}.tmp"));
        let result = (|| {
            let mut file = fs::File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temporary)?;
            file.write_all(contents)?;
            file.sync_all()?;
            fs::rename(&temporary, &path)?;
            // The rename itself is durable only once the directory is.
            fs::File::open(&self.path)?.sync_all()
        })();
        result.map_err(|source| {
            let _ = fs::remove_file(&temporary);
            StateError::Io {
                path: path.clone(),
                source,
            }
        })
    }

    /// Moves a file that could not be understood out of the way, keeping it
    /// for a person to look at; the agent starts without it.
    pub fn set_aside(&self, name: &str) -> Result<PathBuf, StateError> {
        let from = self.file(name);
        let to = self.file(&format!("{name}.corrupt"));
        fs::rename(&from, &to).map_err(|source| StateError::Io { path: from, source })?;
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("evictd")).unwrap();
        assert_eq!(
            fs::metadata(state.path()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(state.read("journal.json").unwrap(), None);
        state.write("journal.json", b"first").unwrap();
        state.write("journal.json", b"second").unwrap();
        assert_eq!(
            state.read("journal.json").unwrap().as_deref(),
            Some(&b"second"[..])
        );
        // Nothing else is left in the directory.
        let names: Vec<String> = fs::read_dir(state.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["journal.json"]);
    }

    #[test]
    fn sizes_are_bounded_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let big = vec![b'x'; MAX_FILE_BYTES as usize + 1];
        assert!(matches!(
            state.write("big", &big),
            Err(StateError::TooLarge { .. })
        ));
        fs::write(dir.path().join("big"), &big).unwrap();
        assert!(matches!(
            state.read("big"),
            Err(StateError::TooLarge { .. })
        ));
        let aside = state.set_aside("big").unwrap();
        assert!(aside.ends_with("big.corrupt"));
        assert_eq!(state.read("big").unwrap(), None);
    }

    #[test]
    fn an_unwritable_directory_is_an_error_naming_it() {
        let error = StateDir::open(Path::new("/proc/evictd-state")).unwrap_err();
        assert!(error.to_string().contains("/proc/evictd-state"), "{error}");
    }
}
