//! `evictd-seccomp PROFILE COMMAND [ARGS...]`: runs COMMAND under the
//! seccomp profile PROFILE, as a container runtime would for a pod with
//! `seccompProfile: {type: Localhost}`: no_new_privs set (the DaemonSet's
//! `allowPrivilegeEscalation: false`), then the filter, then exec.
//!
//! PROFILE is in the OCI/kubelet format (`defaultAction`, `architectures`,
//! `syscalls: [{names, action}]`); this reads the subset deploy/seccomp
//! uses, and refuses anything else rather than apply it half: a default of
//! `SCMP_ACT_ERRNO` (with `defaultErrnoRet`, EPERM if absent), x86_64, and
//! rules that allow named syscalls without argument conditions. Other
//! architectures' calls (the x86 and x32 ABIs) are refused; the filter is
//! classic BPF, checked by the kernel when it is loaded.
use std::{ffi::CString, os::unix::ffi::OsStrExt as _, str::FromStr as _};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;
use syscalls::Sysno;

/// `struct seccomp_data` offsets.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
/// AUDIT_ARCH_X86_64.
const ARCH_X86_64: u32 = 0xc000_003e;
/// x32 ABI syscalls have this bit set in their number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let profile = args
        .next()
        .context("usage: evictd-seccomp PROFILE COMMAND [ARGS...]")?;
    let command: Vec<CString> = args
        .map(|arg| CString::new(arg.as_bytes()))
        .collect::<Result<_, _>>()?;
    ensure!(!command.is_empty(), "no COMMAND to run");
    let text = std::fs::read_to_string(&profile)
        .with_context(|| format!("reading {}", profile.to_string_lossy()))?;
    let profile: Value = serde_json::from_str(&text)?;
    let (allowed, errno) = parse(&profile)?;
    let filter = filter(&allowed, errno);
    install(&filter)?;
    let error = nix::unistd::execv(&command[0], &command).unwrap_err();
    bail!("exec {:?}: {error}", command[0])
}

/// The syscall numbers the profile allows, and the errno of the rest.
fn parse(profile: &Value) -> Result<(Vec<u32>, u32)> {
    ensure!(
        profile["defaultAction"] == "SCMP_ACT_ERRNO",
        "defaultAction {}: only SCMP_ACT_ERRNO is supported",
        profile["defaultAction"]
    );
    let errno = match &profile["defaultErrnoRet"] {
        Value::Null => libc::EPERM as u32,
        value => value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .context("defaultErrnoRet")?,
    };
    ensure!(
        profile["architectures"] == serde_json::json!(["SCMP_ARCH_X86_64"]),
        "architectures {}: only [SCMP_ARCH_X86_64] is supported",
        profile["architectures"]
    );
    let mut allowed = Vec::new();
    for rule in profile["syscalls"].as_array().context("no syscalls")? {
        ensure!(
            rule["action"] == "SCMP_ACT_ALLOW",
            "action {}: only SCMP_ACT_ALLOW rules are supported",
            rule["action"]
        );
        ensure!(
            rule.get("args")
                .is_none_or(|args| args.as_array().is_some_and(Vec::is_empty)),
            "argument conditions are not supported"
        );
        for name in rule["names"].as_array().context("rule without names")? {
            let name = name.as_str().context("a syscall name is not a string")?;
            let sysno =
                Sysno::from_str(name).map_err(|_| anyhow::anyhow!("unknown syscall {name}"))?;
            allowed.push(u32::try_from(sysno.id())?);
        }
    }
    allowed.sort_unstable();
    allowed.dedup();
    Ok((allowed, errno))
}

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// arch == x86_64 or kill; nr in `allowed` (x32 numbers never are) or
/// errno.
fn filter(allowed: &[u32], errno: u32) -> Vec<libc::sock_filter> {
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let equal = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let at_least = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let deny = libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA);
    let mut program = vec![
        statement(load, ARCH_OFFSET),
        jump(equal, ARCH_X86_64, 1, 0),
        statement(ret, libc::SECCOMP_RET_KILL_PROCESS),
        statement(load, NR_OFFSET),
        jump(at_least, X32_SYSCALL_BIT, 0, 1),
        statement(ret, deny),
    ];
    for &nr in allowed {
        program.push(jump(equal, nr, 0, 1));
        program.push(statement(ret, libc::SECCOMP_RET_ALLOW));
    }
    program.push(statement(ret, deny));
    program
}

fn install(filter: &[libc::sock_filter]) -> Result<()> {
    let program = libc::sock_fprog {
        len: u16::try_from(filter.len())?,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain prctl/seccomp calls; `program` points at `filter`,
    // which outlives them, and the kernel copies it.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            bail!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error());
        }
        if libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &raw const program,
        ) != 0
        {
            bail!("seccomp: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}
