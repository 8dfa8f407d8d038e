//! `weir top`: an esxtop-like view of every volume, refreshed from the server's
//! `GET /v1/stats` (the sampler's last second: one request per refresh, whatever
//! the number of volumes). Modes: volumes, hosts, policies (volumes summed per
//! policy); sortable by any figure; `--batch` prints frames as text (scripts,
//! the CPU benchmark).

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use weir_server::sampler::{LiveStats, VolumeLive};

#[derive(clap::Args)]
pub struct TopArgs {
    /// Seconds between refreshes (0.1-86400)
    #[arg(long, short = 'd', value_name = "SECONDS", default_value = "1", value_parser = crate::admin::parse_refresh_seconds)]
    delay: f64,
    /// What rows show first (keys v, h, p switch)
    #[arg(long, value_enum, default_value = "volumes")]
    mode: Mode,
    /// The column rows are sorted by first (keys: s cycles, r reverses)
    #[arg(long, value_enum, default_value = "iops")]
    sort: SortKey,
    /// Print frames as text instead of the interactive view (like esxtop -b)
    #[arg(long, short = 'b')]
    batch: bool,
    /// With --batch (or --json: one JSON document of every volume and host a frame):
    /// stop after this many frames (default: 1)
    #[arg(long, short = 'n', value_name = "N")]
    iterations: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Volumes,
    Hosts,
    Policies,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    Name,
    Iops,
    Mbps,
    P99,
    Queued,
    Throttled,
}

impl SortKey {
    const ALL: [SortKey; 6] = [
        SortKey::Name,
        SortKey::Iops,
        SortKey::Mbps,
        SortKey::P99,
        SortKey::Queued,
        SortKey::Throttled,
    ];
    fn next(self) -> SortKey {
        let i = Self::ALL.iter().position(|&k| k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }
}

/// What the screen shows (changed by keys).
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub mode: Mode,
    pub sort: SortKey,
    pub descending: bool,
    /// First row shown (scrolling).
    pub offset: usize,
}

/// One row of any mode: a label, figures, a verdict.
#[derive(Clone, Debug, Default, PartialEq)]
struct RowData {
    cells: Vec<String>,
    name: String,
    iops: f64,
    mbps: f64,
    p99: f64,
    queued: f64,
    throttled: f64,
    /// `Some(true)`: busy and meeting its targets; `Some(false)`: missing one.
    meets: Option<bool>,
}

fn meets(v: &VolumeLive) -> Option<bool> {
    (v.sample.iops > 0.0).then_some(v.sample.target_met >= 1.0 && v.sample.reservation_met >= 1.0)
}

