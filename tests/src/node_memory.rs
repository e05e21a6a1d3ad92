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
use std::{fs::File, io, os::unix::fs::FileExt as _};

/// The file [`working_set_from_vmstat`] reads.
pub const VMSTAT: &str = "/proc/vmstat";
const MEMINFO: &str = "/proc/meminfo";
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

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

/// Pages the kernel has scanned to reclaim memory since boot (kswapd's
/// and direct reclaim's), from /proc/vmstat: a scenario that needs the
/// kernel to reclaim nothing compares two readings.
pub fn pages_scanned_for_reclaim() -> io::Result<u64> {
    let text = std::fs::read_to_string(VMSTAT)?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(name, _)| name.starts_with("pgscan_"))
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        .sum())
}

/// `MemFree` of /proc/meminfo, in bytes.
fn free_memory() -> io::Result<u64> {
    let text = std::fs::read_to_string(MEMINFO)?;
    text.lines()
        .find_map(|line| line.strip_prefix("MemFree:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib << 10)
        .ok_or_else(|| io::Error::other("MemFree missing from /proc/meminfo"))
}

/// At least `bytes` of the machine's memory free, so that a scenario
/// that allocates that much wakes no reclaim: a machine whose memory is
/// full of page cache (a build's, for one) reclaims on every allocation,
/// from every cgroup's lists, a test's included. Where less is free, the
/// kernel drops its clean page cache (nothing is lost: it is read back
/// from disk when next used); an error if that still leaves less.
pub fn make_room(bytes: u64) -> io::Result<()> {
    if free_memory()? >= bytes {
        return Ok(());
    }
    std::fs::write(DROP_CACHES, "1")?;
    let free = free_memory()?;
    if free < bytes {
        return Err(io::Error::other(format!(
            "{} MiB free once the clean page cache is dropped, {} MiB needed",
            free >> 20,
            bytes >> 20
        )));
    }
    Ok(())
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
