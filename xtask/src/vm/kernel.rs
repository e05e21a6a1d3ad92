//! The guest kernel: the newest Debian kernel of a series (see `debian`
//! for where each comes from), downloaded once into `~/.cache/evictd/vm`
//! and reduced to what booting needs (the uncompressed image and the
//! virtio/9p, virtio disk and ext4, overlay and FUSE modules, in load
//! order).
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
use debian::{Package, Source};

mod debian;

/// Modules the guest loads (with their dependencies): to reach its 9p
/// shares and its scratch disk, overlayfs for containerd's snapshotter,
/// and FUSE for the confined tests' file that never answers.
const GUEST_MODULES: [&str; 7] = [
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "virtio_blk",
    "ext4",
    "overlay",
    "fuse",
];

/// Whether `dir` holds a kernel unpacked with today's [`GUEST_MODULES`]:
/// its marker names them, so a cache from before a module was added is
/// unpacked again.
fn is_complete(dir: &Path) -> bool {
    fs::read_to_string(dir.join("complete")).is_ok_and(|kept| kept == GUEST_MODULES.join(" "))
}

/// A guest kernel in the cache: its image, its release, and the modules
/// the initramfs loads, in load order.
pub struct Kernel {
    pub image: PathBuf,
    pub release: String,
    pub modules: Vec<PathBuf>,
}

impl Kernel {
    /// The newest Debian kernel that `asked` names (a series such as
    /// `6.12`, or an exact version: see [`Package::matches`]), from the
    /// machine's apt sources or else trixie-backports, downloaded and
    /// unpacked once. Offline, the newest one already in the cache.
    pub fn cached(asked: &str) -> Result<Self> {
        let cache = setup::cache_dir()?.join("vm");
        fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
        let package = match newest_listed(asked, &cache) {
            Ok((package, source)) => {
                let dir = cache.join(package.name());
                if is_complete(&dir) {
                    package
                } else {
                    match unpack(&package, &source, &dir) {
                        Ok(()) => package,
                        // Lists can name what an offline machine cannot fetch.
                        Err(e) => {
                            let cached = newest_cached(&cache, asked)
                                .with_context(|| format!("{e:#}; nothing cached either"))?;
                            println!("xtask: {e:#}; booting the newest cached kernel instead");
                            cached
                        }
                    }
                }
            }
            Err(e) => newest_cached(&cache, asked).with_context(|| {
                format!(
                    "no kernel package for {asked:?} from apt ({e:#}) nor in {}",
                    cache.display()
                )
            })?,
        };
        let name = package.name();
        let dir = cache.join(&name);
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
            "xtask: guest kernel {release} ({name}) from {}",
            dir.display()
        );
        Ok(Self {
            image,
            release,
            modules,
        })
    }
}

/// The newest kernel apt knows for `asked`: the machine's sources first,
/// then trixie-backports; with the machine's lists refreshed once (as
/// root) if neither knows one, since a fresh machine may have none yet.
fn newest_listed(asked: &str, cache: &Path) -> Result<(Package, Source)> {
    if let Some(package) = Source::System.newest(asked)? {
        return Ok((package, Source::System));
    }
    let backports = Source::backports(cache)?;
    if let Some(package) = backports.newest(asked)? {
        return Ok((package, backports));
    }
    if setup::is_root() {
        setup::step_bounded(
            "apt-get update",
            Command::new("apt-get").args(["update", "-qq"]),
            APT_LIMIT,
        )?;
        if let Some(package) = Source::System.newest(asked)? {
            return Ok((package, Source::System));
        }
    }
    bail!(
        "apt knows no kernel package for {asked:?} (linux-image-{asked}*-amd64-unsigned \
         in the machine's sources, linux-binary-unsigned-{asked}*-amd64 in trixie-backports)"
    )
}

fn newest_cached(cache: &Path, asked: &str) -> Result<Package> {
    let names: Vec<String> = fs::read_dir(cache)?
        .flatten()
        .filter(|entry| is_complete(&entry.path()))
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    debian::newest(names.iter().map(String::as_str), asked).context("nothing cached")
}