fn f(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

fn volume_rows(live: &LiveStats) -> (Vec<&'static str>, Vec<RowData>) {
    let header = vec![
        "VOLUME", "POOL", "POLICY", "IOPS", "MB/s", "P50ms", "P99ms", "TGTms", "QUEUED", "THRTL%",
        "RESV", "OK",
    ];
    let rows = live
        .volumes
        .iter()
        .map(|v| {
            let s = &v.sample;
            let m = meets(v);
            RowData {
                cells: vec![
                    v.name.clone(),
                    v.pool.clone(),
                    v.policy.clone(),
                    f(s.iops.into(), 0),
                    f(s.mbps.into(), 1),
                    f(s.p50_ms.into(), 2),
                    f(s.p99_ms.into(), 2),
                    v.latency_target_ms.map_or("-".into(), |t| f(t, 0)),
                    f(s.queued.into(), 1),
                    f(f64::from(s.throttled) * 100.0, 0),
                    if s.reservation_met >= 1.0 {
                        "met"
                    } else {
                        "MISS"
                    }
                    .into(),
                    match m {
                        None => "idle",
                        Some(true) => "yes",
                        Some(false) => "NO",
                    }
                    .into(),
                ],
                name: v.name.clone(),
                iops: s.iops.into(),
                mbps: s.mbps.into(),
                p99: s.p99_ms.into(),
                queued: s.queued.into(),
                throttled: s.throttled.into(),
                meets: m,
            }
        })
        .collect();
    (header, rows)
}

fn host_rows(live: &LiveStats) -> (Vec<&'static str>, Vec<RowData>) {
    let header = vec!["HOST", "IOPS", "MB/s", "MEANms"];
    let rows = live
        .hosts
        .iter()
        .map(|h| RowData {
            cells: vec![
                h.host.clone(),
                f(h.iops.into(), 0),
                f(h.mbps.into(), 1),
                f(h.mean_ms.into(), 2),
            ],
            name: h.host.clone(),
            iops: h.iops.into(),
            mbps: h.mbps.into(),
            p99: h.mean_ms.into(),
            ..RowData::default()
        })
        .collect();
    (header, rows)
}

fn policy_rows(live: &LiveStats) -> (Vec<&'static str>, Vec<RowData>) {
    let header = vec![
        "POLICY", "LEVEL", "VOLUMES", "BUSY", "MEETING", "IOPS", "MB/s", "WORSTP99", "TGTms",
        "QUEUED",
    ];
    let mut groups: std::collections::BTreeMap<&str, Vec<&VolumeLive>> = Default::default();
    for v in &live.volumes {
        groups.entry(v.policy.as_str()).or_default().push(v);
    }
    let rows = groups
        .into_iter()
        .map(|(policy, vs)| {
            let sum = |g: fn(&VolumeLive) -> f32| vs.iter().map(|v| f64::from(g(v))).sum::<f64>();
            let busy = vs.iter().filter(|v| meets(v).is_some()).count();
            let meeting = vs.iter().filter(|v| meets(v) == Some(true)).count();
            let worst = vs
                .iter()
                .map(|v| f64::from(v.sample.p99_ms))
                .fold(0.0, f64::max);
            let (iops, mbps, queued) = (
                sum(|v| v.sample.iops),
                sum(|v| v.sample.mbps),
                sum(|v| v.sample.queued),
            );
            let level = vs[0]
                .service_level
                .map_or("-".to_string(), |l| format!("{l:?}"));
            RowData {
                cells: vec![
                    policy.to_string(),
                    level,
                    vs.len().to_string(),
                    busy.to_string(),
                    format!("{meeting}/{busy}"),
                    f(iops, 0),
                    f(mbps, 1),
                    f(worst, 2),
                    vs[0].latency_target_ms.map_or("-".into(), |t| f(t, 0)),
                    f(queued, 1),
                ],
                name: policy.to_string(),
                iops,
                mbps,
                p99: worst,
                queued,
                meets: (busy > 0).then_some(meeting == busy),
                ..RowData::default()
            }
        })
        .collect();
    (header, rows)
}

fn sort_rows(rows: &mut [RowData], key: SortKey, descending: bool) {
    let k = |r: &RowData| match key {
        SortKey::Name => 0.0,
        SortKey::Iops => r.iops,
        SortKey::Mbps => r.mbps,
        SortKey::P99 => r.p99,
        SortKey::Queued => r.queued,
        SortKey::Throttled => r.throttled,
    };
    rows.sort_by(|a, b| {
        let order = k(a).total_cmp(&k(b)).then_with(|| a.name.cmp(&b.name));
        if descending && key != SortKey::Name {
            order.reverse()
        } else {
            order
        }
    });
    if descending && key == SortKey::Name {
        rows.reverse();
    }
}

/// Draws one frame of `live` as `view` says; `trouble`: why the figures shown
/// are not fresh (the server went away: the last frame stays, marked). Returns
/// the first row shown: `view.offset`, or less when the rows end sooner.
pub fn draw(
    frame: &mut ratatui::Frame,
    view: &View,
    live: &LiveStats,
    trouble: Option<&str>,
) -> usize {
    let (header, rows) = rows_of(view, live);
    let [top, body, keys] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let visible = usize::from(body.height.saturating_sub(1));
    let offset = view.offset.min(rows.len().saturating_sub(visible));
    let shown: Vec<&RowData> = rows.iter().skip(offset).take(visible).collect();
    let widths = fit_columns(&header, &shown, body.width);
    let hidden = header.len() - widths.len();
    let mut lines = summary(view, live);
    if hidden > 0 {
        // First on its line: a narrow screen cuts the line's end.
        let note = format!("{hidden} columns hidden (widen the terminal)  ");
        lines[1].spans.insert(0, note.into());
    }
    if let Some(t) = trouble {
        lines[1] = Line::from(format!("{t}; showing the last frame, retrying"))
            .style(Style::new().fg(Color::Red));
    }
    frame.render_widget(Paragraph::new(lines), top);
    let table = Table::new(
        shown.iter().map(|r| row_widget(r, &widths)),
        widths.iter().map(|&w| Constraint::Length(w as u16)),
    )
    .header(
        Row::new(header[..widths.len()].to_vec())
            .style(Style::new().add_modifier(Modifier::REVERSED)),
    );
    frame.render_widget(table, body);
    let help = "q quit  v volumes  h hosts  p policies  s sort  r reverse  ↑↓ PgUp PgDn scroll";
    frame.render_widget(Paragraph::new(help), keys);
    offset
}

/// The widths of the columns that fit in `width` terminal columns: each as wide
/// as its widest cell or header; when they do not all fit, the name (first)
/// column gives up width down to 12 (its names end in "…"), then columns are
/// left out from the right. A figure is never cut.
fn fit_columns(header: &[&str], rows: &[&RowData], width: u16) -> Vec<usize> {
    const NAME_MIN: usize = 12;
    let mut widths = natural_widths(header, rows);
    // Each column after the first is preceded by one space.
    let total = |w: &[usize]| w.iter().sum::<usize>() + w.len().saturating_sub(1);
    let width = usize::from(width);
    if total(&widths) > width && widths[0] > NAME_MIN {
        let over = total(&widths) - width;
        widths[0] = widths[0].saturating_sub(over).max(NAME_MIN);
    }
    while widths.len() > 1 && total(&widths) > width {
        widths.pop();
    }
    widths
}

/// Each column's widest cell or header, in characters.
fn natural_widths(header: &[&str], rows: &[&RowData]) -> Vec<usize> {
    let widest = |i: usize| {
        (rows.iter())
            .filter_map(|r| r.cells.get(i))
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(0)
    };
    (header.iter().enumerate())
        .map(|(i, h)| widest(i).max(h.chars().count()))
        .collect()
}

/// A row's first `widths.len()` cells; a name longer than its column ends in "…".
fn row_widget(r: &RowData, widths: &[usize]) -> Row<'static> {
    let style = match r.meets {
        Some(false) => Style::new().fg(Color::Red),
        _ => Style::new(),
    };
    let cells = r.cells.iter().zip(widths).enumerate().map(|(i, (c, &w))| {
        if i == 0 && c.chars().count() > w {
            let kept: String = c.chars().take(w.saturating_sub(1)).collect();
            Cell::from(kept + "…")
        } else {
            Cell::from(c.clone())
        }
    });
    Row::new(cells).style(style)
}

