//! Debian's kernel packages: how each release names and splits them, and
//! where apt finds them.
//!
//! - bookworm (the machine's own sources): one package per kernel,
//!   `linux-image-6.1.0-56-amd64-unsigned` or
//!   `linux-image-6.12.117+deb12-amd64-unsigned`, with the image in
//!   `boot/vmlinuz-<release>` and the modules in `lib/modules/<release>`.
//! - trixie-backports (7.2), reached through a source list of our own
//!   ([`Source::Backports`]): `linux-binary-unsigned-7.2.12+deb13-amd64`
//!   holds `usr/lib/modules/<release>/vmlinuz.unsigned`,
//!   `linux-modules-7.2.12+deb13-amd64` the modules and
//!   `linux-base-7.2.12+deb13-amd64` `modules.builtin`, without which
//!   modprobe cannot tell a built-in module (virtio_pci) from a missing one.
//!   `linux-image-7.2.12+deb13-amd64` is only a meta package.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::super::{APT_LIMIT, TOOL_LIMIT};
use crate::setup;

/// How a kernel's files are split into packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// `linux-image-<version>-amd64-unsigned` alone (bookworm).
    Image,
    /// `linux-binary-unsigned-<version>-amd64` and its `linux-modules-`
    /// and `linux-base-` packages (trixie and its backports).
    Split,
}

impl Layout {
    const ALL: [Self; 2] = [Self::Image, Self::Split];

    /// What a package name of this layout starts and ends with; the
    /// generic amd64 flavour only (the cloud flavour has no 9p).
    fn affixes(self) -> (&'static str, &'static str) {
        match self {
            Self::Image => ("linux-image-", "-amd64-unsigned"),
            Self::Split => ("linux-binary-unsigned-", "-amd64"),
        }
    }
}

/// A Debian kernel of the generic amd64 flavour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    layout: Layout,
    /// Debian's version in the package names: `6.1.0-56` (an ABI number)
    /// or `6.12.117+deb12`.
    version: String,
}

impl Package {
    /// The package a name stands for, if it is the kernel of one.
    pub fn parse(name: &str) -> Option<Self> {
        Layout::ALL.into_iter().find_map(|layout| {
            let (prefix, suffix) = layout.affixes();
            let version = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            upstream(version)?;
            Some(Self {
                layout,
                version: version.to_owned(),
            })
        })
    }

    /// The package naming the kernel (and its directory in the cache).
    pub fn name(&self) -> String {
        let (prefix, suffix) = self.layout.affixes();
        format!("{prefix}{}{suffix}", self.version)
    }

    /// Every package to download for the image and the modules.
    pub fn downloads(&self) -> Vec<String> {
        match self.layout {
            Layout::Image => vec![self.name()],
            Layout::Split => ["linux-modules-", "linux-base-"]
                .into_iter()
                .map(|prefix| format!("{prefix}{}-amd64", self.version))
                .chain([self.name()])
                .collect(),
        }
    }

    /// `uname -r` of the kernel, the name of its modules directory.
    pub fn release(&self) -> String {
        format!("{}-amd64", self.version)
    }

    /// The compressed kernel in the unpacked packages, `root/lib` being
    /// `usr/lib` where the packages are merged-/usr.
    pub fn image(&self, root: &Path) -> PathBuf {
        let release = self.release();
        match self.layout {
            Layout::Image => root.join("boot").join(format!("vmlinuz-{release}")),
            Layout::Split => root
                .join("lib/modules")
                .join(release)
                .join("vmlinuz.unsigned"),
        }
    }

    /// Whether this is what `--kernel asked` names: a series (`6.1`,
    /// `6.12`, `7.2`), an upstream version (`6.12.117`) or Debian's exact
    /// one (`6.1.0-56`, `6.12.117+deb12`).
    pub fn matches(&self, asked: &str) -> bool {
        let Some(upstream) = upstream(&self.version) else {
            return false;
        };
        self.version == asked
            || upstream == asked
            || upstream
                .strip_prefix(asked)
                .is_some_and(|tail| tail.starts_with('.'))
    }

    /// Sorts newest last: by upstream version, then ABI or Debian release.
    pub fn order(&self) -> Vec<u64> {
        self.version
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|part| part.parse().ok())
            .collect()
    }
}

