//! The bytes charged to every memory cgroup under one, in a single read:
//! the `cgroup_charges` iterator program walks them in the kernel, where
//! reading each pod's usage file costs a system call (and a few µs with the
//! kernel's data cold) per pod.
use std::{
    collections::HashMap,
    fs::File,
    io::{self, Read},
    os::{
        fd::{AsRawFd, BorrowedFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::Path,
};

use evictd_common::{CHARGE_BATCH_PAGES, CgroupCharge};

/// `BPF_LINK_CREATE` and `BPF_ITER_CREATE` (`enum bpf_cmd`), which aya's
/// `Iter` does not expose with a cgroup to start from.
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
/// `BPF_TRACE_ITER` (`enum bpf_attach_type`).
const BPF_TRACE_ITER: u32 = 28;
/// `BPF_CGROUP_ITER_DESCENDANTS_PRE`: the cgroup and every descendant.
const DESCENDANTS_PRE: u32 = 2;

/// More than the kernel writes in one read of an iterator (`PAGE_SIZE << 3`).
const READ_BYTES: usize = 64 << 10;

/// The `link_create` member of `union bpf_attr`, as far as an iterator uses
/// it; the kernel takes a shorter attr as zero-filled.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    _pad: u32,
}

/// The `cgroup` member of `union bpf_iter_link_info`.
#[repr(C)]
struct CgroupIterInfo {
    order: u32,
    cgroup_fd: u32,
    cgroup_id: u64,
}

/// The `iter_create` member of `union bpf_attr`.
#[repr(C)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

/// An iterator program attached below one cgroup. The link holds the
/// program, so this stays usable after the object it came from is dropped;
/// dropping it detaches the program.
#[derive(Debug)]
pub struct CgroupCharges {
    link: OwnedFd,
    page_shift: u32,
    /// The id of the cgroup walked from.
    root_id: u64,
    /// How far the page counter can move back and forth unseen: a charge
    /// batch (64 pages) held in reserve by each CPU.
    slack_bytes: u64,
    buf: Vec<u8>,
}

/// Why the iterator's reading cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum ChargesError {
    /// The iterator could not be loaded or attached.
    #[error(transparent)]
    Setup(#[from] super::BpfError),
    #[error("reading the cgroup iterator: {0}")]
    Read(#[from] io::Error),
    #[error("reading the usage file of the cgroup walked from: {0}")]
    UsageFile(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the walk did not report the cgroup it starts from")]
    RootMissing,
    #[error(
        "the walk read {read} bytes for the cgroup it starts from, where its usage file read \
         {before} then {after}: the kernel layout evictd resolved is wrong for this kernel"
    )]
    Disagrees { read: u64, before: u64, after: u64 },
}

impl CgroupCharges {
    /// Attaches the loaded iterator `program` to walk `root` (a cgroup
    /// directory) and its descendants; `cpus` may hold charges in reserve.
    pub(super) fn attach(
        program: BorrowedFd,
        root: &Path,
        page_shift: u32,
        cpus: u64,
    ) -> io::Result<Self> {
        let dir = File::open(root)?;
        let root_id = dir.metadata()?.ino();
        let info = CgroupIterInfo {
            order: DESCENDANTS_PRE,
            cgroup_fd: dir.as_raw_fd() as u32,
            cgroup_id: 0,
        };
        let attr = LinkCreateAttr {
            prog_fd: program.as_raw_fd() as u32,
            target_fd: 0,
            attach_type: BPF_TRACE_ITER,
            flags: 0,
            iter_info: (&raw const info) as u64,
            iter_info_len: size_of::<CgroupIterInfo>() as u32,
            _pad: 0,
        };
        Ok(Self {
            link: super::bpf_syscall(BPF_LINK_CREATE, &attr)?,
            page_shift,
            root_id,
            slack_bytes: (CHARGE_BATCH_PAGES * cpus) << page_shift,
            buf: Vec::new(),
        })
    }

    /// Reads once, and compares what the walk gives the cgroup it starts
    /// from with that cgroup's usage file, `usage`, read just before and
    /// just after: an offset resolved wrong would rank pods by garbage.
    pub(crate) fn check<E>(
        &mut self,
        usage: impl Fn() -> Result<u64, E>,
    ) -> Result<(), ChargesError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let file = || usage().map_err(|e| ChargesError::UsageFile(Box::new(e)));
        let mut charges = HashMap::new();
        let before = file()?;
        self.read(&mut charges)?;
        let after = file()?;
        let read = *charges
            .get(&self.root_id)
            .ok_or(ChargesError::RootMissing)?;
        if within(read, before, after, self.slack_bytes) {
            Ok(())
        } else {
            Err(ChargesError::Disagrees {
                read,
                before,
                after,
            })
        }
    }

    /// Bytes charged to each memory cgroup under the root (the root
    /// included), by cgroup id, into `charges` (cleared first).
    pub fn read(&mut self, charges: &mut HashMap<u64, u64>) -> io::Result<()> {
        let attr = IterCreateAttr {
            link_fd: self.link.as_raw_fd() as u32,
            flags: 0,
        };
        let mut iterator = File::from(super::bpf_syscall(BPF_ITER_CREATE, &attr)?);
        self.buf.clear();
        // A cgroup iterator cannot resume in a second read (EOPNOTSUPP), so
        // the first must take every record: the kernel writes at most its
        // buffer (8 pages) in one read.
        self.buf.reserve(READ_BYTES);
        iterator.read_to_end(&mut self.buf)?;
        charges.clear();
        charges.extend(decode(&self.buf).map(|charge| {
            (
                charge.cgroup_id,
                charge.pages.saturating_mul(1 << self.page_shift),
            )
        }));
        Ok(())
    }
}