fn summary(view: &View, live: &LiveStats) -> Vec<Line<'static>> {
    let busy = live.volumes.iter().filter(|v| meets(v).is_some()).count();
    let meeting = live
        .volumes
        .iter()
        .filter(|v| meets(v) == Some(true))
        .count();
    let iops = positive_zero(
        (live.volumes.iter())
            .map(|v| f64::from(v.sample.iops))
            .sum(),
    );
    let mbps = positive_zero(
        (live.volumes.iter())
            .map(|v| f64::from(v.sample.mbps))
            .sum(),
    );
    let time = if live.time == 0 {
        "-".into()
    } else {
        crate::history::utc(live.time)
    };
    vec![
        Line::from(format!(
            "weir top — {time} UTC  {}  {}  {iops:.0} IOPS  {mbps:.1} MB/s  {meeting}/{busy} busy volumes meet their targets",
            plural(live.volumes.len(), "volume"),
            plural(live.hosts.len(), "host")
        )),
        Line::from(format!(
            "mode: {}  sort: {} {}",
            value_name(view.mode),
            value_name(view.sort),
            if view.descending {
                "(descending)"
            } else {
                "(ascending)"
            }
        )),
    ]
}

/// `1 host`, `2 hosts`.
fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// A mode's or sort key's name as `--mode` / `--sort` take it.
fn value_name(v: impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_string())
}

