//! `/metrics` as Prometheus and Grafana see it: every volume's series from the
//! start, labels and policy figures, `promtool check metrics`, and the Grafana
//! dashboard shipped in `deploy/grafana/weir.json` naming only metrics the
//! server exports.

mod common;

use weir_server::nbd_client::NbdClient;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

/// The metric names of the samples in an exposition (histogram series keep
/// their `_bucket`/`_sum`/`_count` suffixes; families are added too).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            names.insert(rest.split(' ').next().unwrap_or_default().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The sample lines of metric `name` (with labels, without the value).
fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_volume_has_its_series_labels_and_policy_figures_from_the_start() {
    let dir = common::TempDir::new("metrics-start");
    let server = common::start(dir.path()).await;
    let text = server.admin_client().metrics().await.unwrap();
    for volume in ["open", "ro", "hidden", "slow"] {
        for series in [
            format!("weir_volume_ios_total{{volume=\"{volume}\",op=\"read\"}} 0"),
            format!("weir_volume_latency_seconds_count{{volume=\"{volume}\"}} 0"),
            format!("weir_volume_queued{{volume=\"{volume}\"}} 0"),
            format!("weir_volume_qos_wait_seconds_total{{volume=\"{volume}\"}} 0"),
            format!("weir_volume_dispatches_total{{volume=\"{volume}\"}} 0"),
            format!("weir_volume_held_back_dispatches_total{{volume=\"{volume}\"}} 0"),
        ] {
            assert!(text.contains(&series), "no {series} before any I/O");
        }
    }
    assert!(text.contains("weir_volume_size_bytes{volume=\"open\"} 16777216"));
    assert!(text.contains(
        "weir_volume_info{volume=\"open\",pool=\"default\",policy=\"mission-critical\",service_level=\"mission-critical\",mode=\"rw\"} 1"
    ));
    assert!(text.contains("mode=\"ro\"} 1"), "ro volume: {text}");
    assert!(text.contains("weir_volume_limit_iops{volume=\"slow\"} 100"));
    assert!(text.contains("weir_volume_latency_target_seconds{volume=\"open\"} 0.01"));
    assert!(text.contains("weir_volume_reservation_iops{volume=\"open\"} 75000"));
    // Latency buckets from 10 µs to 10 s.
    let buckets = samples(&text, "weir_volume_latency_seconds_bucket");
    assert!(buckets.iter().any(|l| l.contains("le=\"0.00001\"")));
    assert!(buckets.iter().any(|l| l.contains("le=\"10\"")));
    for name in [
        "weir_build_info",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "weir_connections",
        "weir_pool_capacity_bytes",
        "weir_pool_free_bytes",
        "weir_pool_provisioned_bytes",
        "weir_pool_allocated_bytes",
    ] {
        assert!(!samples(&text, name).is_empty(), "no {name} in {text}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_and_qos_wait_are_counted() {
    let dir = common::TempDir::new("metrics-io");
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "slow").await;
    // `slow` is limited to 100 IOPS: 30 back-to-back reads wait in the gate.
    for i in 0..30 {
        c.read(i * 4096, 4096).await.unwrap().unwrap();
    }
    let text = server.admin_client().metrics().await.unwrap();
    assert!(
        text.contains("weir_host_connections{host=\"127.0.0.1\"} 1"),
        "{text}"
    );
    let wait_line = samples(&text, "weir_volume_qos_wait_seconds_total")
        .into_iter()
        .find(|l| l.contains("\"slow\""))
        .unwrap();
    let wait_s: f64 = wait_line.rsplit(' ').next().unwrap().parse().unwrap();
    // 30 reads at 100 IOPS take about 0.3 s, nearly all of it in the gate.
    assert!(wait_s > 0.05, "{wait_line}");
    assert!(text.contains("weir_volume_ios_total{volume=\"slow\",op=\"read\"} 30"));
    server.shutdown().await.unwrap();
}

/// A client that comes from ever new addresses (1,100 of 127/8 here; an IPv6
/// client has a /64) leaves the host table bounded: connected hosts and the
/// 1,024 most recent idle ones keep their series, the rest are summed under
/// `host="other"`, and the per-host series still add up to every I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_series_stay_bounded_whatever_the_number_of_addresses() {
    let dir = common::TempDir::new("metrics-hosts");
    let server = common::start(dir.path()).await;
    let addr = server.nbd_addr();
    let go = || weir_nbd::ClientConfig::go("open");
    // The first host stays connected throughout: never forgotten.
    let (mut held, _) = NbdClient::connect(addr, go()).await.unwrap();
    held.read(0, 4096).await.unwrap().unwrap();
    const HOSTS: u32 = 1100;
    for n in 0..HOSTS {
        let from = IpAddr::from(Ipv4Addr::from(0x7f01_0000 + n));
        let (mut c, _) = NbdClient::connect_from(Some(from), addr, go())
            .await
            .unwrap_or_else(|e| panic!("from {from}: {e:#}"));
        c.read(u64::from(n) * 4096, 4096).await.unwrap().unwrap();
        c.disconnect().await.unwrap();
    }
    // The last session's end is counted when its connection is done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        let text = server.admin_client().metrics().await.unwrap();
        if text.contains("weir_hosts_forgotten_total 76\n") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let reads: Vec<&str> = samples(&text, "weir_host_ios_total")
        .into_iter()
        .filter(|l| l.contains("op=\"read\""))
        .collect();
    // 127.0.0.1 (connected), 1,024 idle hosts, "other".
    assert_eq!(reads.len(), 1 + 1024 + 1, "{reads:?}");
    let total: u64 = reads
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, u64::from(HOSTS) + 1);
    assert!(reads.contains(&"weir_host_ios_total{host=\"127.0.0.1\",op=\"read\"} 1"));
    assert!(reads.contains(&"weir_host_ios_total{host=\"other\",op=\"read\"} 76"));
    assert!(reads.contains(&"weir_host_ios_total{host=\"127.1.4.75\",op=\"read\"} 1"));
    assert!(
        !reads.iter().any(|l| l.contains("\"127.1.0.75\"")),
        "forgotten"
    );
    held.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_exposition() {
    let dir = common::TempDir::new("metrics-promtool");
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "open").await;
    c.write(0, &[7u8; 4096], false).await.unwrap().unwrap();
    let text = server.admin_client().metrics().await.unwrap();
    server.shutdown().await.unwrap();
    if !weir_testkit::require_tool("promtool", &["prometheus"]) {
        return;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = weir_testkit::output_text(&out);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );
}

