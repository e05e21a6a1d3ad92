//! The guest kernel: the newest Debian kernel package of a series,
//! downloaded once into `~/.cache/evictd/vm` and reduced to what booting
//! needs (the uncompressed image and the virtio/9p modules, in load order).
use std::{
    fs,
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
};

use anyhow::{Context as _, Result, bail};

use super::{APT_LIMIT, TOOL_LIMIT};
use crate::setup;

/// Modules the guest loads to reach its 9p shares (with their dependencies).
const GUEST_MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];

/// A guest kernel in the cache: its image, its release, and the modules
/// the initramfs loads, in load order.
pub struct Kernel {
    pub image: PathBuf,
    pub release: String,
    pub modules: Vec<PathBuf>,
}

impl Kernel {
    /// The newest Debian `linux-image-<VERSION>…-amd64-unsigned` package
    /// (VERSION is `6.1`, or exact: `6.1.0-56`), downloaded and unpacked
    /// once. Offline, the newest one already in the cache.
    pub fn cached(version: &str) -> Result<Self> {
        let cache = setup::cache_dir()?.join("vm");
        fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
        let mut listed = newest_package(version);
        if listed.is_err() && setup::is_root() {
            // A fresh machine may have no package lists yet.
            setup::step_bounded(
                "apt-get update",
                Command::new("apt-get").args(["update", "-qq"]),
                APT_LIMIT,
            )?;
            listed = newest_package(version);
        }
        let package = match listed {
            Ok(package) => package,
            Err(e) => newest_cached(&cache, version).with_context(|| {
                format!(
                    "no kernel package for {version:?} from apt ({e:#}) nor in {}",
                    cache.display()
                )
            })?,
        };
        let dir = cache.join(&package);
        if !dir.join("complete").exists() {
            unpack(&package, &dir)?;
        }
        let release = fs::read_to_string(dir.join("release"))?.trim().to_owned();
        let order = fs::read_to_string(dir.join("modules/order"))?;
        let modules = order
            .lines()
            .map(|name| dir.join("modules").join(name))
            .collect();
        let image = ["vmlinux", "vmlinuz"]
            .map(|name| dir.join(name))
            .into_iter()
            .find(|path| path.exists())
            .context("no kernel image in the cache")?;
        println!(
            "xtask: guest kernel {release} ({package}) from {}",
            dir.display()
        );
        Ok(Self {
            image,
            release,
            modules,
        })
    }
}

/// Debian's generic amd64 flavour only: the cloud flavour has no 9p.
fn package_matches(name: &str, version: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("linux-image-")
        .and_then(|rest| rest.strip_suffix("-amd64-unsigned"))
    else {
        return false;
    };
    // rest is e.g. 6.1.0-56: a version and an ABI number, nothing else.
    let Some((kernel, abi)) = rest.split_once('-') else {
        return false;
    };
    let exact = rest == version;
    let series = kernel
        .strip_prefix(version)
        .is_some_and(|tail| tail.starts_with('.'));
    (exact || series) && !abi.is_empty() && abi.chars().all(|c| c.is_ascii_digit())
}

/// Newest first: by kernel version, then ABI number.
fn package_order(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

fn newest_package(version: &str) -> Result<String> {
    let names = setup::output_bounded(
        Command::new("apt-cache").args(["pkgnames", "linux-image-"]),
        TOOL_LIMIT,
    )?;
    names
        .lines()
        .filter(|name| package_matches(name, version))
        .max_by_key(|name| package_order(name))
        .map(str::to_owned)
        .with_context(|| format!("apt knows no linux-image-{version}*-amd64-unsigned package"))
}

fn newest_cached(cache: &Path, version: &str) -> Result<String> {
    fs::read_dir(cache)?
        .flatten()
        .filter(|entry| entry.path().join("complete").exists())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| package_matches(name, version))
        .max_by_key(|name| package_order(name))
        .context("nothing cached")
}

/// Downloads `package` into `dir` and keeps what booting needs.
fn unpack(package: &str, dir: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    setup::step_bounded(
        &format!("download {package}"),
        Command::new("apt-get")
            // Downloading into a directory the _apt sandbox user cannot
            // write needs this, or apt warns and falls back to root anyway.
            .args(["download", "-qq", "-o", "APT::Sandbox::User=root", package])
            .current_dir(dir),
        APT_LIMIT,
    )?;
    let deb = fs::read_dir(dir)?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let root = dir.join("root");
    setup::step_bounded(
        "unpack the kernel package",
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        TOOL_LIMIT,
    )?;
    let release = fs::read_dir(root.join("lib/modules"))?
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .next()
        .context("the package has no lib/modules/<release>")?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    match decompress_image(&vmlinuz, &dir.join("vmlinux")) {
        Ok(()) => {}
        Err(e) => {
            println!("xtask: booting the compressed image (slower under TCG): {e:#}");
            fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
        }
    }
    let modules = dir.join("modules");
    fs::create_dir_all(&modules)?;
    let order = module_order(&root, &release)?;
    let mut names = Vec::new();
    for source in order {
        let name = source
            .file_name()
            .and_then(|n| n.to_str())
            .context("module file name")?;
        let (name, compressed) = match name.strip_suffix(".xz") {
            Some(plain) => (plain.to_owned(), true),
            None => (name.to_owned(), false),
        };
        // busybox insmod reads plain modules only (newer Debian kernels
        // ship them xz-compressed).
        if compressed {
            xz_decompress(&source, None, &modules.join(&name))?;
        } else {
            fs::copy(&source, modules.join(&name))?;
        }
        names.push(name);
    }
    fs::write(modules.join("order"), names.join("\n") + "\n")?;
    fs::write(dir.join("release"), &release)?;
    fs::remove_dir_all(&root)?;
    fs::remove_file(&deb)?;
    fs::write(dir.join("complete"), "")?;
    Ok(())
}

