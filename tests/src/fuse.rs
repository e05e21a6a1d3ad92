//! A FUSE filesystem the test serves itself (the kernel's own protocol on
//! `/dev/fuse`, no libfuse): one regular file, `file`, whose writes are not
//! answered until [`StuckFile::release`]. It makes a task sleep in the
//! kernel, uninterruptibly, holding its process's mmap lock for writing,
//! which is how a victim's memory can be locked against `process_mrelease`
//! for as long as the task sleeps.
//!
//! How (fs/fuse, Linux 6.9 and later: FUSE protocol 7.40, whose inode I/O
//! modes make the mapping wait; [`StuckFile::mount`] fails with
//! `Unsupported` on an older kernel): the file is opened with
//! `FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES`, and the connection
//! allows shared mappings of such files (`FUSE_DIRECT_IO_ALLOW_MMAP`).
//! [`StuckFile::mount`] starts a write to it that the server never answers:
//! a parallel direct write, which holds the inode in uncached mode while it
//! waits. A shared `mmap` of the file then needs the inode in cached mode:
//! `fuse_file_mmap` → `fuse_file_cached_io_open` waits (`wait_event`, not
//! killable) for the write to end, called under `mmap_write_lock` of the
//! mapping process. SIGKILL cannot end that wait; answering the write can.
//!
//! The held write is a child process's (`dd`), not a thread's: a file of
//! the mount open in the test process would be closed in every child it
//! starts, at its exec, and on 6.12 that close's flush waits for the held
//! write (`fuse_flush`), so the child never ran and the test hung in its
//! `vfork`.
//!
//! Dropping it answers every write, detaches the mount and removes its
//! directory; the serving thread ends once the kernel closes the
//! connection (when the last file of the mount is closed).
use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read as _, Write as _},
    os::fd::AsRawFd as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
    time::Duration,
};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::wait::wait_until;

/// How long the kernel may take to send the write the server holds.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// The FUSE protocol's minor version that came with the inode I/O modes
/// (Linux 6.9), without which a shared mapping does not wait for the write.
const IO_MODES_MINOR: u32 = 40;

// Opcodes and flags of include/uapi/linux/fuse.h.
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;
const FUSE_INIT_EXT: u32 = 1 << 30;
/// `FUSE_DIRECT_IO_ALLOW_MMAP` (bit 36), in `flags2`.
const DIRECT_IO_ALLOW_MMAP_FLAGS2: u32 = 1 << (36 - 32);
const FOPEN_DIRECT_IO: u32 = 1 << 0;
const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
const ROOT: u64 = 1;
const FILE: u64 = 2;
const FILE_NAME: &str = "file";
/// Not zero: a direct write past the end of the file would take the inode
/// lock exclusively instead of the parallel path.
const FILE_SIZE: u64 = 4096;
const MAX_WRITE: u32 = 64 * 1024;
/// `struct fuse_in_header`.
const IN_HEADER: usize = 40;

/// The writes the server holds, and whether it answers them now.
#[derive(Default)]
struct Held {
    /// (unique, size) of each write not answered.
    writes: Vec<(u64, u32)>,
    released: bool,
    /// The kernel's FUSE protocol minor version, from its INIT.
    kernel_minor: Option<u32>,
}

/// A mounted test filesystem with a write to its file held.
pub struct StuckFile {
    dir: PathBuf,
    device: Arc<File>,
    held: Arc<Mutex<Held>>,
    server: Option<JoinHandle<()>>,
    /// The process whose write the server holds.
    writer: Option<Child>,
}

fn lock(held: &Mutex<Held>) -> MutexGuard<'_, Held> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StuckFile {
    /// Mounts the filesystem on a new directory and starts a write to its
    /// file that stays unanswered; returns once the server holds it.
    pub fn mount() -> io::Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("evictd-fuse-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let device = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/fuse")?,
        );
        let options = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
            device.as_raw_fd()
        );
        mount(
            Some("evictd-test"),
            &dir,
            Some("fuse"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )?;
        let held = Arc::new(Mutex::new(Held::default()));
        let server = {
            let device = Arc::clone(&device);
            let held = Arc::clone(&held);
            std::thread::spawn(move || serve(&device, &held))
        };
        let mut stuck = Self {
            dir,
            device,
            held,
            server: Some(server),
            writer: None,
        };
        // One byte at offset 0, within the file: the parallel path.
        stuck.writer = Some(
            Command::new("dd")
                .arg("if=/dev/zero")
                .arg(format!("of={}", stuck.path().display()))
                .args(["bs=1", "count=1", "conv=notrunc"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        wait_until(WRITE_DEADLINE, "the write held by the server", || {
            !lock(&stuck.held).writes.is_empty()
        })?;
        // Dropped on failure: the write answered, the mount detached.
        match lock(&stuck.held).kernel_minor {
            Some(minor) if minor >= IO_MODES_MINOR => {}
            minor => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "the kernel's FUSE protocol 7.{} predates 7.{IO_MODES_MINOR} \
                         (Linux 6.9): a shared mapping would not wait for the held write",
                        minor.map_or("?".to_owned(), |m| m.to_string())
                    ),
                ));
            }
        }
        Ok(stuck)
    }

    /// The file whose shared mapping blocks.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Answers every write held, and every one to come: the mappings
    /// waiting for them go ahead.
    pub fn release(&mut self) -> io::Result<()> {
        let writes = {
            let mut held = lock(&self.held);
            held.released = true;
            std::mem::take(&mut held.writes)
        };
        for (unique, size) in writes {
            reply(&self.device, unique, 0, &write_out(size))?;
        }
        if let Some(mut writer) = self.writer.take() {
            let status = writer.wait()?;
            if !status.success() {
                return Err(io::Error::other(format!("the held write's dd: {status}")));
            }
        }
        Ok(())
    }
}