/// Metric names a PromQL expression uses (identifiers starting `weir_` or
/// `process_`).
fn promql_metrics(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if starts_word && (expr[i..].starts_with("weir_") || expr[i..].starts_with("process_")) {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(expr.len(), |n| i + n);
            out.push(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_names_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/weir.json"
    );
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // What Grafana's import needs: a title, a uid, a schema version, the
    // datasource input, panels with a type, a position and queries.
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 30);
    assert_eq!(dash["__inputs"][0]["pluginId"], "prometheus");
    let panels = dash["panels"].as_array().unwrap();
    let mut exprs = Vec::new();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate id {p}");
        let kind = p["type"].as_str().unwrap();
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "{p}");
        }
        if kind == "row" {
            continue;
        }
        assert!(p["title"].is_string());
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            assert!(t["refId"].is_string());
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        exprs.push(v["query"]["query"].as_str().unwrap().to_string());
    }
    assert!(exprs.len() >= 20, "{exprs:?}");

    let dir = common::TempDir::new("metrics-grafana");
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "open").await;
    c.read(0, 4096).await.unwrap().unwrap();
    let text = server.admin_client().metrics().await.unwrap();
    let exported = exported_names(&text);
    for expr in &exprs {
        let names = promql_metrics(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        for n in names {
            assert!(
                exported.contains(&n),
                "the dashboard's {expr:?} names {n}, which /metrics does not export"
            );
        }
    }
    server.shutdown().await.unwrap();
}
