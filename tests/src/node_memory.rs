//! The machine's working set as kubelet computes it on a cgroup v2 root
//! (`anon + file − inactive_file` of the root's memory.stat), read from
//! the kernel's global counters in /proc/vmstat instead: the same page
//! states (`nr_anon_pages` is memory.stat's `anon`, `nr_file_pages` its
//! `file`, `nr_inactive_file` its `inactive_file`), summed on read from
//! the per-node counters, each at most a per-CPU batch of pages (the
//! vmstat threshold, tens of pages) behind; the root's memory.stat is
//! served from memcg counters that are flushed every 2 s or past a batch
//! of pending updates, so a reading there can lag by more than the
//! bench's 64 KiB step.
use std::{fs::File, os::unix::fs::FileExt as _};

/// The file [`working_set_from_vmstat`] reads.
pub const VMSTAT: &str = "/proc/vmstat";

const PAGE: u64 = 4096;

/// `nr_anon_pages + nr_file_pages − nr_inactive_file`, in bytes, from the
/// text of /proc/vmstat.
pub fn working_set_from_vmstat(text: &str) -> Option<u64> {
    let pages = |key: &str| {
        text.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == key).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    let working_set = (pages("nr_anon_pages")? + pages("nr_file_pages")?)
        .saturating_sub(pages("nr_inactive_file")?);
    Some(working_set * PAGE)
}

/// [`working_set_from_vmstat`] of /proc/vmstat read afresh through `file`
/// (kept open).
pub fn read_working_set(file: &File) -> Option<u64> {
    let mut text = vec![0u8; 16 << 10];
    let mut read = 0;
    // The kernel hands a seq_file out a page at a time.
    loop {
        let n = file.read_at(&mut text[read..], read as u64).ok()?;
        if n == 0 {
            break;
        }
        read += n;
        if read == text.len() {
            text.resize(text.len() * 2, 0);
        }
    }
    working_set_from_vmstat(std::str::from_utf8(&text[..read]).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_working_set_is_anon_and_file_pages_less_the_inactive_file_ones() {
        let text = "nr_free_pages 100\nnr_inactive_anon 7\nnr_inactive_file 30\n\
                    nr_active_file 20\nnr_anon_pages 40\nnr_file_pages 50\nnr_shmem 3\n";
        assert_eq!(working_set_from_vmstat(text), Some(60 * 4096));
        assert_eq!(working_set_from_vmstat("nr_anon_pages 1\n"), None);
    }

    #[test]
    fn this_machines_vmstat_reads_whole() {
        let file = File::open(VMSTAT).unwrap();
        let text = std::fs::read_to_string(VMSTAT).unwrap();
        let whole = working_set_from_vmstat(&text).unwrap();
        let read = read_working_set(&file).unwrap();
        // Both readings of a live machine: close, not equal.
        assert!(read.abs_diff(whole) < 256 << 20, "{read} against {whole}");
    }
}
