//! `weir volume replicate …` and `weir volume replications`: asynchronous
//! replication of thin volumes (weir_server::replicate) through the admin API.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use weir_report::{Column, Table};
use weir_server::admin::Client;
use weir_server::replicate::{ReplicationRequest, ReplicationStatus, format_every, parse_every};

use crate::admin::human_size;

/// What `weir volume replicate` was asked.
pub struct Replicate {
    pub name: String,
    pub to: Option<String>,
    pub every: Option<String>,
    pub once: bool,
    pub no_wait: bool,
    pub stop: bool,
    pub overwrite: bool,
}

fn secs(s: f64) -> String {
    if s < 0.1 {
        format!("{:.0} ms", s * 1e3)
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else {
        format_every(s.round() as u64)
    }
}

fn mbps(bytes: u64, seconds: f64) -> String {
    if seconds > 0.0 {
        format!("{:.0} MB/s", bytes as f64 / seconds / 1e6)
    } else {
        "-".into()
    }
}

/// One line about a replication's last cycle.
fn last_cycle(r: &ReplicationStatus) -> String {
    match &r.last_cycle {
        None => "-".into(),
        Some(c) => format!(
            "{}{}: {} written, {} zeroed in {} ({} written)",
            if c.full { "full copy" } else { "changes" },
            c.resumed_from_bytes
                .map(|b| format!(" resumed at {}", human_size(b)))
                .unwrap_or_default(),
            human_size(c.shipped_bytes),
            human_size(c.zeroed_bytes),
            secs(c.seconds),
            // Zeroes cost the target no data (WRITE_ZEROES): no rate of them.
            mbps(c.shipped_bytes, c.seconds),
        ),
    }
}

/// Rows for `weir volume stats` (the volume is replicated).
pub fn stats_rows(r: &ReplicationStatus) -> Vec<[String; 2]> {
    vec![
        ["replication target".into(), r.target.clone()],
        [
            "replication lag (RPO)".into(),
            format!("{} ({})", secs(r.lag_seconds), r.state),
        ],
        [
            "last replicated".into(),
            r.last_snapshot.clone().unwrap_or_else(|| "-".into()),
        ],
        ["last cycle".into(), last_cycle(r)],
    ]
}

pub fn table(all: &[ReplicationStatus]) -> Table {
    let mut t = Table::new(vec![
        Column::left("volume"),
        Column::left("target"),
        Column::left("every"),
        Column::left("state"),
        Column::right("lag"),
        Column::left("last replicated"),
        Column::left("last cycle"),
        Column::left("error"),
    ]);
    for r in all {
        t.add_row([
            r.volume.clone(),
            r.target.clone(),
            r.every_seconds
                .map(format_every)
                .unwrap_or_else(|| "on request".into()),
            match &r.progress {
                Some(p) => format!(
                    "running {}/{}",
                    human_size(p.done_bytes),
                    human_size(p.total_bytes)
                ),
                None => r.state.clone(),
            },
            secs(r.lag_seconds),
            r.last_snapshot.clone().unwrap_or_else(|| "-".into()),
            last_cycle(r),
            match (&r.last_error, r.last_cycle.as_ref().map_or(0, |c| c.number)) {
                (Some(e), n) if r.last_error_cycle > n => e.clone(),
                _ => String::new(),
            },
        ]);
    }
    t
}

fn print(json: bool, all: &[ReplicationStatus]) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(all)?);
    } else {
        out!("{}", table(all));
    }
    Ok(())
}

pub async fn list(client: &Client, json: bool, volume: Option<&str>) -> Result<()> {
    let all = match volume {
        Some(v) => vec![client.replication(v).await.map_err(crate::admin::explain)?],
        None => client.replications().await.map_err(crate::admin::explain)?,
    };
    if all.is_empty() && !json {
        outln!("no replications");
        return Ok(());
    }
    print(json, &all)
}

pub async fn replicate(client: &Client, json: bool, r: Replicate) -> Result<()> {
    let explain = crate::admin::explain;
    if r.stop {
        let s = client.stop_replication(&r.name).await.map_err(explain)?;
        if json {
            return print(json, &[s]);
        }
        outln!(
            "stopped replicating {} to {} (the target holds {})",
            s.volume,
            s.target,
            s.last_snapshot.as_deref().unwrap_or("an incomplete copy")
        );
        return Ok(());
    }
    let Some(to) = r.to else {
        bail!("--to nbd://HOST[:PORT]/EXPORT is needed");
    };
    let every_seconds = match &r.every {
        Some(e) => Some(parse_every(e).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let req = ReplicationRequest {
        to,
        every_seconds,
        once: r.once,
        overwrite: r.overwrite,
    };
    let first = client.replicate(&r.name, &req).await.map_err(explain)?;
    if !r.once || r.no_wait {
        return print(json, &[first]);
    }
    // Wait for the first cycle that started after the request.
    let wanted = first.cycles_started + 1;
    let started = Instant::now();
    let mut told = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let s = client.replication(&r.name).await.map_err(explain)?;
        if s.last_cycle.as_ref().is_some_and(|c| c.number >= wanted) {
            if json {
                return print(json, &[s]);
            }
            let c = s.last_cycle.as_ref().expect("checked");
            outln!(
                "replicated {} to {}: {}; lag now {}",
                c.snapshot,
                s.target,
                last_cycle(&s),
                secs(s.lag_seconds)
            );
            return Ok(());
        }
        if s.last_error_cycle >= wanted {
            bail!(
                "replication cycle of {} failed: {} (it is retried by itself and resumes \
                 where it stopped; weir volume replications shows how it goes)",
                r.name,
                s.last_error.unwrap_or_default()
            );
        }
        if !json && told.elapsed() >= Duration::from_secs(5) {
            told = Instant::now();
            if let Some(p) = &s.progress {
                errln!(
                    "{}: {} of {} after {:.0} s",
                    p.snapshot,
                    human_size(p.done_bytes),
                    human_size(p.total_bytes),
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
}
