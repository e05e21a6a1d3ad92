//! A process the integration tests steer through stdin, one command per line,
//! answering one line each once the effect is complete:
//! `alloc BYTES` (allocated and touched), `free BYTES`, `fork N` (N sleeping
//! children), `reap N`, `exit`.
use std::{
    io::{self, BufRead as _, Write as _},
    process::{Child, Command, Stdio},
};

const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("child") {
        // Die with the parent, so no child outlives a killed workload.
        // SAFETY: prctl with PR_SET_PDEATHSIG has no memory effects.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        loop {
            std::thread::park();
        }
    }
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut children: Vec<Child> = Vec::new();
    let stdin = io::stdin();
    let mut stdout = io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or_default();
        let amount: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let reply = match command {
            "alloc" => {
                for _ in 0..amount.div_ceil(CHUNK) {
                    let mut chunk = vec![0u8; CHUNK];
                    // Touch every page so it is resident and charged.
                    for page in chunk.iter_mut().step_by(PAGE) {
                        *page = 1;
                    }
                    chunks.push(chunk);
                }
                format!("ok {}", chunks.len() * CHUNK)
            }
            "free" => {
                // 1 MiB chunks are mmapped by glibc, so dropping one returns
                // its pages to the kernel at once.
                let count = amount.div_ceil(CHUNK).min(chunks.len());
                chunks.truncate(chunks.len() - count);
                format!("ok {}", chunks.len() * CHUNK)
            }
            "fork" => match spawn_children(amount, &mut children) {
                Ok(()) => format!("ok {}", children.len()),
                Err(e) => format!("err {e}"),
            },
            "reap" => {
                for mut child in children.drain(children.len().saturating_sub(amount)..) {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                format!("ok {}", children.len())
            }
            "exit" => break,
            other => format!("err unknown command {other:?}"),
        };
        if writeln!(stdout, "{reply}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
}

fn spawn_children(count: usize, children: &mut Vec<Child>) -> io::Result<()> {
    let me = std::env::current_exe()?;
    for _ in 0..count {
        children.push(
            Command::new(&me)
                .arg("child")
                .stdin(Stdio::null())
                .spawn()?,
        );
    }
    Ok(())
}
