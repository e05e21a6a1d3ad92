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
//!   at), never a reason not to start;
//! - read only as the regular file it must be: never through a symbolic
//!   link, never a FIFO (whose open would wait for a writer) or a device
//!   (`/dev/zero` answers without end), in a directory of mode 0700 owned
//!   by the agent's user.
use std::{
    fs, io,
    io::{Read as _, Write as _},
    os::unix::fs::{
        DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
    },
    path::{Path, PathBuf},
};

/// Ceiling on any one state file. The report journal holds at most a few
/// hundred reports of about a kilobyte.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The state directory's mode: its files name pods, and only the agent
/// may plant or replace them.
const DIR_MODE: u32 = 0o700;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("--state-dir {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--state-dir {path}: {problem}; not used")]
    UnsafeDir { path: PathBuf, problem: String },
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
    /// A symbolic link, FIFO, device or directory where a state file
    /// belongs: a FIFO would block the read for good, a device answer
    /// without end.
    #[error("state file {path}: a {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
}

/// An opened state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Creates the directory (mode 0700: reports name pods) if needed. An
    /// existing one must be a directory (not a link to one) owned by the
    /// agent's user; its mode is brought to 0700 (a hostPath volume's
    /// `DirectoryOrCreate` makes it 0755).
    pub fn open(path: &Path) -> Result<Self, StateError> {
        Self::open_with(path, Some(DIR_MODE))
    }

    /// A directory others read too (kubelet's seccomp directory, where the
    /// agent's profile is installed): created 0755 if missing, its mode
    /// left as it is; its files are written as the state directory's.
    pub(crate) fn open_shared(path: &Path) -> Result<Self, StateError> {
        Self::open_with(path, None)
    }

    fn open_with(path: &Path, mode: Option<u32>) -> Result<Self, StateError> {
        let open_error = |source| StateError::Open {
            path: path.to_owned(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode.unwrap_or(0o755))
            .create(path)
            .map_err(open_error)?;
        let unsafe_dir = |problem: String| StateError::UnsafeDir {
            path: path.to_owned(),
            problem,
        };
        let dir = fs::File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR) => {
                    unsafe_dir("a symbolic link or not a directory".to_owned())
                }
                _ => open_error(e),
            })?;
        let metadata = dir.metadata().map_err(open_error)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if metadata.uid() != me {
            return Err(unsafe_dir(format!(
                "owned by uid {}, not the agent's ({me})",
                metadata.uid()
            )));
        }
        if let Some(mode) = mode
            && metadata.mode() & 0o777 != mode
        {
            dir.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(open_error)?;
        }
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

    /// The contents of `name`, or `None` when it does not exist. Only a
    /// regular file is read, and at most [`MAX_FILE_BYTES`] of it: the
    /// name itself is never followed (`O_NOFOLLOW`), and opening never
    /// waits (`O_NONBLOCK`, for a FIFO).
    pub(crate) fn read(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let path = self.file(name);
        let io_error = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        let file = match fs::File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(StateError::NotRegular {
                    path,
                    kind: "symbolic link",
                });
            }
            Err(e) => return Err(io_error(e)),
        };
        let metadata = file.metadata().map_err(io_error)?;
        let kind = metadata.file_type();
        if !kind.is_file() {
            let kind = if kind.is_dir() {
                "directory"
            } else if std::os::unix::fs::FileTypeExt::is_fifo(&kind) {
                "FIFO"
            } else {
                "device or socket"
            };
            return Err(StateError::NotRegular { path, kind });
        }
        if metadata.len() > MAX_FILE_BYTES {
            return Err(StateError::TooLarge {
                path,
                size: metadata.len(),
            });
        }
        let mut contents = Vec::new();
        // Bounded even if the file grows while it is read.
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut contents)
            .map_err(io_error)?;
        let size = contents.len() as u64;
        if size > MAX_FILE_BYTES {
            return Err(StateError::TooLarge { path, size });
        }
        Ok(Some(contents))
    }

    /// When the regular file `name` was last written; `None` when there is
    /// no such file. The name is not followed.
    pub(crate) fn modified(&self, name: &str) -> Result<Option<std::time::SystemTime>, StateError> {
        let path = self.file(name);
        match fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.is_file() => metadata
                .modified()
                .map(Some)
                .map_err(|source| StateError::Io { path, source }),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Replaces `name` with `contents`, atomically. The temporary file is
    /// made afresh (whatever was left at its name is removed first, and
    /// nothing there is followed or reused) and removed if anything fails.
    pub(crate) fn write(&self, name: &str, contents: &[u8]) -> Result<(), StateError> {
        let path = self.file(name);
        let size = contents.len() as u64;
        if size > MAX_FILE_BYTES {
            return Err(StateError::TooLarge { path, size });
        }
        let temporary = self.file(&format!(".{name}.tmp"));
        let result = (|| {
            match fs::remove_file(&temporary) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut file = fs::File::options()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
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
    pub(crate) fn set_aside(&self, name: &str) -> Result<PathBuf, StateError> {
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

    /// `read` of `name` in `state`, on a thread: a read that never returns
    /// fails the test instead of hanging it.
    fn read_within_a_second(state: &StateDir, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let state = state.clone();
        let name = name.to_owned();
        std::thread::spawn(move || sender.send(state.read(&name)));
        receiver
            .recv_timeout(std::time::Duration::from_secs(1))
            .expect("the read returned")
    }

    #[test]
    fn only_a_regular_file_is_read_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        // A FIFO would block an open for reading until a writer came.
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(
            matches!(
                read_within_a_second(&state, "fifo"),
                Err(StateError::NotRegular { kind: "FIFO", .. })
            ),
            "a FIFO"
        );
        // A link is not followed, to a device or to a file elsewhere.
        let elsewhere = tempfile::NamedTempFile::new().unwrap();
        fs::write(elsewhere.path(), b"{}").unwrap();
        for (name, target) in [
            ("device", Path::new("/dev/null")),
            ("link", elsewhere.path()),
        ] {
            std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap();
            assert!(
                matches!(
                    read_within_a_second(&state, name),
                    Err(StateError::NotRegular {
                        kind: "symbolic link",
                        ..
                    })
                ),
                "{name}"
            );
        }
        fs::create_dir(dir.path().join("directory")).unwrap();
        assert!(matches!(
            state.read("directory"),
            Err(StateError::NotRegular {
                kind: "directory",
                ..
            })
        ));
        // Set aside, the name is free for the next write.
        state.set_aside("fifo").unwrap();
        state.write("fifo", b"now a file").unwrap();
        assert_eq!(
            state.read("fifo").unwrap().as_deref(),
            Some(&b"now a file"[..])
        );
    }

    #[test]
    fn a_write_follows_nothing_left_at_the_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let victim = tempfile::NamedTempFile::new().unwrap();
        fs::write(victim.path(), b"not evictd's").unwrap();
        std::os::unix::fs::symlink(victim.path(), dir.path().join(".journal.json.tmp")).unwrap();
        state.write("journal.json", b"reports").unwrap();
        assert_eq!(fs::read(victim.path()).unwrap(), b"not evictd's");
        assert_eq!(
            state.read("journal.json").unwrap().as_deref(),
            Some(&b"reports"[..])
        );
        assert!(!dir.path().join(".journal.json.tmp").exists());
    }

    #[test]
    fn the_directorys_mode_is_enforced_and_a_link_to_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("evictd");
        fs::create_dir(&state_dir).unwrap();
        fs::set_permissions(&state_dir, fs::Permissions::from_mode(0o755)).unwrap();
        StateDir::open(&state_dir).unwrap();
        assert_eq!(
            fs::metadata(&state_dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&state_dir, &link).unwrap();
        assert!(matches!(
            StateDir::open(&link),
            Err(StateError::UnsafeDir { .. })
        ));
    }

    #[test]
    fn an_unwritable_directory_is_an_error_naming_it() {
        let error = StateDir::open(Path::new("/proc/evictd-state")).unwrap_err();
        assert!(error.to_string().contains("/proc/evictd-state"), "{error}");
    }
}
