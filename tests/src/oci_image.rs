//! A container image built here, with no registry: one uncompressed layer
//! of files from this machine, written as an OCI image layout in a tar
//! archive that `ctr images import` reads.
//!
//! The containerd tier's image holds the `evictd-workload` binary the other
//! tests run and the shared libraries `ldd` says it loads, copied from this
//! host: the very binary the cgroup-only tests use, at no extra build (a
//! static build would need the musl target and a second build of the
//! agent's library).
use std::{
    collections::BTreeSet,
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::json;
use sha2::{Digest as _, Sha256};

/// An image being assembled: files, entrypoint, default arguments.
#[derive(Debug, Default)]
pub struct OciImage {
    /// `(path in the image, contents)`.
    files: Vec<(PathBuf, Vec<u8>)>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

impl OciImage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an executable file at absolute `path` in the image.
    pub fn file(mut self, path: impl Into<PathBuf>, contents: Vec<u8>) -> Self {
        self.files.push((path.into(), contents));
        self
    }

    /// `binary` at `/name`, and every shared library it loads at the path
    /// `ldd` resolves it to on this machine (symlinks followed), so a
    /// dynamically linked binary runs in the image unchanged.
    pub fn binary_with_libraries(mut self, binary: &Path, name: &str) -> io::Result<Self> {
        let read = |path: &Path| {
            fs::read(path)
                .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))
        };
        self = self.file(Path::new("/").join(name), without_debug_info(binary)?);
        for library in shared_libraries(binary)? {
            let contents = read(&library)?;
            self = self.file(library, contents);
        }
        Ok(self)
    }

    pub fn entrypoint(mut self, args: &[&str]) -> Self {
        self.entrypoint = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// Default arguments (a container's `args` replace them).
    pub fn cmd(mut self, args: &[&str]) -> Self {
        self.cmd = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// Writes the image as an OCI layout archive to `archive`, named `name`
    /// (`io.containerd.image.name`, the name `ctr images import` gives it).
    pub fn write_archive(&self, name: &str, archive: &Path) -> io::Result<()> {
        let layer = self.layer()?;
        let layer_digest = digest(&layer);
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": self.entrypoint, "Cmd": self.cmd},
            // Uncompressed, so the layer's digest is its diff id.
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": digest(&config), "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer.len()}],
        }))?;
        let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(&manifest), "size": manifest.len(),
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": tag},
            }],
        }))?;
        let mut out = tar::Builder::new(fs::File::create(archive)?);
        append(
            &mut out,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
            0o644,
        )?;
        append(&mut out, "index.json", &index, 0o644)?;
        for blob in [&layer, &config, &manifest] {
            let hex = digest(blob);
            let hex = hex.trim_start_matches("sha256:");
            append(&mut out, format!("blobs/sha256/{hex}"), blob, 0o644)?;
        }
        out.into_inner()?.sync_all()
    }

    /// The layer: every file and its parent directories, as a tar.
    fn layer(&self) -> io::Result<Vec<u8>> {
        let mut dirs = BTreeSet::new();
        for (path, _) in &self.files {
            dirs.extend(path.ancestors().skip(1).filter(|d| *d != Path::new("/")));
        }
        let mut layer = tar::Builder::new(Vec::new());
        for dir in dirs {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            header.set_mtime(0);
            layer.append_data(&mut header, relative(dir), io::empty())?;
        }
        for (path, contents) in &self.files {
            append(&mut layer, relative(path), contents, 0o755)?;
        }
        layer.into_inner()
    }
}

fn relative(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

fn append<W: io::Write>(
    out: &mut tar::Builder<W>,
    path: impl AsRef<Path>,
    contents: &[u8],
    mode: u32,
) -> io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(mode);
    header.set_size(contents.len() as u64);
    header.set_mtime(0);
    out.append_data(&mut header, path, contents)
}

/// The binary's bytes without its debug sections (a debug build of the
/// workload is 160 MB, 2.6 MB without them), by binutils' objcopy; the
/// binary as it is where objcopy is missing.
fn without_debug_info(binary: &Path) -> io::Result<Vec<u8>> {
    let stripped = std::env::temp_dir().join(format!(
        "evictd-stripped-{}-{}",
        std::process::id(),
        binary
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("binary")
    ));
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(binary)
        .arg(&stripped)
        .status();
    let contents = match status {
        Ok(status) if status.success() => fs::read(&stripped),
        _ => fs::read(binary),
    };
    let _ = fs::remove_file(&stripped);
    contents.map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", binary.display())))
}

/// `sha256:<hex>`, an OCI digest.
fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The absolute paths in `ldd BINARY`'s output: each library it loads and
/// the dynamic loader.
fn shared_libraries(binary: &Path) -> io::Result<Vec<PathBuf>> {
    let output = Command::new("ldd").arg(binary).output()?;
    if !output.status.success() {
        // "not a dynamic executable": nothing to add.
        return Ok(Vec::new());
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&output.stdout)))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            line.split_whitespace()
                .find(|word| word.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_libraries_and_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn the_archive_is_an_oci_layout_whose_digests_match() {
        let dir = std::env::temp_dir().join(format!("evictd-oci-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let archive = dir.join("image.tar");
        OciImage::new()
            .file("/bin/hello", b"#!/bin/true\n".to_vec())
            .entrypoint(&["/bin/hello"])
            .write_archive("evictd.local/hello:1", &archive)
            .unwrap();
        let mut entries = tar::Archive::new(fs::File::open(&archive).unwrap());
        let mut blobs = Vec::new();
        let mut index = None;
        for entry in entries.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().into_owned();
            let mut contents = Vec::new();
            io::Read::read_to_end(&mut entry, &mut contents).unwrap();
            if let Ok(hex) = path.strip_prefix("blobs/sha256") {
                assert_eq!(digest(&contents), format!("sha256:{}", hex.display()));
                blobs.push(contents);
            } else if path == Path::new("index.json") {
                index = Some(serde_json::from_slice::<serde_json::Value>(&contents).unwrap());
            }
        }
        let index = index.unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "evictd.local/hello:1"
        );
        assert_eq!(blobs.len(), 3);
        fs::remove_dir_all(&dir).unwrap();
    }
}