/// Module files to insmod, dependencies first, for [`GUEST_MODULES`];
/// modules built into the kernel are left out.
fn module_order(root: &Path, release: &str) -> Result<Vec<PathBuf>> {
    // The package ships no modules.dep: make one for modprobe to read.
    setup::step_bounded(
        "depmod",
        Command::new("depmod").arg("-b").arg(root).arg(release),
        TOOL_LIMIT,
    )?;
    let mut order: Vec<PathBuf> = Vec::new();
    for module in GUEST_MODULES {
        let text = setup::output_bounded(
            Command::new("modprobe").arg("-d").arg(root).args([
                "-S",
                release,
                "--show-depends",
                module,
            ]),
            TOOL_LIMIT,
        )?;
        for line in text.lines() {
            let Some(path) = line
                .strip_prefix("insmod ")
                .and_then(|r| r.split_whitespace().next())
            else {
                continue; // "builtin <name>"
            };
            let path = PathBuf::from(path);
            if !order.contains(&path) {
                order.push(path);
            }
        }
    }
    Ok(order)
}

/// The uncompressed kernel (an ELF that QEMU boots through its PVH entry)
/// from the xz stream inside a bzImage: decompressing it in the guest takes
/// seconds under TCG, here a second once.
fn decompress_image(vmlinuz: &Path, vmlinux: &Path) -> Result<()> {
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    let image = fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let start = image
        .windows(XZ_MAGIC.len())
        .position(|w| w == XZ_MAGIC)
        .context("no xz stream in the kernel image")?;
    xz_decompress(vmlinuz, Some(&image[start..]), vmlinux)?;
    let mut magic = [0u8; 4];
    fs::File::open(vmlinux)?.read_exact(&mut magic)?;
    if &magic != b"\x7fELF" {
        let _ = fs::remove_file(vmlinux);
        bail!("the decompressed kernel is not an ELF image");
    }
    Ok(())
}

/// `xz -dc --single-stream` of `input` (or of the file `source`) into
/// `output`; trailing data after the stream (a bzImage's) is ignored.
fn xz_decompress(source: &Path, input: Option<&[u8]>, output: &Path) -> Result<()> {
    let out = fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut xz = Command::new("xz");
    xz.args(["-dc", "--single-stream"]).stdout(out);
    match input {
        Some(_) => xz.stdin(Stdio::piped()),
        None => xz.stdin(fs::File::open(source)?),
    };
    let mut child = xz.spawn().context("starting xz")?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        let bytes = bytes.to_vec();
        // Fed from a thread so a full pipe cannot stall the bounded wait.
        thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let status = setup::wait_bounded(&mut child, TOOL_LIMIT)
        .with_context(|| format!("decompressing {}", source.display()))?;
    if !status.success() {
        bail!("xz failed on {} ({status})", source.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_generic_flavour_of_the_asked_series() {
        let version = "6.1";
        for name in [
            "linux-image-6.1.0-56-amd64-unsigned",
            "linux-image-6.1.0-9-amd64-unsigned",
        ] {
            assert!(package_matches(name, version), "{name}");
        }
        for name in [
            "linux-image-6.1.0-56-cloud-amd64-unsigned",
            "linux-image-6.1.0-56-rt-amd64-unsigned",
            "linux-image-6.12.0-1-amd64-unsigned",
            "linux-image-6.1.0-56-amd64",
            "linux-image-6.1.0-56-amd64-dbg",
        ] {
            assert!(!package_matches(name, version), "{name}");
        }
        assert!(package_matches(
            "linux-image-6.1.0-56-amd64-unsigned",
            "6.1.0-56"
        ));
        assert!(!package_matches(
            "linux-image-6.1.0-55-amd64-unsigned",
            "6.1.0-56"
        ));
        let newest = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-56-amd64-unsigned",
        ]
        .into_iter()
        .max_by_key(|name| package_order(name));
        assert_eq!(newest, Some("linux-image-6.1.0-56-amd64-unsigned"));
    }
}