/// The upstream version (`6.1.0`) of a Debian version: the version and a
/// `-<abi>` or `+deb<release>`, nothing else (which leaves out flavours
/// such as `6.1.0-56-cloud` and `6.12.117+deb12-rt`).
fn upstream(version: &str) -> Option<&str> {
    let at = version.find(['-', '+'])?;
    let (upstream, tail) = version.split_at(at);
    let numbers = |text: &str| !text.is_empty() && text.chars().all(|c| c.is_ascii_digit());
    let parts: Vec<&str> = upstream.split('.').collect();
    let tail_ok = tail
        .strip_prefix('-')
        .or_else(|| tail.strip_prefix("+deb"))
        .is_some_and(numbers);
    (parts.len() >= 2 && parts.iter().all(|part| numbers(part)) && tail_ok).then_some(upstream)
}

/// The newest kernel among package `names` that `asked` names.
pub fn newest<'a>(names: impl IntoIterator<Item = &'a str>, asked: &str) -> Option<Package> {
    names
        .into_iter()
        .filter_map(Package::parse)
        .filter(|package| package.matches(asked))
        .max_by_key(Package::order)
}

/// Where apt finds a kernel package.
pub enum Source {
    /// The machine's own apt sources (bookworm: 6.1 and 6.12).
    System,
    /// Debian's trixie-backports (7.2) through a source list, package
    /// lists and cache of our own in this directory, so the machine's apt
    /// state is never touched.
    Backports(PathBuf),
}

/// The suite past the machine's bookworm that carries newer kernels.
const BACKPORTS_SUITE: &str = "trixie-backports";
/// The machine's Debian sources, whose mirror the backports come from.
const SYSTEM_SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";
/// Where no mirror can be read from [`SYSTEM_SOURCES`].
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

impl Source {
    /// The backports source under `cache`, its package lists refreshed.
    /// Offline, the lists of the last refresh (if any) are used.
    pub fn backports(cache: &Path) -> Result<Self> {
        let dir = cache.join("apt");
        for sub in ["lists/partial", "cache/archives/partial"] {
            let path = dir.join(sub);
            fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        }
        let mirror = fs::read_to_string(SYSTEM_SOURCES)
            .ok()
            .and_then(|text| debian_mirror(&text))
            .unwrap_or_else(|| DEFAULT_MIRROR.to_owned());
        fs::write(
            dir.join("sources.list"),
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 {mirror} {BACKPORTS_SUITE} main\n"
            ),
        )?;
        let source = Self::Backports(dir);
        let mut update = source.apt("apt-get");
        update.args(["update", "-qq"]);
        if let Err(e) = setup::step_bounded(
            &format!("apt-get update ({BACKPORTS_SUITE}, lists of our own)"),
            &mut update,
            APT_LIMIT,
        ) {
            println!("xtask: using the {BACKPORTS_SUITE} lists as they were: {e:#}");
        }
        Ok(source)
    }

    /// `program` (apt-get or apt-cache) reading this source only.
    pub fn apt(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        // Downloading into a directory the _apt sandbox user cannot write
        // (root's cache) needs this, or apt warns and falls back to root.
        command.args(["-o", "APT::Sandbox::User=root"]);
        if let Self::Backports(dir) = self {
            // Dir::Cache too: apt-cache would otherwise rebuild the
            // machine's package cache from these lists.
            for (option, path) in [
                ("Dir::Etc::SourceList", dir.join("sources.list")),
                ("Dir::Etc::SourceParts", PathBuf::from("/dev/null")),
                ("Dir::State::Lists", dir.join("lists")),
                ("Dir::Cache", dir.join("cache")),
            ] {
                command
                    .arg("-o")
                    .arg(format!("{option}={}", path.display()));
            }
        }
        command
    }

    /// The newest kernel this source's lists know that `asked` names.
    pub fn newest(&self, asked: &str) -> Result<Option<Package>> {
        let mut names = String::new();
        for layout in Layout::ALL {
            let (prefix, _) = layout.affixes();
            names += &setup::output_bounded(
                self.apt("apt-cache").args(["pkgnames", prefix]),
                TOOL_LIMIT,
            )?;
        }
        Ok(newest(names.lines(), asked))
    }
}

