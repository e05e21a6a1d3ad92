//! The hook's bounds on real processes and sockets: no root, real time
//! (each wait is for a condition, with a deadline).
use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    net::TcpListener,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    thread,
};

use super::*;
use crate::decide::{reason::PodLimit, thresholds::Signal};

/// How long a test waits for what must happen at once (a killed process
/// gone): a bound on a wait, never a pause.
const SETTLE: Duration = Duration::from_secs(10);

fn script(dir: &Path, body: &str) -> HookTarget {
    let path = dir.join("hook");
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    HookTarget::Command(path)
}

fn hook(target: HookTarget) -> PreKillHook {
    PreKillHook {
        target,
        timeout: Duration::from_secs(2),
    }
}

fn call(bound: Duration) -> PreKillCall {
    PreKillCall::new(
        ("team-a", "web-7f9c", "0a1b2c"),
        KillReason::Threshold(Signal::MemoryAvailable),
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        bound,
    )
}

fn gone(pid: u32) -> bool {
    // A zombie is gone too: it runs nothing and holds no memory.
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + SETTLE;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_hook_is_an_absolute_path_or_an_http_url_and_nothing_else() {
    assert_eq!(
        "/usr/local/bin/dump".parse::<HookTarget>().unwrap(),
        HookTarget::Command("/usr/local/bin/dump".into())
    );
    let http: HookTarget = "http://127.0.0.1:9099/evicting".parse().unwrap();
    assert_eq!(http.to_string(), "http://127.0.0.1:9099/evicting");
    let bare: HookTarget = "http://drain.local".parse().unwrap();
    assert_eq!(bare.to_string(), "http://drain.local/");
    for refused in [
        "dump.sh",
        "https://drain.local/",
        "unix:///run/hook.sock",
        "http://:80/",
        "http://host:99999/",
        "http://host/a\r\nX-Injected: 1",
        "http://user:secret@host/",
    ] {
        assert!(refused.parse::<HookTarget>().is_err(), "{refused:?}");
    }
}

#[test]
fn the_hook_takes_at_most_half_the_grace_period() {
    let hook = hook(HookTarget::Command("/bin/true".into()));
    assert_eq!(hook.bound(Duration::from_secs(30)), Duration::from_secs(2));
    assert_eq!(
        hook.bound(Duration::from_secs(1)),
        Duration::from_millis(500)
    );
    assert_eq!(hook.bound(Duration::ZERO), Duration::ZERO);
}

#[tokio::test]
async fn an_executable_is_told_the_pod_the_reason_and_its_deadline_in_its_environment_only() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let target = script(dir.path(), &format!("env > {}", seen.display()));
    let outcome = hook(target)
        .run(&call(Duration::from_secs(2)), SETTLE)
        .await;
    assert!(matches!(outcome, HookOutcome::Done), "{outcome:?}");
    let env: BTreeMap<String, String> = fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .filter(|(key, _)| key != "PWD" && key != "SHLVL" && key != "_")
        .collect();
    let expected = BTreeMap::from(
        [
            ("PATH", HOOK_PATH),
            ("EVICTD_POD_NAMESPACE", "team-a"),
            ("EVICTD_POD_NAME", "web-7f9c"),
            ("EVICTD_POD_UID", "0a1b2c"),
            ("EVICTD_REASON", "threshold"),
            ("EVICTD_SIGNAL", "memory.available"),
            ("EVICTD_DEADLINE_UNIX_MS", "1700000002000"),
            ("EVICTD_DEADLINE_REMAINING_MS", "2000"),
        ]
        .map(|(key, value)| (key.to_owned(), value.to_owned())),
    );
    assert_eq!(env, expected);
}

#[tokio::test]
async fn a_hook_still_running_at_its_deadline_is_killed_with_everything_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let target = script(
        dir.path(),
        &format!(
            "sleep 100000 &\necho $$ $! > {0}.tmp && mv {0}.tmp {0}\nwait",
            pids.display()
        ),
    );
    let outcome = hook(target)
        .run(
            &call(Duration::from_millis(300)),
            Duration::from_millis(300),
        )
        .await;
    assert!(matches!(outcome, HookOutcome::TimedOut), "{outcome:?}");
    let pids: Vec<u32> = fs::read_to_string(&pids)
        .expect("the hook ran before its deadline")
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    // Killed with everything it started, at the deadline.
    wait_for("the hook outlived its deadline", || gone(pids[0]));
    wait_for("the hook's child outlived its deadline", || gone(pids[1]));
}

