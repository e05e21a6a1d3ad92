//! A process's memory as the kernel accounts it: `/proc/<pid>/status`
//! (resident now, and the high-water mark) and `/proc/<pid>/smaps`, summed
//! by what each mapping holds, to say where the agent's memory goes.
use std::{collections::BTreeMap, fmt, fs, io, path::PathBuf};

const KIB: u64 = 1024;

/// One reading of a process's resident memory.
#[derive(Debug, Clone)]
pub struct ProcessMemory {
    /// `VmRSS`: resident now.
    pub rss_bytes: u64,
    /// `VmHWM`: the most that was ever resident at once.
    pub peak_bytes: u64,
    /// Resident bytes by kind of mapping (see [`Region`]).
    pub regions: BTreeMap<Region, u64>,
}

/// What a mapping holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Region {
    /// The executable's own file: code, read-only data, relocated data.
    Executable,
    /// Shared libraries (glibc, libgcc) and the dynamic loader.
    Libraries,
    /// The brk heap: the main malloc arena.
    Heap,
    /// Anonymous memory: other malloc arenas, large allocations, thread
    /// stacks.
    Anonymous,
    /// The main thread's stack.
    Stack,
    /// BPF maps mapped into the process (the ring buffer).
    BpfMaps,
    /// Everything else (vdso, other files).
    Other,
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Executable => "executable",
            Self::Libraries => "shared libraries",
            Self::Heap => "heap (brk)",
            Self::Anonymous => "anonymous (arenas, large allocations, thread stacks)",
            Self::Stack => "main thread stack",
            Self::BpfMaps => "BPF maps",
            Self::Other => "other",
        })
    }
}

impl ProcessMemory {
    pub fn read(pid: u32) -> io::Result<Self> {
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> io::Result<u64> {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| {
                    value
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map(|kib| kib * KIB)
                .ok_or_else(|| io::Error::other(format!("no {name} in /proc/{pid}/status")))
        };
        let executable: PathBuf = fs::read_link(format!("/proc/{pid}/exe"))?;
        let executable = executable.display().to_string();
        let smaps = fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        let mut regions = BTreeMap::new();
        let mut region = Region::Other;
        for line in smaps.lines() {
            if let Some(kib) = line.strip_prefix("Rss:") {
                let kib: u64 = kib
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(0);
                *regions.entry(region).or_default() += kib * KIB;
            } else if is_mapping_header(line) {
                region = classify(line, &executable);
            }
        }
        Ok(Self {
            rss_bytes: field("VmRSS")?,
            peak_bytes: field("VmHWM")?,
            regions,
        })
    }

    /// Resident memory the process allocated (heap, anonymous mappings,
    /// stacks), as opposed to the pages of files it maps: what a leak or
    /// a heap that is never given back shows in, whatever the build's code
    /// size.
    pub fn allocated_bytes(&self) -> u64 {
        [Region::Heap, Region::Anonymous, Region::Stack]
            .iter()
            .filter_map(|region| self.regions.get(region))
            .sum()
    }
}

impl fmt::Display for ProcessMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "resident {:.1} MiB, peak {:.1} MiB",
            mib(self.rss_bytes),
            mib(self.peak_bytes)
        )?;
        for (region, bytes) in &self.regions {
            writeln!(f, "  {:>6.1} MiB  {region}", mib(*bytes))?;
        }
        Ok(())
    }
}

/// `start-end perms offset dev inode [path]`, as opposed to `Key: value`.
fn is_mapping_header(line: &str) -> bool {
    line.split_whitespace()
        .next()
        .is_some_and(|range| range.contains('-') && !range.ends_with(':'))
}

fn classify(header: &str, executable: &str) -> Region {
    // The path follows five fields and may itself contain spaces.
    let mut path = header;
    for _ in 0..5 {
        let field = path.trim_start();
        path = field.find(' ').map_or("", |end| &field[end..]);
    }
    let path = path.trim();
    match path {
        "" => Region::Anonymous,
        "[heap]" => Region::Heap,
        "[stack]" => Region::Stack,
        _ if path == executable => Region::Executable,
        _ if path.starts_with("anon_inode:bpf") => Region::BpfMaps,
        _ if path.contains(".so") => Region::Libraries,
        _ => Region::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_mostly_accounted_for() {
        let memory = ProcessMemory::read(std::process::id()).unwrap();
        assert!(memory.peak_bytes >= memory.rss_bytes);
        assert!(memory.regions[&Region::Executable] > 0, "{memory}");
        let summed: u64 = memory.regions.values().sum();
        // smaps and status are read a moment apart.
        assert!(
            summed.abs_diff(memory.rss_bytes) < memory.rss_bytes / 4,
            "{memory}"
        );
    }
}
