//! The `evictd` binary as a user runs it: started with JSON logs and a free
//! metrics port, its log lines awaited with a deadline, stopped by SIGTERM.
use std::{
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, ChildStdout, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{wait::scaled, wait_until};

/// How long a log line or the agent's exit may take (stretched by
/// [`scaled`](crate::scaled)).
pub const AGENT_DEADLINE: Duration = Duration::from_secs(20);

/// The agent binary: $EVICTD_BIN, or `evictd` in the target directory the
/// running test was built into (`cargo xtask test` builds it first).
pub fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("EVICTD_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.to_path_buf())
        .unwrap_or_default();
    profile_dir.join("evictd")
}

/// A running agent and its parsed log. Dropping it SIGKILLs the agent.
pub struct Agent {
    child: Child,
    pub log: AgentLog,
    reader: Option<JoinHandle<()>>,
    /// The agent's own --state-dir when the command named none (the
    /// default, /var/lib/evictd, would carry one test's eviction budget
    /// into the next), removed with the agent.
    state_dir: Option<PathBuf>,
}

impl Agent {
    /// Starts the agent with JSON logs, metrics on a free port and `args`.
    pub fn start(args: &[&str]) -> io::Result<Self> {
        let binary = agent_binary();
        if !binary.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} not built: run `cargo build -p evictd` (cargo xtask test does)",
                    binary.display()
                ),
            ));
        }
        let mut command = Command::new(binary);
        command.args(args);
        Self::spawn(command)
    }

    /// Starts `command` (the agent, maybe behind a wrapper such as setpriv),
    /// adding JSON logs, free metrics and probe ports and, unless it names
    /// one, a state directory of its own. Logs at info unless the command
    /// sets RUST_LOG; never dumps core (see [`Agent::signal`]).
    pub fn spawn(mut command: Command) -> io::Result<Self> {
        let names_state_dir = command.get_args().any(|arg| {
            arg.to_str()
                .is_some_and(|arg| arg == "--state-dir" || arg.starts_with("--state-dir="))
        });
        let state_dir = (!names_state_dir).then(private_state_dir);
        if let Some(dir) = &state_dir {
            command.arg("--state-dir").arg(dir);
        }
        if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            command.pre_exec(|| {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::setrlimit(libc::RLIMIT_CORE, &none) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .args(["--log-format", "json", "--metrics-address", "127.0.0.1:0"])
            .args(["--health-address", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("agent stdout not captured"))?;
        let (log, reader) = AgentLog::read(stdout);
        Ok(Self {
            child,
            log,
            reader: Some(reader),
            state_dir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the agent (this process's child, not yet reaped, so
    /// its pid cannot have been recycled). Its core dumps are off, so
    /// SIGABRT and SIGSEGV end it like a panic with `panic = "abort"` would,
    /// leaving no core file behind.
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> io::Result<()> {
        let pid = i32::try_from(self.child.id()).map_err(io::Error::other)?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// SIGTERM, then waits (bounded) for the exit and the end of its log,
    /// which it gives back.
    /// The --state-dir the test gave it none of, while it lives.
    pub fn own_state_dir(&self) -> Option<&std::path::Path> {
        self.state_dir.as_deref()
    }

    /// Asserts that the agent's first decision record (its own --state-dir)
    /// says `outcome` for `victim`, that `evictd simulate` replays it to
    /// `victim` alone, and that `evictd explain` tells it.
    pub fn expect_recorded_decision(&self, victim: &str, outcome: &str) {
        let Some(state_dir) = self.own_state_dir() else {
            panic!("the test named the agent's --state-dir: read its record there");
        };
        let record = state_dir.join("decision-0.json");
        if let Err(e) = wait_until(AGENT_DEADLINE, "the decision record", || record.is_file()) {
            panic!("{e}");
        }
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        let recorded: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(recorded["decision"]["outcome"], outcome, "{text}");
        let replay = run_evictd(&["simulate", "--snapshot", &record.display().to_string()]);
        let (status, replayed) = replay.unwrap_or_else(|e| panic!("simulate: {e}"));
        assert!(status.success(), "simulate: {replayed}");
        let replayed: Value = serde_json::from_str(&replayed).unwrap_or_default();
        assert_eq!(
            replayed["victims"],
            serde_json::json!([victim]),
            "{replayed}"
        );
        let dir = state_dir.display().to_string();
        let explain = run_evictd(&["explain", "--state-dir", &dir, "--last", "1"]);
        let (status, explained) = explain.unwrap_or_else(|e| panic!("explain: {e}"));
        assert!(status.success(), "explain: {explained}");
        assert!(
            explained.contains(&format!("{victim} (")) && explained.contains("<- victim"),
            "{explained}"
        );
    }

    pub fn stop(self) -> io::Result<(ExitStatus, AgentLog)> {
        self.signal(nix::sys::signal::Signal::SIGTERM)?;
        self.wait_exit()
    }

    /// Waits (bounded) for the agent to exit and for the end of its log,
    /// which it gives back.
    pub fn wait_exit(mut self) -> io::Result<(ExitStatus, AgentLog)> {
        let mut status = None;
        wait_until(AGENT_DEADLINE, "the agent to exit", || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        })
        .map_err(io::Error::other)?;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let status = status.ok_or_else(|| io::Error::other("agent exit status lost"))?;
        let (_, empty) = mpsc::channel();
        let log = std::mem::replace(
            &mut self.log,
            AgentLog {
                lines: empty,
                seen: Vec::new(),
            },
        );
        Ok((status, log))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            // The failed test's report then ends with what its agent said,
            // where an assertion's message leaves it out: in a guest in CI
            // it is the only trace.
            self.log.drain();
            let shown = self.log.seen.len().saturating_sub(LOG_LINES_ON_FAILURE);
            eprintln!("the agent's log (from line {shown}):");
            for line in &self.log.seen[shown..] {
                eprintln!("{line}");
            }
        }
        if let Some(dir) = &self.state_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The most of an agent's log a failed test prints.
const LOG_LINES_ON_FAILURE: usize = 400;

/// A state directory for one agent, not made yet (the agent makes it when
/// it first writes).
fn private_state_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("evictd-agent-state-{}-{n}", std::process::id()))
}

/// Log lines of the agent, parsed from its JSON output.
pub struct AgentLog {
    lines: mpsc::Receiver<Value>,
    pub seen: Vec<Value>,
}

impl AgentLog {
    /// Parses JSON log lines from `stdout` on a thread.
    pub fn read(stdout: ChildStdout) -> (Self, JoinHandle<()>) {
        let (sender, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    let _ = sender.send(value);
                }
            }
        });
        let log = Self {
            lines,
            seen: Vec::new(),
        };
        (log, reader)
    }

    /// The first line with `message` whose string `fields` match, waiting
    /// up to [`AGENT_DEADLINE`] (stretched by [`scaled`](crate::scaled));
    /// panics with everything seen otherwise.
    pub fn expect(&mut self, message: &str, fields: &[(&str, &str)]) -> Value {
        let matches = |line: &Value| {
            line["message"] == message && fields.iter().all(|(k, v)| line[*k].as_str() == Some(*v))
        };
        let started = Instant::now();
        loop {
            if let Some(line) = self.seen.iter().find(|l| matches(l)) {
                return line.clone();
            }
            let left = scaled(AGENT_DEADLINE).saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no log line {message:?} {fields:?}; saw {:#?}", self.seen),
            }
        }
    }

    /// The decision to evict `victim` for `resource`, then its kill, in
    /// that order; returns the decision line.
    pub fn expect_eviction(&mut self, victim: &str, resource: &str) -> Value {
        let decided = self.expect("eviction decided", &[("victim", victim)]);
        assert_eq!(decided["resource"], resource, "{decided}");
        let killed = self.expect("pod killed", &[("victim", victim)]);
        let position = |line: &Value| self.seen.iter().position(|l| l == line);
        assert!(position(&decided) < position(&killed));
        assert!(killed["trigger_to_kill_us"].as_u64().is_some(), "{killed}");
        decided
    }

    /// Where `line` came among the lines seen so far, to assert order.
    pub fn position(&self, line: &Value) -> Option<usize> {
        self.seen.iter().position(|l| l == line)
    }

    /// Every WARN or ERROR line seen so far.
    pub fn problems(&mut self) -> Vec<Value> {
        self.drain();
        self.seen
            .iter()
            .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
            .cloned()
            .collect()
    }

    /// The address of the metrics endpoint, from its log line.
    pub fn metrics_address(&mut self) -> String {
        let line = self.expect("serving /metrics and /healthz", &[]);
        match line["address"].as_str() {
            Some(address) => address.to_owned(),
            None => panic!("no address in {line}"),
        }
    }

    /// The address of the probe endpoint, from its log line.
    pub fn health_address(&mut self) -> String {
        let line = self.expect("serving /healthz and /readyz for probes", &[]);
        match line["address"].as_str() {
            Some(address) => address.to_owned(),
            None => panic!("no address in {line}"),
        }
    }

    /// Lines seen so far with `message` and `field` == `value`.
    pub fn count(&mut self, message: &str, field: &str, value: &str) -> usize {
        self.drain();
        self.seen
            .iter()
            .filter(|l| l["message"] == message && l[field] == value)
            .count()
    }

    /// Every line with `message` seen so far.
    pub fn all(&mut self, message: &str) -> Vec<Value> {
        self.drain();
        self.seen
            .iter()
            .filter(|l| l["message"] == message)
            .cloned()
            .collect()
    }

    /// Takes every line printed so far into [`AgentLog::seen`].
    pub fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }
}

/// Runs `evictd ARGS` (a subcommand that ends by itself) to completion
/// within [`AGENT_DEADLINE`]: its exit status and stdout. Killed and
/// reported as `TimedOut` if it does not finish.
pub fn run_evictd(args: &[&str]) -> io::Result<(ExitStatus, String)> {
    let mut child = Command::new(agent_binary())
        .args(args)
        .stdout(Stdio::piped())
        // Its errors in the test's output: a failed simulate or explain
        // says why, not only its exit status.
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("evictd stdout not captured"))?;
    // Read while it runs: a full pipe would stall it.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let mut status = None;
    let finished = wait_until(AGENT_DEADLINE, "evictd to finish", || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if let Err(timeout) = finished {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("evictd {args:?}: {timeout}"),
        ));
    }
    let text = reader
        .join()
        .map_err(|_| io::Error::other("reading evictd's output"))??;
    let status = status.ok_or_else(|| io::Error::other("evictd exit status lost"))?;
    Ok((status, text))
}

/// A plain HTTP/1.1 GET, for the metrics endpoint.
pub fn http_get(address: &str, path: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect(address)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: evictd\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// The value of one series (`name{label="value",...}` exactly as the
/// endpoint prints it, labels sorted) in a Prometheus text exposition.
pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// `(program, runs, nanoseconds)` from the agent's per-program gauges.
pub fn program_stats(metrics: &str) -> Vec<(String, u64, u64)> {
    let label = |line: &str| -> Option<(String, u64)> {
        let rest = line.split_once("{program=\"")?.1;
        let (program, value) = rest.split_once("\"} ")?;
        Some((program.to_owned(), value.trim().parse().ok()?))
    };
    let runs: Vec<(String, u64)> = metrics
        .lines()
        .filter(|l| l.starts_with("evictd_bpf_program_runs{"))
        .filter_map(label)
        .collect();
    runs.into_iter()
        .map(|(program, count)| {
            let nanos = metrics
                .lines()
                .filter(|l| l.starts_with("evictd_bpf_program_run_time_nanoseconds{"))
                .filter_map(label)
                .find(|(p, _)| *p == program)
                .map_or(0, |(_, n)| n);
            (program, count, nanos)
        })
        .collect()
}