/// Whether `read` lies between `before` and `after`, give or take `slack`.
fn within(read: u64, before: u64, after: u64, slack: u64) -> bool {
    let low = before.min(after).saturating_sub(slack);
    let high = before.max(after).saturating_add(slack);
    (low..=high).contains(&read)
}

/// The records of one read; a torn tail (never written by the program) is
/// left out.
fn decode(bytes: &[u8]) -> impl Iterator<Item = CgroupCharge> + '_ {
    bytes
        .chunks_exact(size_of::<CgroupCharge>())
        .filter_map(|record| {
            Some(CgroupCharge {
                cgroup_id: u64::from_ne_bytes(*record.first_chunk()?),
                pages: u64::from_ne_bytes(*record.last_chunk()?),
            })
        })
}

impl crate::node::inventory::ChargesSource for CgroupCharges {
    fn read(&mut self, charges: &mut HashMap<u64, u64>) -> io::Result<()> {
        CgroupCharges::read(self, charges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_agrees_between_the_files_two_readings_give_or_take_the_slack() {
        assert!(within(150, 100, 200, 0));
        assert!(within(150, 200, 100, 0), "the file may have fallen");
        assert!(within(90, 100, 200, 10));
        assert!(within(210, 100, 200, 10));
        assert!(!within(89, 100, 200, 10));
        assert!(!within(211, 100, 200, 10));
        // A pointer or an unrelated field read as the counter.
        assert!(!within(0xffff_8880_0000_0000, 100, 200, 1 << 20));
    }

    #[test]
    fn decoding_takes_whole_records_in_order_and_leaves_a_torn_tail_out() {
        let mut bytes = Vec::new();
        for (id, pages) in [(7u64, 3u64), (9, 0)] {
            bytes.extend_from_slice(&id.to_ne_bytes());
            bytes.extend_from_slice(&pages.to_ne_bytes());
        }
        bytes.extend_from_slice(&[1, 2, 3]);
        let records: Vec<_> = decode(&bytes).collect();
        assert_eq!(
            records,
            [
                CgroupCharge {
                    cgroup_id: 7,
                    pages: 3
                },
                CgroupCharge {
                    cgroup_id: 9,
                    pages: 0
                }
            ]
        );
    }
}