#[tokio::test]
async fn a_failing_hook_says_how_and_what_it_printed_up_to_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    // A megabyte on stderr: the agent keeps a kilobyte of it.
    let target = script(
        dir.path(),
        "head -c 1048576 /dev/zero | tr '\\0' x >&2\nexit 3",
    );
    let outcome = hook(target).run(&call(SETTLE), SETTLE).await;
    match outcome {
        HookOutcome::Failed(PreKillError::Exit { status, output, .. }) => {
            assert_eq!(status.code(), Some(3));
            assert_eq!(output.len(), OUTPUT_KEPT);
        }
        other => panic!("{other:?}"),
    }
    let missing = hook(HookTarget::Command(dir.path().join("missing")));
    let outcome = missing.run(&call(SETTLE), SETTLE).await;
    assert!(
        matches!(outcome, HookOutcome::Failed(PreKillError::Spawn { .. })),
        "{outcome:?}"
    );
}

/// A one-connection HTTP endpoint that reads the request and answers
/// `answer` (none: it holds the connection open, answering nothing);
/// returns its URL and, once it has read it, the request.
fn endpoint(answer: Option<&'static [u8]>) -> (HookTarget, thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/evicting", listener.local_addr().unwrap());
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        // The body ends the request: it is one JSON object.
        while !request.ends_with(b"}") {
            let read = stream.read(&mut buffer).unwrap();
            assert_ne!(read, 0, "the request ended early");
            request.extend_from_slice(&buffer[..read]);
        }
        match answer {
            // The agent may hang up before it has read it all.
            Some(answer) => {
                let _ = stream.write_all(answer);
            }
            // Until the agent hangs up.
            None => while stream.read(&mut buffer).is_ok_and(|read| read > 0) {},
        }
        String::from_utf8(request).unwrap()
    });
    (url.parse().unwrap(), server)
}

#[tokio::test]
async fn an_endpoint_gets_the_call_as_json_and_a_2xx_is_done() {
    let (target, server) = endpoint(Some(b"HTTP/1.1 204 No Content\r\n\r\n"));
    let call = PreKillCall::new(
        ("team-a", "web-7f9c", "0a1b2c"),
        KillReason::PodLimit(PodLimit::EmptyDir),
        UNIX_EPOCH,
        Duration::from_millis(500),
    );
    let outcome = hook(target).run(&call, SETTLE).await;
    assert!(matches!(outcome, HookOutcome::Done), "{outcome:?}");
    let request = server.join().unwrap();
    assert!(
        request.starts_with("POST /evicting HTTP/1.1\r\n"),
        "{request}"
    );
    let (_, body) = request.split_once("\r\n\r\n").unwrap();
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "namespace": "team-a", "name": "web-7f9c", "uid": "0a1b2c",
            "reason": "pod-limit", "signal": "emptydirfs.limit",
            "deadline_unix_ms": 500, "remaining_ms": 500,
        })
    );
}

#[tokio::test]
async fn an_endpoint_that_refuses_floods_or_never_answers_is_bounded() {
    let (target, server) = endpoint(Some(b"HTTP/1.1 503 Service Unavailable\r\n\r\n"));
    let outcome = hook(target).run(&call(SETTLE), SETTLE).await;
    assert!(
        matches!(
            outcome,
            HookOutcome::Failed(PreKillError::HttpStatus { .. })
        ),
        "{outcome:?}"
    );
    server.join().unwrap();

    // A head that never ends: read up to the bound, then refused.
    static FLOOD: [u8; 64 * 1024] = [b'x'; 64 * 1024];
    let (target, server) = endpoint(Some(&FLOOD));
    let outcome = hook(target).run(&call(SETTLE), SETTLE).await;
    assert!(
        matches!(outcome, HookOutcome::Failed(PreKillError::Http { .. })),
        "{outcome:?}"
    );
    server.join().unwrap();

    let (target, server) = endpoint(None);
    let bound = Duration::from_millis(300);
    let outcome = hook(target).run(&call(bound), bound).await;
    assert!(matches!(outcome, HookOutcome::TimedOut), "{outcome:?}");
    // Hung up on: the endpoint's read ends.
    server.join().unwrap();
}