/// One frame as the screen shows it, as text lines (the TestBackend tests).
#[cfg(test)]
pub fn render_text(view: &View, live: &LiveStats, width: u16, height: u16) -> Result<String> {
    render_text_with(view, live, width, height, None)
}

/// [`render_text`] with the server in trouble.
#[cfg(test)]
pub fn render_text_with(
    view: &View,
    live: &LiveStats,
    width: u16,
    height: u16,
    trouble: Option<&str>,
) -> Result<String> {
    let mut terminal = Terminal::new(ratatui::backend::TestBackend::new(width, height))?;
    terminal.draw(|f| {
        draw(f, view, live, trouble);
    })?;
    let buffer = terminal.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width)
            .map(|x| buffer[(x, y)].symbol().to_string())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    Ok(out)
}

/// Applies a key; `false`: quit.
pub fn on_key(view: &mut View, key: KeyCode, page: usize) -> bool {
    match key {
        KeyCode::Char('q') | KeyCode::Esc => return false,
        KeyCode::Char('v') => (view.mode, view.offset) = (Mode::Volumes, 0),
        KeyCode::Char('h') => (view.mode, view.offset) = (Mode::Hosts, 0),
        KeyCode::Char('p') => (view.mode, view.offset) = (Mode::Policies, 0),
        KeyCode::Char('s') => view.sort = view.sort.next(),
        KeyCode::Char('r') => view.descending = !view.descending,
        KeyCode::Down => view.offset += 1,
        KeyCode::Up => view.offset = view.offset.saturating_sub(1),
        KeyCode::PageDown => view.offset += page,
        KeyCode::PageUp => view.offset = view.offset.saturating_sub(page),
        _ => {}
    }
    true
}

/// `weir top`.
pub fn run(target: crate::admin::AdminTarget, args: TopArgs) -> Result<()> {
    let interactive_view = !(args.batch || target.json);
    if interactive_view && !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        bail!(
            "standard output is not a terminal for the interactive view: use --batch (-n N frames) or --json"
        );
    }
    let (client, _endpoint) = crate::admin::admin_client(&target)?;
    let rt = crate::admin::runtime()?;
    let fetch = || {
        rt.block_on(client.live_stats())
            .map_err(crate::admin::explain)
    };
    let mut view = View {
        mode: args.mode,
        sort: args.sort,
        descending: args.sort != SortKey::Name,
        offset: 0,
    };
    let delay = Duration::from_secs_f64(args.delay);
    if !interactive_view {
        return batch(
            &view,
            fetch,
            delay,
            args.iterations.unwrap_or(1),
            target.json,
        );
    }
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            return Err(e).context("opening the terminal");
        }
    };
    let result = interactive(&mut terminal, &mut view, fetch, delay);
    ratatui::restore();
    result
}

/// Every row of a frame as plain text: the summary, the header, all rows (no
/// screen to fit, so no ratatui buffer: its area is limited to 65,535 cells).
/// Each column is as wide as its widest cell (at least 24 for the name, 8 for
/// the others), so long policy or volume names keep the columns aligned.
pub fn batch_text(view: &View, live: &LiveStats) -> String {
    let (header, rows) = rows_of(view, live);
    let all: Vec<&RowData> = rows.iter().collect();
    let widths: Vec<usize> = (natural_widths(&header, &all).into_iter().enumerate())
        .map(|(i, w)| w.max(if i == 0 { 24 } else { 8 }))
        .collect();
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (c, w) in cells.iter().zip(&widths) {
            out.push_str(&format!("{c:<w$} "));
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out: String = summary(view, live)
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&line(header.clone()));
    for r in &rows {
        out.push_str(&line(r.cells.iter().map(String::as_str).collect()));
    }
    out
}

