//! `weir volume stats NAME --since DURATION`: a volume's history from the
//! server's store (crates/weir-server `history`), as a table of about 60 rows.

use anyhow::{Result, bail};
use weir_report::{Column, Table};
use weir_server::admin::Client;
use weir_server::history::Series;
use weir_server::sampler::parse_seconds;

/// Rows a table aims at.
const ROWS: u64 = 60;

/// Fetches and prints the last `since` of `name`.
pub async fn print(client: &Client, name: &str, since: &str, json: bool) -> Result<()> {
    let Some(since_s) = parse_seconds(since) else {
        bail!("--since {since:?}: expected a duration such as 90s, 15m, 1h or 7d");
    };
    // What the history keeps (its coarsest tier); more was clamped by the
    // server, and the table then began before anything was recorded.
    if since_s > 30 * 86_400 {
        bail!("--since {since:?}: at most 30d (the history keeps 30 days)");
    }
    let step_s = since_s.div_ceil(ROWS).max(1);
    let series = client
        .volume_history(name, since_s, step_s)
        .await
        .map_err(crate::admin::explain)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&series)?);
        return Ok(());
    }
    out!("{}", render(&series, since));
    Ok(())
}

/// The table (times in UTC).
pub fn render(series: &Series, since: &str) -> String {
    // The server's names, with their control characters (terminal escapes) shown
    // as U+FFFD.
    let mut out = crate::top::printable(&format!(
        "{}: last {since}, a row per {} s (tier {}), {} row{}",
        series.volume,
        series.step_s,
        if series.tier.is_empty() {
            "-"
        } else {
            &series.tier
        },
        series.points.len(),
        if series.points.len() == 1 { "" } else { "s" }
    )) + "\n";
    if series.points.is_empty() {
        out.push_str("no history yet (the server records every volume once a second)\n");
        return out;
    }
    let mut table = Table::new(vec![
        Column::left("time (UTC)"),
        Column::right("IOPS"),
        Column::right("MB/s"),
        Column::right("p50 ms"),
        Column::right("p99 ms"),
        Column::right("queued"),
        Column::right("throttled"),
        Column::right("reservation met"),
        Column::right("target met"),
    ]);
    for p in &series.points {
        let s = &p.sample;
        table.add_row([
            utc(p.t),
            weir_report::fmt_iops(f64::from(s.iops)),
            weir_report::fmt_mbps(f64::from(s.mbps)),
            weir_report::fmt_ms(f64::from(s.p50_ms)),
            weir_report::fmt_ms(f64::from(s.p99_ms)),
            format!("{:.1}", s.queued),
            percent(s.throttled),
            percent(s.reservation_met),
            percent(s.target_met),
        ]);
    }
    out.push_str(&table.render(false));
    out
}

fn percent(x: f32) -> String {
    format!("{:.0} %", x * 100.0)
}

/// `YYYY-MM-DD HH:MM:SS` of a unix time (civil from days, H. Hinnant's algorithm).
pub fn utc(t: u64) -> String {
    let (days, secs) = ((t / 86_400) as i64, t % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_server::history::{Point, Sample};

    /// More than the history keeps is refused before asking the server (it
    /// clamped, and the table began before anything was recorded).
    #[test]
    fn since_beyond_the_history_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = weir_server::admin::Client::new("127.0.0.1:1".parse().unwrap());
        let e = rt.block_on(super::print(&client, "v", "99999999999d", false));
        assert!(e.unwrap_err().to_string().contains("at most 30d"));
    }

    #[test]
    fn utc_times_and_tables() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00");
        let series = Series {
            volume: "sql".into(),
            tier: "1s".into(),
            step_s: 60,
            from: 0,
            to: 3600,
            points: vec![Point {
                t: 60,
                sample: Sample {
                    iops: 1234.0,
                    throttled: 0.5,
                    target_met: 1.0,
                    ..Sample::default()
                },
            }],
        };
        let text = render(&series, "1h");
        assert!(
            text.starts_with("sql: last 1h, a row per 60 s (tier 1s), 1 row\n"),
            "{text}"
        );
        assert!(
            text.contains("1970-01-01 00:01:00") && text.contains("50 %"),
            "{text}"
        );
        let empty = Series {
            points: vec![],
            ..series
        };
        assert!(render(&empty, "1h").contains("no history yet"));
        // A hostile server's names cannot steer the terminal.
        let hostile = Series {
            volume: "sql\u{1b}]0;owned\u{7}".into(),
            tier: "\u{1b}[2J".into(),
            ..empty
        };
        let text = render(&hostile, "1h");
        assert!(
            text.starts_with("sql\u{FFFD}]0;owned\u{FFFD}: "),
            "{text:?}"
        );
        assert!(
            !text.contains('\u{1b}') && text.contains("(tier \u{FFFD}[2J)"),
            "{text:?}"
        );
    }
}
