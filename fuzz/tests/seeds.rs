//! Every committed seed and regression input (`fuzz/seeds/<target>/`)
//! through its target's checks, on the stable toolchain, in `cargo test`:
//! what the fuzzer once found stays fixed without a fuzzing run.
use std::{fs, path::Path};

/// One target's checks.
type Check = fn(&str);

#[test]
fn every_seed_passes_its_targets_checks() {
    let targets: [(&str, Check); 6] = [
        ("quantity", evictd_fuzz::quantity),
        ("duration", evictd_fuzz::duration),
        ("watch", evictd_fuzz::watch),
        ("threshold_flags", evictd_fuzz::threshold_flags),
        ("kubelet_config", evictd_fuzz::kubelet_config),
        ("simulate", evictd_fuzz::simulate),
    ];
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    for (target, check) in targets {
        let dir = seeds.join(target);
        let mut inputs = 0;
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let bytes = fs::read(&path).unwrap();
            // The targets take text; libFuzzer skips other inputs too.
            if let Ok(text) = std::str::from_utf8(&bytes) {
                check(text);
                inputs += 1;
            }
        }
        assert!(inputs > 0, "no seeds for {target}");
    }
}