/// Downloads `package` into `dir` and keeps what booting needs.
fn unpack(package: &Package, source: &Source, dir: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    let downloads = package.downloads();
    setup::step_bounded(
        &format!("download {}", downloads.join(" ")),
        source
            .apt("apt-get")
            .args(["download", "-qq"])
            .args(&downloads)
            .current_dir(dir),
        APT_LIMIT,
    )?;
    let debs: Vec<PathBuf> = fs::read_dir(dir)?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "deb"))
        .collect();
    if debs.len() != downloads.len() {
        bail!(
            "apt-get download left {} .deb files, not {}",
            debs.len(),
            downloads.len()
        );
    }
    let root = dir.join("root");
    for deb in &debs {
        setup::step_bounded(
            &format!(
                "unpack {}",
                deb.file_name().unwrap_or_default().to_string_lossy()
            ),
            Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root),
            TOOL_LIMIT,
        )?;
    }
    // Trixie's packages are merged-/usr (usr/lib/modules); depmod and
    // modprobe look in lib/modules, as on an installed system.
    if !root.join("lib").exists() && root.join("usr/lib/modules").exists() {
        std::os::unix::fs::symlink("usr/lib", root.join("lib"))?;
    }
    let release = package.release();
    if !root.join("lib/modules").join(&release).is_dir() {
        bail!("{} has no lib/modules/{release}", package.name());
    }
    let vmlinuz = package.image(&root);
    match decompress_image(&vmlinuz, &dir.join("vmlinux")) {
        Ok(()) => {}
        Err(e) => {
            println!("xtask: booting the compressed image (slower under TCG): {e:#}");
            fs::copy(&vmlinuz, dir.join("vmlinuz"))
                .with_context(|| format!("copying {}", vmlinuz.display()))?;
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
        // busybox insmod reads plain modules only (Debian's 6.12 and 7.2
        // ship them xz-compressed; kmod also knows zstd).
        let name = match Compression::of_file(name) {
            Some((plain, compression)) => {
                decompress(compression, &source, None, &modules.join(plain))?;
                plain
            }
            None => {
                fs::copy(&source, modules.join(name))?;
                name
            }
        };
        names.push(name.to_owned());
    }
    fs::write(modules.join("order"), names.join("\n") + "\n")?;
    fs::write(dir.join("release"), &release)?;
    fs::remove_dir_all(&root)?;
    for deb in &debs {
        fs::remove_file(deb)?;
    }
    fs::write(dir.join("complete"), GUEST_MODULES.join(" "))?;
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

/// How a kernel image or module is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    Xz,
    Zstd,
}

impl Compression {
    /// By its stream's magic number.
    fn of_stream(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(b"\xfd7zXZ\x00") {
            Some(Self::Xz)
        } else if bytes.starts_with(b"\x28\xb5\x2f\xfd") {
            Some(Self::Zstd)
        } else {
            None
        }
    }

    /// By a module's file name: the plain name and the compression.
    fn of_file(name: &str) -> Option<(&str, Self)> {
        name.strip_suffix(".xz")
            .map(|plain| (plain, Self::Xz))
            .or_else(|| name.strip_suffix(".zst").map(|plain| (plain, Self::Zstd)))
    }

    /// The tool decompressing one stream from stdin or a file to stdout.
    fn command(self) -> Command {
        match self {
            Self::Xz => {
                let mut xz = Command::new("xz");
                xz.args(["-dc", "--single-stream"]);
                xz
            }
            Self::Zstd => {
                let mut zstd = Command::new("zstd");
                zstd.args(["-dcq"]);
                zstd
            }
        }
    }
}

/// The uncompressed kernel (an ELF that QEMU boots through its PVH entry)
/// from the compressed stream inside a bzImage (xz for 6.1, zstd for 6.12
/// and 7.2): decompressing it in the guest takes seconds under TCG, here a
/// second once.
fn decompress_image(vmlinuz: &Path, vmlinux: &Path) -> Result<()> {
    let image = fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let (compression, stream) = bzimage_payload(&image)?;
    decompress(compression, vmlinuz, Some(stream), vmlinux)?;
    let mut magic = [0u8; 4];
    fs::File::open(vmlinux)?.read_exact(&mut magic)?;
    if &magic != b"\x7fELF" {
        let _ = fs::remove_file(vmlinux);
        bail!("the decompressed kernel is not an ELF image");
    }
    Ok(())
}

