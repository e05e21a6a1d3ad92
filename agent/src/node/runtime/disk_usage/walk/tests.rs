use std::{fs, os::unix::fs::PermissionsExt as _, path::Path};

use rustix::thread::{CapabilitySet, capabilities, set_capabilities};

use super::*;

const KIB: u64 = 1024;

fn walk(path: &Path, bounds: WalkBounds) -> (Measured, Option<Shortfall>) {
    let mut walk = Walk::new(bounds);
    let measured = walk.du(path);
    (measured, walk.into_shortfall())
}

fn unbounded() -> WalkBounds {
    WalkBounds::default()
}

/// `count` empty files in `dir`.
fn files(dir: &Path, count: usize) {
    fs::create_dir_all(dir).unwrap();
    for n in 0..count {
        fs::File::create(dir.join(format!("f{n}"))).unwrap();
    }
}

#[test]
fn counts_blocks_and_inodes_each_hard_linked_file_once_and_follows_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("vol");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::write(root.join("sub/data"), vec![1u8; 64 * 1024]).unwrap();
    // Three links to one 64 KiB file, and another pair.
    fs::hard_link(root.join("sub/data"), root.join("link")).unwrap();
    fs::hard_link(root.join("sub/data"), root.join("sub/link2")).unwrap();
    fs::write(root.join("pair"), vec![2u8; 8 * 1024]).unwrap();
    fs::hard_link(root.join("pair"), root.join("sub/pair")).unwrap();
    // Nothing behind a symlink or a FIFO is counted or opened: the FIFO
    // would block an open for ever, the symlink leads out of the volume.
    std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
    nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (measured, shortfall) = walk(&root, unbounded());
    assert_eq!(shortfall, None);
    assert!(measured.whole);
    // vol, sub, data (once), pair (once), escape, fifo.
    assert_eq!(measured.usage.inodes, 6);
    assert!(measured.usage.bytes >= 72 * KIB, "{measured:?}");
    assert!(
        measured.usage.bytes < 72 * KIB + 6 * 16 * KIB,
        "{measured:?}"
    );
    // A missing path is nothing, and whole.
    let (absent, shortfall) = walk(&dir.path().join("absent"), unbounded());
    assert_eq!(
        (absent.usage, absent.whole, shortfall),
        (FsUsage::default(), true, None)
    );
    // A file is its own usage.
    let (file, _) = walk(&root.join("sub/data"), unbounded());
    assert_eq!(file.usage.inodes, 1);
}

#[test]
fn entries_past_the_bound_are_not_walked_and_the_walk_says_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    files(&dir.path().join("big"), 1000);
    files(&dir.path().join("small"), 3);
    let bounds = WalkBounds {
        max_entries: 100,
        ..unbounded()
    };
    let mut walk = Walk::new(bounds);
    let big = walk.du(&dir.path().join("big"));
    assert!(!big.whole);
    // At least what was seen: the bound's worth.
    assert_eq!(big.usage.inodes, 100);
    // The budget is the pod's: a later volume is not walked at all.
    let small = walk.du(&dir.path().join("small"));
    assert_eq!((small.usage, small.whole), (FsUsage::default(), false));
    let shortfall = walk.into_shortfall().unwrap();
    assert_eq!(shortfall.reason, Incomplete::Entries);
    assert!(
        shortfall.path.starts_with(dir.path().join("big")),
        "{shortfall:?}"
    );
}

#[test]
fn directories_past_the_depth_bound_are_counted_but_not_entered() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("vol");
    let deep = root.join("a/b/c/d/e");
    fs::create_dir_all(&deep).unwrap();
    files(&deep, 5);
    fs::write(root.join("a/top"), b"x").unwrap();
    let bounds = WalkBounds {
        max_depth: 3,
        ..unbounded()
    };
    let (measured, shortfall) = walk(&root, bounds);
    assert!(!measured.whole);
    // vol, a, top, b, c (seen, not entered).
    assert_eq!(measured.usage.inodes, 5);
    let shortfall = shortfall.unwrap();
    assert_eq!(shortfall.reason, Incomplete::Depth);
    assert_eq!(shortfall.path, root.join("a/b/c"));
    // 5 levels deep and more fit within the default bound.
    let (whole, _) = walk(&root, unbounded());
    assert!(whole.whole);
    assert_eq!(whole.usage.inodes, 12);
}

#[test]
fn a_walk_that_outlasts_its_time_stops_with_what_it_saw() {
    let dir = tempfile::tempdir().unwrap();
    files(dir.path(), 2 * CLOCK_EVERY as usize);
    let bounds = WalkBounds {
        max_time: Duration::ZERO,
        ..unbounded()
    };
    let (measured, shortfall) = walk(dir.path(), bounds);
    assert!(!measured.whole);
    assert_eq!(measured.usage.inodes, CLOCK_EVERY - 1);
    assert_eq!(shortfall.unwrap().reason, Incomplete::Time);
}

/// Runs `walk` on a thread of its own whose effective capabilities have
/// lost those that bypass file permissions (as evictd without
/// `CAP_DAC_READ_SEARCH`): capabilities are per thread.
fn without_dac_capabilities<T: Send>(walk: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut sets = capabilities(None).unwrap();
                sets.effective -= CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH;
                set_capabilities(None, sets).unwrap();
                walk()
            })
            .join()
            .unwrap()
    })
}

#[test]
fn a_directory_that_cannot_be_read_is_skipped_and_the_rest_still_counted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("vol");
    files(&root.join("open"), 4);
    let hidden = root.join("private");
    files(&hidden, 10);
    fs::set_permissions(&hidden, fs::Permissions::from_mode(0o000)).unwrap();
    let (measured, shortfall) = without_dac_capabilities(|| walk(&root, unbounded()));
    assert!(!measured.whole);
    // vol, open and its 4 files, private itself (stat needs no permission
    // on it): the 10 files inside are not seen.
    assert_eq!(measured.usage.inodes, 7);
    let shortfall = shortfall.unwrap();
    assert_eq!(shortfall.reason, Incomplete::Unreadable);
    assert_eq!(shortfall.path, hidden);
    assert!(
        shortfall
            .error
            .as_deref()
            .is_some_and(|e| e.contains("ermission denied")),
        "{shortfall:?}"
    );
    // With the capability the DaemonSet grants, everything is read.
    let (whole, shortfall) = walk(&root, unbounded());
    assert_eq!(shortfall, None);
    assert_eq!(whole.usage.inodes, 17);
    fs::set_permissions(&hidden, fs::Permissions::from_mode(0o700)).unwrap();
}