fn rows_of(view: &View, live: &LiveStats) -> (Vec<&'static str>, Vec<RowData>) {
    let (header, mut rows) = match view.mode {
        Mode::Volumes => volume_rows(live),
        Mode::Hosts => host_rows(live),
        Mode::Policies => policy_rows(live),
    };
    sort_rows(&mut rows, view.sort, view.descending);
    for row in &mut rows {
        for cell in &mut row.cells {
            if cell.chars().any(char::is_control) {
                *cell = printable(cell);
            }
        }
    }
    (header, rows)
}

/// `text` with control characters (a hostile server's terminal escapes) shown
/// as U+FFFD.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .collect()
}

/// `x`, with a negative zero (what an empty or all-zero `f64` sum gives, which
/// `max(0.0)` may keep) made positive: "-0 IOPS" is not a figure.
fn positive_zero(x: f64) -> f64 {
    if x == 0.0 { 0.0 } else { x }
}

fn batch(
    view: &View,
    fetch: impl Fn() -> Result<LiveStats>,
    delay: Duration,
    n: u64,
    json: bool,
) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    for i in 0..n {
        let started = Instant::now();
        let live = fetch()?;
        let text = if json {
            serde_json::to_string(&live)?
        } else {
            batch_text(view, &live)
        };
        writeln!(stdout, "{text}").context("writing to stdout")?;

        if i + 1 < n {
            std::thread::sleep(delay.saturating_sub(started.elapsed()));
        }
    }
    Ok(())
}

