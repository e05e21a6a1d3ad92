//! The goals of issue 13, each against what the run measured.
use serde_json::Value;

use super::{
    NO_AGENT, OPERATIONS, ORACLE, Runs, field, kernel_won, modes, runs, scenarios, slowdown,
    wrong_victim,
};
use crate::stats::{format_ms, percentile};

/// The mode with the lowest `q` quantile among `modes` (name, values), and
/// that quantile; `None` if every one is `never`.
fn fastest<'a>(modes: &[(&'a str, Vec<Option<f64>>)], q: f64) -> Option<(&'a str, f64)> {
    modes
        .iter()
        .filter_map(|(mode, values)| Some((*mode, percentile(values, q)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// One goal: what it asks, what was measured, whether it holds.
struct Goal {
    goal: String,
    measured: String,
    met: Option<bool>,
}

/// The goals as a Markdown table: goal, measured, met.
pub fn table(results: &Value) -> String {
    let mut goals = Vec::new();
    let p = |values: &[Option<f64>], q| percentile(values, q);
    for scenario in scenarios(results, "memory") {
        let name = scenario["name"].as_str().unwrap_or_default();
        let event = runs(results, scenario, "event");
        if event.is_empty() {
            continue;
        }
        let back = field(&event, "back_us");
        let (event_p50, event_p99) = (p(&back, 0.5), p(&back, 0.99));
        let others: Vec<(&str, Vec<Option<f64>>)> = modes(scenario)
            .into_iter()
            .filter(|m| *m != "event" && *m != ORACLE)
            .map(|m| (m, field(&runs(results, scenario, m), "back_us")))
            .collect();
        let (best50, best99) = (fastest(&others, 0.5), fastest(&others, 0.99));
        // First: event got its memory back, and sooner than any other mode.
        let first = |event: Option<f64>, best: Option<(&str, f64)>| {
            event.is_some_and(|e| best.is_none_or(|(_, b)| e < b))
        };
        let describe = |best: Option<(&str, f64)>| {
            best.map_or("every other mode: never".to_owned(), |(m, v)| {
                format!("best other {m} {}", format_ms(Some(v)))
            })
        };
        goals.push(Goal {
            goal: format!("{name}: event first on crossing → memory back, p50 and p99"),
            measured: format!(
                "p50 event {} ({}); p99 event {} ({})",
                format_ms(event_p50),
                describe(best50),
                format_ms(event_p99),
                describe(best99)
            ),
            met: Some(first(event_p50, best50) && first(event_p99, best99)),
        });
        let oracle = p(&field(&runs(results, scenario, ORACLE), "back_us"), 0.5);
        goals.push(Goal {
            goal: format!("{name}: event within 10 ms of the oracle (p50)"),
            measured: match (event_p50, oracle) {
                (Some(e), Some(o)) => format!(
                    "event {} ms, oracle {} ms ({:+.1} ms)",
                    format_ms(Some(e)),
                    format_ms(Some(o)),
                    (e - o) / 1e3
                ),
                _ => format!(
                    "event {} ms, oracle {} ms",
                    format_ms(event_p50),
                    format_ms(oracle)
                ),
            },
            met: match (event_p50, oracle) {
                (Some(e), Some(o)) => Some(e - o <= 10_000.0),
                (None, _) => Some(false),
                _ => None,
            },
        });
        let noticed = p(&field(&event, "noticed_us"), 0.99);
        goals.push(Goal {
            goal: format!("{name}: event noticed p99 ≤ 1 ms"),
            measured: format!("{} ms", format_ms(noticed)),
            met: Some(noticed.is_some_and(|us| us <= 1_000.0)),
        });
    }
    for scenario in scenarios(results, "pods") {
        let limit_ms = match scenario["pods"].as_u64() {
            Some(100) => 2.0,
            Some(250) => 5.0,
            _ => continue,
        };
        let decided = p(
            &field(&runs(results, scenario, "event"), "decision_us"),
            0.99,
        );
        goals.push(Goal {
            goal: format!(
                "{} pods: event woken → decided p99 ≤ {limit_ms} ms",
                scenario["pods"]
            ),
            measured: format!("{} ms", format_ms(decided)),
            met: Some(decided.is_some_and(|us| us <= limit_ms * 1e3)),
        });
    }
    for scenario in scenarios(results, "overhead") {
        let near = scenario["near"] == true;
        let limit = if near { 10.0 } else { 2.0 };
        let event = runs(results, scenario, "event");
        let floor = runs(results, scenario, NO_AGENT);
        if event.is_empty() {
            continue;
        }
        let slowdowns: Vec<(&str, Option<f64>)> = OPERATIONS
            .iter()
            .map(|(operation, label)| (*label, slowdown(&event, &floor, operation)))
            .collect();
        goals.push(Goal {
            goal: format!(
                "event overhead ≤ {limit} % {}",
                if near {
                    "close to the threshold"
                } else {
                    "far from thresholds"
                }
            ),
            measured: slowdowns
                .iter()
                .map(|(label, s)| {
                    format!(
                        "{label} {}",
                        s.map_or("–".to_owned(), |s| format!("{s:+.1} %"))
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
            met: slowdowns
                .iter()
                .map(|(_, s)| s.map(|s| s <= limit))
                .collect::<Option<Vec<bool>>>()
                .map(|all| all.iter().all(|ok| *ok)),
        });
    }
    let event_runs: Runs = results["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["mode"] == "event" && r["run"]["kernel_kills"].is_u64())
        .map(|r| &r["run"])
        .collect();
    if !event_runs.is_empty() {
        let (won, wrong) = (kernel_won(&event_runs), wrong_victim(&event_runs));
        goals.push(Goal {
            goal: "event: no kernel OOM kill or refused fork, no wrong victim, in any run"
                .to_owned(),
            measured: format!(
                "kernel won {won}, wrong victim {wrong}, of {} runs",
                event_runs.len()
            ),
            met: Some(won == 0 && wrong == 0),
        });
    }
    let mut text = "| goal | measured | met |\n|---|---|---|\n".to_owned();
    for goal in goals {
        let met = match goal.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        text += &format!("| {} | {} | {met} |\n", goal.goal, goal.measured);
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::runs::EXPECTED_VICTIM;

    fn memory_run(mode: &str, back_ms: Option<f64>, decided_ms: f64) -> Value {
        json!({"scenario": "memory, max rate", "mode": mode, "run": {
            "back_us": back_ms.map(|ms| ms * 1e3), "decided_us": decided_ms * 1e3,
            "noticed_us": 100.0, "kernel_kills": if back_ms.is_some() { 0 } else { 1 },
            "victims": [EXPECTED_VICTIM], "lost_pods": [],
        }})
    }

    fn results(runs: Vec<Value>) -> Value {
        json!({
            "rounds": 2,
            "scenarios": [{"name": "memory, max rate", "kind": "memory",
                           "modes": ["oracle", "event", "poll-100ms"]}],
            "runs": runs,
        })
    }

    #[test]
    fn event_is_first_only_when_it_beats_every_other_mode_at_p50_and_p99() {
        let behind_at_p99 = results(vec![
            memory_run("oracle", Some(100.0), 0.0),
            memory_run("oracle", Some(104.0), 0.0),
            memory_run("event", Some(105.0), 1.0),
            memory_run("event", Some(300.0), 1.0),
            memory_run("poll-100ms", Some(150.0), 50.0),
            memory_run("poll-100ms", Some(200.0), 60.0),
        ]);
        let markdown = table(&behind_at_p99);
        assert!(
            markdown.contains("p50 event 105 (best other poll-100ms 150); p99 event 300 (best other poll-100ms 200) | **no**"),
            "{markdown}"
        );
        assert!(
            markdown.contains("event 105 ms, oracle 100 ms (+5.0 ms) | yes"),
            "{markdown}"
        );

        // A mode whose bomb the kernel's OOM killer stopped never got its
        // memory back: event is first against it.
        let other_lost = results(vec![
            memory_run("oracle", Some(100.0), 0.0),
            memory_run("event", Some(130.0), 1.0),
            memory_run("poll-100ms", None, 50.0),
        ]);
        let markdown = table(&other_lost);
        assert!(
            markdown.contains("every other mode: never) | yes"),
            "{markdown}"
        );
        assert!(
            markdown.contains("event 130 ms, oracle 100 ms (+30.0 ms) | **no**"),
            "{markdown}"
        );
    }
}