/// The compressed kernel inside a bzImage, where the x86 boot protocol
/// (2.08 and later) says it is: `payload_offset` and `payload_length` in
/// the setup header, counted from the protected-mode code that follows
/// the `setup_sects` sectors of real-mode setup.
fn bzimage_payload(image: &[u8]) -> Result<(Compression, &[u8])> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?))
    };
    let version = image
        .get(0x206..0x208)
        .map(|b| u16::from_le_bytes([b[0], b[1]]));
    if image.get(0x202..0x206) != Some(b"HdrS") || version < Some(0x208) {
        bail!("not a bzImage of boot protocol 2.08 or later");
    }
    // A setup_sects of 0 means 4, for the oldest loaders' sake.
    let setup_sectors = match image[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let (offset, length) = u32_at(0x248)
        .zip(u32_at(0x24c))
        .context("no payload fields in the setup header")?;
    let start = (setup_sectors + 1) * 512 + usize::try_from(offset)?;
    let payload = image
        .get(start..start + usize::try_from(length)?)
        .context("the payload runs past the end of the image")?;
    // The build appends the uncompressed size (4 bytes) to the stream,
    // which zstd (unlike `xz --single-stream`) refuses as a second frame.
    let stream = payload
        .get(..payload.len().saturating_sub(4))
        .unwrap_or_default();
    let compression =
        Compression::of_stream(stream).context("the kernel is neither xz nor zstd compressed")?;
    Ok((compression, stream))
}

/// Decompresses `input` (or else the file `source`) into `output`.
fn decompress(
    compression: Compression,
    source: &Path,
    input: Option<&[u8]>,
    output: &Path,
) -> Result<()> {
    let out = fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut tool = compression.command();
    tool.stdout(out);
    match input {
        Some(_) => tool.stdin(Stdio::piped()),
        None => tool.stdin(fs::File::open(source)?),
    };
    let mut child = tool
        .spawn()
        .with_context(|| format!("starting {compression:?} decompression"))?;
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
        bail!("{tool:?} failed on {} ({status})", source.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bzImage with one setup sector and `stream` (plus the 4 size
    /// bytes the build appends) 16 bytes into the protected-mode code.
    fn bzimage(stream: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 1024 + 16];
        image[0x1f1] = 1;
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        image[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        let length = u32::try_from(stream.len() + 4).expect("small");
        image[0x24c..0x250].copy_from_slice(&length.to_le_bytes());
        image.extend_from_slice(stream);
        image.extend_from_slice(&[0xaa; 4]);
        image.extend_from_slice(b"trailing");
        image
    }

    #[test]
    fn finds_the_kernel_stream_and_its_compression_from_the_setup_header() {
        let zstd = b"\x28\xb5\x2f\xfdframe";
        let image = bzimage(zstd);
        let (compression, stream) = bzimage_payload(&image).expect("a payload");
        assert_eq!(compression, Compression::Zstd);
        assert_eq!(stream, zstd);
        let xz = b"\xfd7zXZ\x00stream";
        let image = bzimage(xz);
        assert_eq!(
            bzimage_payload(&image).expect("a payload"),
            (Compression::Xz, &xz[..])
        );
        assert!(bzimage_payload(&bzimage(b"gzip?")).is_err());
        let mut old = bzimage(zstd);
        old[0x206..0x208].copy_from_slice(&0x0206u16.to_le_bytes());
        assert!(bzimage_payload(&old).is_err());
        assert!(bzimage_payload(b"\x7fELF").is_err());
    }

    #[test]
    fn modules_are_named_plain_for_busybox_insmod() {
        assert_eq!(
            Compression::of_file("9p.ko.xz"),
            Some(("9p.ko", Compression::Xz))
        );
        assert_eq!(
            Compression::of_file("9p.ko.zst"),
            Some(("9p.ko", Compression::Zstd))
        );
        assert_eq!(Compression::of_file("9p.ko"), None);
    }
}
