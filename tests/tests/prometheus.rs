//! A real Prometheus scrapes the agent through the PodMonitor's relabelling
//! while it evicts a memory hog: every query of the Grafana dashboard runs
//! against it (those an eviction must fill have data), and every alert rule
//! is loaded, evaluated and quiet on a node evictd protected.
use std::{collections::BTreeSet, time::Duration};

use evictd_integration::{
    MEMORY_PODS_HELD, PROMETHEUS_JOB, Prometheus, SandboxNode, memory_pods, wait_until,
};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
const NODE: &str = "evictd-test-node";
/// Scrapes every second: a minute holds the whole scenario.
const RATE_INTERVAL: &str = "1m";
const SCRAPE_DEADLINE: Duration = Duration::from_secs(60);

/// Panels (title, query refId) that must have data once a pod was evicted
/// for memory; the others must only run.
const FILLED_BY_AN_EVICTION: [(&str, &str); 22] = [
    ("Evictions by signal, QoS and kill reason", "A"),
    ("Decision latency (trigger to decision)", "A"),
    ("Decision latency (trigger to decision)", "B"),
    ("Trigger to first signal to the victim", "A"),
    ("Trigger to first signal to the victim", "B"),
    ("Memory available", "A"),
    ("Kernel OOM kills (evictd came too late)", "A"),
    ("Engine runs by trigger", "A"),
    ("Threshold crossings", "A"),
    ("Ring-buffer drops and decode errors", "A"),
    ("Ring-buffer drops and decode errors", "B"),
    ("Ring-buffer drops and decode errors", "C"),
    ("Kernel records by kind", "A"),
    ("Memory checks in the kernel", "A"),
    ("Trigger per resource", "A"),
    ("Trigger per resource", "B"),
    ("Startup to protection, and readiness", "A"),
    ("Startup to protection, and readiness", "B"),
    ("Watched scopes", "A"),
    ("Watched scopes", "B"),
    ("Watched scopes", "C"),
    ("Metrics endpoint connections", "A"),
];

/// Every query of `dashboard`: its panel's title, its refId, and the
/// PromQL with Grafana's variables filled in as the dashboard would.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String, String)> {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let panels = dashboard["panels"].as_array().into_iter().flatten();
    panels
        .flat_map(|panel| {
            let targets = panel["targets"].as_array().into_iter().flatten();
            targets.map(|target| {
                (
                    text(&panel["title"]),
                    text(&target["refId"]),
                    text(&target["expr"])
                        .replace("$node", NODE)
                        .replace("$__rate_interval", RATE_INTERVAL),
                )
            })
        })
        .collect()
}

