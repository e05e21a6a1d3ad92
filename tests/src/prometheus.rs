//! A real Prometheus scraping a running agent: Debian's 2.42 server, which
//! `cargo xtask deploy-check` unpacks and `cargo xtask test` names in
//! [`PROMETHEUS_ENV`]. It scrapes every second as the PodMonitor's job,
//! through the relabelling deploy/monitoring/podmonitor.yaml declares, with
//! deploy/monitoring/alerts.yaml loaded, and answers through its HTTP API.
//! Its data lives in a directory of its own, removed with it.
use std::{
    fs,
    io::{self, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use serde_json::{Value, json};

use crate::wait::{stop_child, wait_until};

/// The Prometheus server's path, set by `cargo xtask test`.
pub const PROMETHEUS_ENV: &str = "EVICTD_PROMETHEUS";
/// The job the Prometheus Operator's scrape of the PodMonitor labels its
/// series with: `<namespace>/<name>`.
pub const PROMETHEUS_JOB: &str = "evictd-system/evictd";
const START_DEADLINE: Duration = Duration::from_secs(60);
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// A bound on each API request: Prometheus answers these in milliseconds.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/monitoring")
        .join(name)
}

pub struct Prometheus {
    dir: PathBuf,
    process: Option<Child>,
    address: String,
}

impl Prometheus {
    /// Starts Prometheus scraping the agent at `target` (`host:port`) as if
    /// the PodMonitor had found it on node `node`. `Ok(None)`: skipped, with
    /// a message, where no server was named; under `CI=true` that is an
    /// error instead, since a skip would hide the tier.
    pub fn start(target: &str, node: &str) -> io::Result<Option<Self>> {
        let Some(server) = std::env::var_os(PROMETHEUS_ENV) else {
            let reason =
                format!("{PROMETHEUS_ENV} names no Prometheus server (cargo xtask test sets it)");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{reason}; CI must not skip the Prometheus tier"),
                ));
            }
            eprintln!("evictd-integration: SKIPPING the Prometheus test: {reason}");
            return Ok(None);
        };
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "evictd-prometheus-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let address = free_local_address()?;
        // From here on, drop cleans up whatever was started.
        let mut prometheus = Self {
            dir,
            process: None,
            address,
        };
        let config = prometheus.dir.join("prometheus.yml");
        fs::write(&config, scrape_config(target, node)?)?;
        let log = fs::File::create(prometheus.dir.join("prometheus.log"))?;
        prometheus.process = Some(
            Command::new(server)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    prometheus.dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={}", prometheus.address))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        );
        let mut ready = false;
        let mut exited = false;
        let _ = wait_until(START_DEADLINE, "Prometheus to be ready", || {
            exited = prometheus
                .process
                .as_mut()
                .is_some_and(|process| !matches!(process.try_wait(), Ok(None)));
            ready = !exited
                && request(&prometheus.address, "GET", "/-/ready", "")
                    .is_ok_and(|(status, _)| status == 200);
            ready || exited
        });
        if !ready {
            let log = fs::read_to_string(prometheus.dir.join("prometheus.log")).unwrap_or_default();
            return Err(io::Error::other(format!(
                "Prometheus {}: {log}",
                if exited { "exited" } else { "not ready" }
            )));
        }
        Ok(Some(prometheus))
    }

    /// The series of an instant query now: `data.result`.
    pub fn query(&self, promql: &str) -> io::Result<Vec<Value>> {
        let body = format!("query={}", percent_encoded(promql));
        let data = self.api("POST", "/api/v1/query", &body)?;
        match data["result"].as_array() {
            Some(result) => Ok(result.clone()),
            None => Err(io::Error::other(format!("{promql}: no result in {data}"))),
        }
    }

    /// The rule groups loaded, with each rule's health and state:
    /// `data.groups` of `/api/v1/rules`.
    pub fn rule_groups(&self) -> io::Result<Vec<Value>> {
        let data = self.api("GET", "/api/v1/rules", "")?;
        match data["groups"].as_array() {
            Some(groups) => Ok(groups.clone()),
            None => Err(io::Error::other(format!("no groups in {data}"))),
        }
    }

    /// `data` of a successful API answer; the error Prometheus gave
    /// otherwise.
    fn api(&self, method: &str, path: &str, body: &str) -> io::Result<Value> {
        let (status, text) = request(&self.address, method, path, body)?;
        let answer: Value = serde_json::from_str(&text)
            .map_err(|e| io::Error::other(format!("{path}: {e}: {text}")))?;
        if status != 200 || answer["status"] != "success" {
            return Err(io::Error::other(format!(
                "{path} ({body}): {status} {answer}"
            )));
        }
        Ok(answer["data"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take()
            && let Err(e) = stop_child(&mut process, "Prometheus", STOP_DEADLINE)
        {
            eprintln!("evictd-integration: stopping Prometheus: {e}");
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("evictd-integration: removing {}: {e}", self.dir.display());
        }
    }
}

/// The configuration: one job scraping `target` every second, its series
/// relabelled by the PodMonitor's own relabelings from the pod's node name,
/// and the alert rules.
fn scrape_config(target: &str, node: &str) -> io::Result<String> {
    let text = fs::read_to_string(deploy_file("podmonitor.yaml"))?;
    let monitor: Value = serde_yaml_ng::from_str(&text).map_err(io::Error::other)?;
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    let relabelings: Vec<Value> = endpoint["relabelings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(prometheus_relabel_config)
        .collect();
    let config = json!({
        "global": { "scrape_interval": "1s", "evaluation_interval": "1s" },
        "rule_files": [deploy_file("alerts.yaml")],
        "scrape_configs": [{
            "job_name": PROMETHEUS_JOB,
            "metrics_path": endpoint["path"],
            // What Kubernetes service discovery would have found for the
            // agent's pod.
            "static_configs": [{
                "targets": [target],
                "labels": { "__meta_kubernetes_pod_node_name": node },
            }],
            "relabel_configs": relabelings,
        }],
    });
    serde_yaml_ng::to_string(&config).map_err(io::Error::other)
}

/// A Prometheus Operator relabeling (`sourceLabels`, `targetLabel`, ...) as
/// Prometheus' own `relabel_configs` entry (`source_labels`,
/// `target_label`, ...).
fn prometheus_relabel_config(relabeling: &Value) -> Value {
    let Some(fields) = relabeling.as_object() else {
        return relabeling.clone();
    };
    fields
        .iter()
        .map(|(key, value)| {
            let snake: String = key
                .chars()
                .flat_map(|c| {
                    let lower = c.to_ascii_lowercase();
                    (c.is_ascii_uppercase().then_some('_').into_iter()).chain([lower])
                })
                .collect();
            (snake, value.clone())
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A loopback address no one listens on now.
fn free_local_address() -> io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// Every byte but the unreserved ones as `%XX`, for a form body.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// One HTTP/1.0 exchange (the server closes the connection after the
/// whole body, no chunking): status and body.
fn request(address: &str, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: prometheus\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("no HTTP head in {response:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_relabelings_become_prometheus_ones() {
        let relabeling = json!({
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
            "action": "replace",
        });
        assert_eq!(
            prometheus_relabel_config(&relabeling),
            json!({
                "source_labels": ["__meta_kubernetes_pod_node_name"],
                "target_label": "node",
                "action": "replace",
            })
        );
    }

    #[test]
    fn form_bodies_escape_everything_promql_uses() {
        assert_eq!(
            percent_encoded(r#"rate(x{node=~"a b"}[1m]) > 0"#),
            "rate%28x%7Bnode%3D~%22a%20b%22%7D%5B1m%5D%29%20%3E%200"
        );
    }
}