fn interactive<B: Backend>(
    terminal: &mut Terminal<B>,
    view: &mut View,
    fetch: impl Fn() -> Result<LiveStats>,
    delay: Duration,
) -> Result<()> {
    let mut live = fetch()?;
    let mut trouble: Option<String> = None;
    let mut next = Instant::now() + delay;
    loop {
        // Scrolling past the last row keeps the offset at it, so that ↑ moves at
        // once (it counted on, and took as many presses back).
        let mut shown = view.offset;
        terminal.draw(|f| shown = draw(f, view, &live, trouble.as_deref()))?;
        view.offset = shown;
        let page = usize::from(terminal.size()?.height.saturating_sub(4)).max(1);
        if event::poll(next.saturating_duration_since(Instant::now()))?
            && let Event::Key(k) = event::read()?
            && k.kind == KeyEventKind::Press
            && !on_key(view, k.code, page)
        {
            return Ok(());
        }
        if Instant::now() >= next {
            // A server restarting or gone keeps the view open (as esxtop does):
            // the last frame stays, marked, until it answers again.
            match fetch() {
                Ok(l) => (live, trouble) = (l, None),
                Err(e) => trouble = Some(format!("{e:#}")),
            }
            next = Instant::now() + delay;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_server::history::Sample;
    use weir_server::sampler::HostLive;

    fn volume(name: &str, policy: &str, iops: f32, p99: f32, met: bool) -> VolumeLive {
        VolumeLive {
            name: name.into(),
            pool: "default".into(),
            policy: policy.into(),
            size_bytes: 1 << 30,
            latency_target_ms: Some(10.0),
            sample: Sample {
                iops,
                mbps: iops * 4096.0 / 1e6,
                p50_ms: p99 / 2.0,
                p99_ms: p99,
                target_met: if met { 1.0 } else { 0.0 },
                reservation_met: 1.0,
                ..Sample::default()
            },
            ..VolumeLive::default()
        }
    }

    fn snapshot() -> LiveStats {
        LiveStats {
            time: 1_700_000_000,
            interval_s: 1.0,
            volumes: vec![
                volume("sql", "gold", 5000.0, 2.0, true),
                volume("vdi-0001", "bronze", 900.0, 40.0, false),
                volume("vdi-0002", "bronze", 1200.0, 3.0, true),
                volume("idle", "gold", 0.0, 0.0, true),
            ],
            hosts: vec![HostLive {
                host: "10.1.0.7".into(),
                iops: 7100.0,
                mbps: 29.1,
                mean_ms: 1.5,
            }],
        }
    }

    fn view(mode: Mode, sort: SortKey) -> View {
        View {
            mode,
            sort,
            descending: true,
            offset: 0,
        }
    }

    fn lines(v: &View) -> Vec<String> {
        render_text(v, &snapshot(), 150, 12)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn row_of(lines: &[String], name: &str) -> usize {
        lines
            .iter()
            .position(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {lines:#?}"))
    }

    #[test]
    fn volumes_sorted_by_iops_with_verdicts() {
        let l = lines(&view(Mode::Volumes, SortKey::Iops));
        assert!(
            l[0].contains("4 volumes")
                && l[0].contains("7100 IOPS")
                && l[0].contains("2/3 busy volumes meet"),
            "{l:#?}"
        );
        assert!(l[0].contains("2023-11-14 22:13:20"), "{}", l[0]);
        assert!(
            l[2].starts_with("VOLUME") && l[2].contains("P99ms"),
            "{}",
            l[2]
        );
        let order: Vec<usize> = ["sql", "vdi-0002", "vdi-0001", "idle"]
            .iter()
            .map(|n| row_of(&l, n))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{l:#?}");
        let slow = &l[row_of(&l, "vdi-0001")];
        assert!(
            slow.contains("40.00") && slow.trim_end().ends_with("NO"),
            "{slow}"
        );
        assert!(l[row_of(&l, "idle")].trim_end().ends_with("idle"));
        // By p99, ascending.
        let mut v = view(Mode::Volumes, SortKey::P99);
        v.descending = false;
        let l = lines(&v);
        assert!(
            row_of(&l, "idle") < row_of(&l, "vdi-0002")
                && row_of(&l, "sql") < row_of(&l, "vdi-0001")
        );
    }

    /// No server's answer reaches the terminal as an escape sequence, and no
    /// volumes make 0 IOPS, not "-0".
    #[test]
    fn hostile_names_are_shown_not_obeyed_and_zero_is_positive() {
        let mut live = snapshot();
        live.volumes[0].name = "\x1b[2J\x1b]0;title\x07".into();
        live.volumes[0].pool = "p\nq".into();
        let text = batch_text(&view(Mode::Volumes, SortKey::Iops), &live);
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
        assert!(text.contains("\u{FFFD}[2J"), "{text:?}");
        assert!(text.contains("p\u{FFFD}q"), "{text:?}");
        let none = LiveStats {
            volumes: Vec::new(),
            ..snapshot()
        };
        let text = batch_text(&view(Mode::Volumes, SortKey::Iops), &none);
        assert!(text.contains(" 0 IOPS  0.0 MB/s"), "{text}");
        assert!(!text.contains("-0"), "{text}");
    }

    /// A narrow terminal leaves columns out and shortens names, never a figure
    /// (at 50 columns 22,149 IOPS showed as "221"); a wide one shows whole names.
    #[test]
    fn a_narrow_terminal_drops_columns_not_digits() {
        let mut live = snapshot();
        live.volumes[0].name = "a-volume-with-a-rather-long-name".into();
        live.volumes[0].sample.iops = 22149.0;
        live.volumes[0].policy = "business-critical-2".into();
        let v = view(Mode::Volumes, SortKey::Iops);
        let text = render_text(&v, &live, 50, 12).unwrap();
        let l: Vec<&str> = text.lines().collect();
        assert!(l[1].contains("columns hidden"), "{text}");
        let row = l.iter().find(|x| x.starts_with("a-volume")).unwrap();
        assert!(row.contains('…'), "{row}");
        let header: Vec<&str> = l[2].split_whitespace().collect();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(header.len(), cells.len(), "{text}");
        if let Some(i) = header.iter().position(|h| *h == "IOPS") {
            assert_eq!(cells[i], "22149", "{text}");
        }
        assert!(text.lines().all(|x| x.chars().count() <= 50), "{text}");
        // Wide: whole names, every column.
        let text = render_text(&v, &live, 200, 12).unwrap();
        assert!(
            !text.contains("columns hidden") && !text.contains('…'),
            "{text}"
        );
        assert!(text.contains("a-volume-with-a-rather-long-name"), "{text}");
        assert!(
            text.contains("business-critical-2") && text.contains("22149"),
            "{text}"
        );
        assert!(
            text.contains("mode: volumes  sort: iops") && text.contains("1 host "),
            "{text}"
        );
        // The server gone: the last frame stays, and the second line says why.
        let text = render_text_with(&v, &live, 200, 12, Some("cannot reach x")).unwrap();
        let l: Vec<&str> = text.lines().collect();
        assert!(
            l[1].starts_with("cannot reach x; showing the last frame, retrying"),
            "{text}"
        );
        assert!(text.contains("22149"), "{text}");
    }

    #[test]
    fn hosts_and_policies_modes() {
        let l = lines(&view(Mode::Hosts, SortKey::Iops));
        assert!(l[2].starts_with("HOST"), "{l:#?}");
        assert!(l[row_of(&l, "10.1.0.7")].contains("7100"));
        let l = lines(&view(Mode::Policies, SortKey::Iops));
        let gold = &l[row_of(&l, "gold")];
        assert!(gold.contains("1/1") && gold.contains("5000"), "{gold}");
        let bronze = &l[row_of(&l, "bronze")];
        assert!(
            bronze.contains("1/2") && bronze.contains("2100") && bronze.contains("40.00"),
            "{bronze}"
        );
        assert!(row_of(&l, "gold") < row_of(&l, "bronze"));
    }

    #[test]
    fn batch_frames_list_every_row() {
        let mut live = snapshot();
        live.volumes = (0..2000)
            .map(|i| volume(&format!("vol-{i:04}"), "gold", i as f32, 1.0, true))
            .collect();
        let text = batch_text(&view(Mode::Volumes, SortKey::Iops), &live);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + 1 + 2000);
        assert!(
            lines[2].starts_with("VOLUME") && lines[3].starts_with("vol-1999"),
            "{}",
            lines[3]
        );
        assert!(lines[2002].starts_with("vol-0000") && lines[2002].contains("gold"));
    }

    #[test]
    fn batch_columns_stay_aligned_with_long_names() {
        let mut live = snapshot();
        live.volumes = vec![
            volume(
                "a-volume-name-longer-than-24",
                "business-critical-2",
                5.0,
                1.0,
                true,
            ),
            volume("b", "gold", 3.0, 1.0, true),
        ];
        let text = batch_text(&view(Mode::Volumes, SortKey::Iops), &live);
        let lines: Vec<&str> = text.lines().skip(2).collect();
        let header = lines[0];
        // Every row's IOPS figure starts where the header's IOPS column does.
        let col = header.find("IOPS").unwrap();
        for row in &lines[1..] {
            let at = row.char_indices().nth(col).map(|(b, _)| b).unwrap();
            assert!(
                row[at..].starts_with('5') || row[at..].starts_with('3'),
                "{header}\n{row}"
            );
            assert!(row[..at].ends_with(' '), "{header}\n{row}");
        }
    }

    #[test]
    fn keys_switch_modes_sort_and_scroll() {
        let mut v = view(Mode::Volumes, SortKey::Iops);
        assert!(on_key(&mut v, KeyCode::Char('p'), 10));
        assert_eq!(v.mode, Mode::Policies);
        assert!(on_key(&mut v, KeyCode::Char('s'), 10));
        assert_eq!(v.sort, SortKey::Mbps);
        on_key(&mut v, KeyCode::Char('r'), 10);
        assert!(!v.descending);
        on_key(&mut v, KeyCode::PageDown, 10);
        on_key(&mut v, KeyCode::Up, 10);
        assert_eq!(v.offset, 9);
        assert!(!on_key(&mut v, KeyCode::Char('q'), 10));
        // Scrolling past the end still shows the last rows.
        let mut v = view(Mode::Volumes, SortKey::Name);
        v.offset = 100;
        let l = lines(&v);
        assert!(l.iter().any(|x| x.starts_with("idle")), "{l:#?}");
        // … and says where it began, which the view keeps: ↑ then moves at once
        // (the offset counted on past the end, and took as many presses back).
        let mut terminal = Terminal::new(ratatui::backend::TestBackend::new(150, 12)).unwrap();
        let mut shown = usize::MAX;
        terminal
            .draw(|f| shown = draw(f, &v, &snapshot(), None))
            .unwrap();
        assert_eq!(shown, 0, "the 4 rows fit");
    }
}