/// The value of the one sample in `series`, as Prometheus prints it.
fn values(series: &[Value]) -> Vec<f64> {
    series
        .iter()
        .filter_map(|sample| sample["value"][1].as_str()?.parse().ok())
        .collect()
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_real_prometheus_runs_every_dashboard_query_and_alert_rule_through_an_eviction() {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.alloc(&MEMORY_PODS_HELD).unwrap();
    let mut agent = node
        .start_agent(&[
            "--eviction-hard",
            "memory.available<96Mi",
            // This test is about what Prometheus sees, not the zone's race
            // (precise_hooks.rs).
            "--precise-hooks",
            "always",
        ])
        .unwrap();
    let address = agent.log.metrics_address();
    let Some(prometheus) = Prometheus::start(&address, NODE).unwrap() else {
        return;
    };
    // Two scrapes before the eviction, so that rates span it.
    let scraped = format!(r#"count_over_time(up{{job="{PROMETHEUS_JOB}",node="{NODE}"}}[1m])"#);
    wait_until(SCRAPE_DEADLINE, "two scrapes of the agent", || {
        prometheus
            .query(&scraped)
            .is_ok_and(|series| values(&series).first().is_some_and(|&count| count >= 2.0))
    })
    .unwrap();

    node.grow_until_stopped("hog", 16 * MIB, NODE_MEMORY)
        .unwrap();
    agent.log.expect_eviction("default/hog", "memory");
    assert_eq!(node.oom_kills().unwrap(), 0, "the kernel OOM killer fired");
    // The eviction, scraped and labelled with the node's name by the
    // PodMonitor's relabelling.
    let evicted = format!(
        r#"evictd_evictions_total{{job="{PROMETHEUS_JOB}",node="{NODE}",signal="memory.available"}}"#
    );
    let mut series = Vec::new();
    wait_until(SCRAPE_DEADLINE, "the eviction in Prometheus", || {
        series = prometheus.query(&evicted).unwrap_or_default();
        values(&series) == [1.0]
    })
    .unwrap_or_else(|e| panic!("{e}: {series:?}"));
    // Two samples of it, for the rates over the eviction (`increase` of a
    // series that appeared with it needs two).
    let samples = format!("count_over_time({evicted}[{RATE_INTERVAL}])");
    wait_until(SCRAPE_DEADLINE, "two scrapes after the eviction", || {
        prometheus
            .query(&samples)
            .is_ok_and(|series| values(&series).first().is_some_and(|&count| count >= 2.0))
    })
    .unwrap();

    let dashboard: Value = serde_json::from_str(include_str!(
        "../../deploy/monitoring/grafana-dashboard.json"
    ))
    .unwrap();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= FILLED_BY_AN_EVICTION.len());
    let must_fill: BTreeSet<(&str, &str)> = FILLED_BY_AN_EVICTION.into_iter().collect();
    let mut filled = BTreeSet::new();
    for (title, ref_id, query) in queries {
        let series = prometheus
            .query(&query)
            .unwrap_or_else(|e| panic!("panel {title:?} ({ref_id}): {e}"));
        if !must_fill.contains(&(title.as_str(), ref_id.as_str())) {
            continue;
        }
        let found = values(&series);
        assert!(
            !found.is_empty() && found.iter().all(|value| !value.is_nan()),
            "panel {title:?} ({ref_id}) has no data after an eviction: {query} gave {series:?}"
        );
        filled.insert((title, ref_id));
    }
    let missing: Vec<_> = must_fill
        .iter()
        .filter(|(title, ref_id)| !filled.contains(&((*title).to_owned(), (*ref_id).to_owned())))
        .collect();
    assert!(missing.is_empty(), "no such panel queries: {missing:?}");
    // No OOM kill: the panel's figure is 0, as the kernel's count is.
    let oom_kills = format!(
        r#"sum(increase(evictd_kernel_oom_kills_total{{node="{NODE}"}}[{RATE_INTERVAL}]))"#
    );
    assert_eq!(values(&prometheus.query(&oom_kills).unwrap()), [0.0]);

    // Every alert rule loaded and evaluated without error.
    let alerts: Value =
        serde_yaml_ng::from_str(include_str!("../../deploy/monitoring/alerts.yaml")).unwrap();
    let declared: BTreeSet<&str> = alerts["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["alert"].as_str().unwrap())
        .collect();
    let mut rules = Vec::new();
    wait_until(SCRAPE_DEADLINE, "every rule evaluated", || {
        rules = prometheus
            .rule_groups()
            .unwrap_or_default()
            .iter()
            .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        rules.len() == declared.len()
            && rules
                .iter()
                .all(|rule| rule["health"] == "ok" && rule["evaluationTime"].as_f64() > Some(0.0))
    })
    .unwrap_or_else(|e| panic!("{e}: {rules:#?}"));
    let loaded: BTreeSet<&str> = rules
        .iter()
        .map(|rule| rule["name"].as_str().unwrap())
        .collect();
    assert_eq!(loaded, declared);
    // Quiet: an eviction evictd won is no alert. The decision-time alert
    // is left out: these tests run a debug build, whose decisions are not
    // the release build's that the goal is about.
    for rule in &rules {
        if rule["name"] != "EvictdDecisionsSlow" {
            assert_eq!(rule["state"], "inactive", "{rule:#}");
        }
    }
    drop(prometheus);
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}