impl Drop for StuckFile {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("evictd-integration: answering the held FUSE write: {e}");
        }
        if let Err(e) = umount2(&self.dir, MntFlags::MNT_DETACH) {
            eprintln!("evictd-integration: unmounting {}: {e}", self.dir.display());
        }
        // The thread ends when the kernel closes the connection: at once,
        // unless something still has the file open or mapped.
        if let Some(server) = self.server.take()
            && server.is_finished()
        {
            let _ = server.join();
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Answers the kernel's requests until the connection closes.
fn serve(device: &File, held: &Mutex<Held>) {
    let mut buffer = vec![0u8; MAX_WRITE as usize + 64 * 1024];
    loop {
        let read = match (&*device).read(&mut buffer) {
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // ENODEV: the filesystem is unmounted and its files closed.
            Err(_) => return,
        };
        if read < IN_HEADER {
            return;
        }
        let request = &buffer[..read];
        let opcode = u32_at(request, 4);
        let unique = u64_at(request, 8);
        let node = u64_at(request, 16);
        let body = &request[IN_HEADER..];
        let answer = match opcode {
            INIT => {
                lock(held).kernel_minor = Some(u32_at(body, 4));
                Some(Ok(init_out(body)))
            }
            LOOKUP
                if node == ROOT && body.split(|&b| b == 0).next() == Some(FILE_NAME.as_bytes()) =>
            {
                Some(Ok(entry_out(FILE)))
            }
            LOOKUP => Some(Err(libc::ENOENT)),
            GETATTR | SETATTR => Some(Ok(attr_out(node))),
            OPEN => Some(Ok(open_out(FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES))),
            OPENDIR => Some(Ok(open_out(0))),
            READ | READDIR => Some(Ok(Vec::new())),
            WRITE => {
                let size = u32_at(body, 16);
                let mut held = lock(held);
                if held.released {
                    Some(Ok(write_out(size)))
                } else {
                    held.writes.push((unique, size));
                    None
                }
            }
            RELEASE | RELEASEDIR | FLUSH | FSYNC | DESTROY => Some(Ok(Vec::new())),
            // No answer is expected to these.
            FORGET | BATCH_FORGET | INTERRUPT => None,
            _ => Some(Err(libc::ENOSYS)),
        };
        // A reply that fails went to a request interrupted meanwhile
        // (ENOENT), or to a connection gone, which the next read says.
        let _ = match answer {
            Some(Ok(payload)) => reply(device, unique, 0, &payload),
            Some(Err(errno)) => reply(device, unique, -errno, &[]),
            None => Ok(()),
        };
    }
}

/// `struct fuse_out_header` and `payload`, in one write as the kernel
/// requires.
fn reply(device: &File, unique: u64, error: i32, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(16 + payload.len()).map_err(io::Error::other)?;
    let mut message = Vec::with_capacity(16 + payload.len());
    message.extend_from_slice(&len.to_le_bytes());
    message.extend_from_slice(&error.to_le_bytes());
    message.extend_from_slice(&unique.to_le_bytes());
    message.extend_from_slice(payload);
    (&*device).write_all(&message)
}

/// `struct fuse_init_out`: the kernel's own version, shared mappings of
/// direct-I/O files allowed.
fn init_out(init_in: &[u8]) -> Vec<u8> {
    let minor = u32_at(init_in, 4);
    let max_readahead = u32_at(init_in, 8);
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&7u32.to_le_bytes());
    out.extend_from_slice(&minor.to_le_bytes());
    out.extend_from_slice(&max_readahead.to_le_bytes());
    out.extend_from_slice(&FUSE_INIT_EXT.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes()); // max_background
    out.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
    out.extend_from_slice(&MAX_WRITE.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // time_gran
    out.extend_from_slice(&0u16.to_le_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_le_bytes()); // map_alignment
    out.extend_from_slice(&DIRECT_IO_ALLOW_MMAP_FLAGS2.to_le_bytes());
    out.resize(64, 0);
    out
}

/// `struct fuse_attr` of the root directory or the file.
fn attr(node: u64) -> Vec<u8> {
    let (size, mode, nlink) = if node == FILE {
        (FILE_SIZE, libc::S_IFREG | 0o644, 1u32)
    } else {
        (0, libc::S_IFDIR | 0o755, 2u32)
    };
    let mut out = Vec::with_capacity(88);
    for value in [node, size, size.div_ceil(512), 0, 0, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for value in [0u32, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

/// `struct fuse_entry_out`: valid for an hour, so it is not looked up again.
fn entry_out(node: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    for value in [node, 0, 3600, 3600] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&[0; 8]);
    out.extend(attr(node));
    out
}

/// `struct fuse_attr_out`.
fn attr_out(node: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(104);
    out.extend_from_slice(&3600u64.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend(attr(node));
    out
}

/// `struct fuse_open_out`.
fn open_out(open_flags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&open_flags.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

/// `struct fuse_write_out`: all of it written.
fn write_out(size: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    bytes
        .get(offset..offset + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    bytes
        .get(offset..offset + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}
