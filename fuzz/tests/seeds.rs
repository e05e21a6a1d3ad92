//! Every committed seed and regression input (`fuzz/seeds/<target>/`)
//! through its target's checks, on the stable toolchain, in `cargo test`:
//! what the fuzzer once found stays fixed without a fuzzing run.
use std::{fs, path::Path};

/// One target's checks, on text or on bytes.
#[derive(Clone, Copy)]
enum Check {
    Text(fn(&str)),
    Bytes(fn(&[u8])),
}

#[test]
fn every_seed_passes_its_targets_checks() {
    let targets: [(&str, Check); 11] = [
        ("quantity", Check::Text(evictd_fuzz::quantity)),
        ("duration", Check::Text(evictd_fuzz::duration)),
        ("watch", Check::Text(evictd_fuzz::watch)),
        ("threshold_flags", Check::Text(evictd_fuzz::threshold_flags)),
        ("kubelet_config", Check::Text(evictd_fuzz::kubelet_config)),
        ("simulate", Check::Text(evictd_fuzz::simulate)),
        ("cgroupfs", Check::Bytes(evictd_fuzz::cgroupfs)),
        ("cri", Check::Bytes(evictd_fuzz::cri)),
        ("pod", Check::Bytes(evictd_fuzz::pod)),
        ("state_files", Check::Bytes(evictd_fuzz::state_files)),
        ("ring_buffer", Check::Bytes(evictd_fuzz::ring_buffer)),
    ];
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    for (target, check) in targets {
        let dir = seeds.join(target);
        let mut inputs = 0;
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let bytes = fs::read(&path).unwrap();
            match check {
                // The text targets take text; libFuzzer skips other inputs too.
                Check::Text(check) => match std::str::from_utf8(&bytes) {
                    Ok(text) => check(text),
                    Err(_) => continue,
                },
                Check::Bytes(check) => check(&bytes),
            }
            inputs += 1;
        }
        assert!(inputs > 0, "no seeds for {target}");
    }
}