/// The first Debian mirror (not the security archive) in a deb822
/// sources file.
fn debian_mirror(sources: &str) -> Option<String> {
    sources
        .lines()
        .filter_map(|line| line.trim().strip_prefix("URIs:"))
        .flat_map(str::split_whitespace)
        .find(|uri| !uri.contains("security"))
        .map(|uri| uri.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_generic_flavour_of_the_asked_series() {
        for (name, asked) in [
            ("linux-image-6.1.0-56-amd64-unsigned", "6.1"),
            ("linux-image-6.1.0-9-amd64-unsigned", "6.1"),
            ("linux-image-6.1.0-56-amd64-unsigned", "6.1.0-56"),
            ("linux-image-6.12.117+deb12-amd64-unsigned", "6.12"),
            ("linux-image-6.12.117+deb12-amd64-unsigned", "6.12.117"),
            (
                "linux-image-6.12.117+deb12-amd64-unsigned",
                "6.12.117+deb12",
            ),
            ("linux-binary-unsigned-7.2.12+deb13-amd64", "7.2"),
            ("linux-binary-unsigned-7.2.12+deb13-amd64", "7.2.12+deb13"),
        ] {
            let package = Package::parse(name);
            assert!(
                package.is_some_and(|p| p.matches(asked)),
                "{name} for {asked}"
            );
        }
        for (name, asked) in [
            ("linux-image-6.1.0-56-cloud-amd64-unsigned", "6.1"),
            ("linux-image-6.1.0-56-rt-amd64-unsigned", "6.1"),
            ("linux-image-6.12.0-1-amd64-unsigned", "6.1"),
            ("linux-image-6.12.117+deb12-amd64-unsigned", "6.1"),
            ("linux-image-6.12.117+deb12-cloud-amd64-unsigned", "6.12"),
            ("linux-image-6.1.0-56-amd64", "6.1"),
            ("linux-image-6.1.0-56-amd64-dbg", "6.1"),
            ("linux-image-6.12-amd64", "6.12"),
            ("linux-image-6.1.0-55-amd64-unsigned", "6.1.0-56"),
            ("linux-image-7.2.12+deb13-amd64", "7.2"),
            ("linux-binary-unsigned-7.2.12+deb13-rt-amd64", "7.2"),
            ("linux-binary-unsigned-7.3.4+deb13-amd64", "7.2"),
            ("linux-modules-7.2.12+deb13-amd64", "7.2"),
        ] {
            let package = Package::parse(name);
            assert!(
                !package.is_some_and(|p| p.matches(asked)),
                "{name} for {asked}"
            );
        }
    }

    #[test]
    fn the_newest_of_a_series_wins_by_number_not_text() {
        let names = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-56-amd64-unsigned",
            "linux-image-6.12.99+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-amd64-unsigned",
            "linux-image-6.12.111+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-cloud-amd64-unsigned",
            "linux-binary-unsigned-7.2.9+deb13-amd64",
            "linux-binary-unsigned-7.2.12+deb13-amd64",
            "linux-binary-unsigned-7.3.4+deb13-amd64",
        ];
        let pick = |asked| newest(names, asked).map(|package| package.name());
        assert_eq!(
            pick("6.1").as_deref(),
            Some("linux-image-6.1.0-56-amd64-unsigned")
        );
        assert_eq!(
            pick("6.12").as_deref(),
            Some("linux-image-6.12.117+deb12-amd64-unsigned")
        );
        assert_eq!(
            pick("6.12.111").as_deref(),
            Some("linux-image-6.12.111+deb12-amd64-unsigned")
        );
        assert_eq!(
            pick("7.2").as_deref(),
            Some("linux-binary-unsigned-7.2.12+deb13-amd64")
        );
        assert_eq!(pick("6.2"), None);
    }

    #[test]
    fn each_layout_knows_its_packages_release_and_image() {
        let root = Path::new("/r");
        let bookworm = Package::parse("linux-image-6.12.117+deb12-amd64-unsigned");
        let bookworm = bookworm.expect("a kernel");
        assert_eq!(bookworm.release(), "6.12.117+deb12-amd64");
        assert_eq!(bookworm.downloads(), [bookworm.name()]);
        assert_eq!(
            bookworm.image(root),
            Path::new("/r/boot/vmlinuz-6.12.117+deb12-amd64")
        );
        let trixie = Package::parse("linux-binary-unsigned-7.2.12+deb13-amd64");
        let trixie = trixie.expect("a kernel");
        assert_eq!(trixie.release(), "7.2.12+deb13-amd64");
        assert_eq!(
            trixie.downloads(),
            [
                "linux-modules-7.2.12+deb13-amd64",
                "linux-base-7.2.12+deb13-amd64",
                "linux-binary-unsigned-7.2.12+deb13-amd64",
            ]
        );
        assert_eq!(
            trixie.image(root),
            Path::new("/r/lib/modules/7.2.12+deb13-amd64/vmlinuz.unsigned")
        );
    }

    #[test]
    fn the_mirror_is_the_machines_debian_one_not_security() {
        let sources = "Types: deb\n\
            URIs: http://deb.debian.org/debian-security\n\
            Suites: bookworm-security\n\
            \n\
            Types: deb\n\
            # http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
            URIs: http://mirror.example/debian/\n\
            Suites: bookworm bookworm-updates\n";
        assert_eq!(
            debian_mirror(sources).as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(debian_mirror("Types: deb\n"), None);
    }
}
