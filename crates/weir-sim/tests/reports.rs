//! Reports people trust at a glance (issue 16, item 3): the shipped scenarios run
//! shortened and rendered, and the charts and text checked for what a reader sees —
//! the SVG's series, legends, axis titles and overlays, the text's header, width and
//! order.

use weir_report::{ScenarioReport, TextOptions, render_html, render_text};
use weir_sim::Scenario;

fn run(name: &str, scale: f64, case: Option<&str>) -> ScenarioReport {
    let mut s = Scenario::builtin(name)
        .expect("built-in")
        .unwrap_or_else(|e| panic!("{e}"));
    if let Some(c) = case {
        s.retain_cases(c);
    }
    s.scale_duration(scale);
    s.run(None, &mut |_| {})
}

/// `(caption, svg)` of every chart figure of the page.
fn figures(html: &str) -> Vec<(String, String)> {
    html.split("<figure><figcaption>")
        .skip(1)
        .filter_map(|f| {
            let (caption, rest) = f.split_once("</figcaption>")?;
            let svg = rest.split("</figure>").next()?;
            Some((caption.to_string(), svg.to_string()))
        })
        .collect()
}

/// The text of each legend item of a chart.
fn legend(svg: &str) -> Vec<String> {
    svg.split("<g class=\"legend-item\">")
        .skip(1)
        .filter_map(|item| {
            let text = item.split("<text").nth(1)?;
            let (_, rest) = text.split_once('>')?;
            Some(rest.split("</text>").next()?.to_string())
        })
        .collect()
}

fn axis_titles(svg: &str) -> Vec<String> {
    svg.split("class=\"axis-label\"")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split("</text>").next()?.to_string()))
        .collect()
}

#[test]
fn hba_sweep_charts_one_line_per_port_with_human_titles_and_the_seed_figures() {
    let report = run("hba-8g-vs-4g", 0.1, None);
    let html = render_html(&report);
    let figs = figures(&html);
    let (caption, mbps) = figs
        .iter()
        .find(|(c, _)| c.starts_with("Throughput vs block size"))
        .expect("a throughput chart against the block size");
    assert!(caption.contains("MB/s"), "{caption}");
    // One series per port: the 8 KB point is not split off into its own series.
    assert_eq!(mbps.matches("<g class=\"series\">").count(), 2, "{caption}");
    assert_eq!(
        legend(mbps),
        ["8g/eight-vms", "4g/eight-vms", "seed document&#39;s figure"]
    );
    for (_, svg) in figs.iter().filter(|(c, _)| c.contains(" vs block size")) {
        assert_eq!(svg.matches("<g class=\"series\">").count(), 2);
        // Six block sizes per series.
        assert_eq!(svg.matches("<circle").count(), 12);
        assert_eq!(axis_titles(svg)[0], "block size (KiB)");
        assert!(!svg.contains("block kib") && !svg.contains(">block_kib<"));
    }
    // The seed's total MB/s at 64 KB for each port and at 8 KB for 8 Gb: three
    // diamonds (and one in the legend), each citing 001 by title.
    assert_eq!(mbps.matches("class=\"seed-point\"").count(), 4);
    assert_eq!(
        mbps.matches("<title>total read MB/s").count(),
        3,
        "the seed points' tooltips"
    );
    assert!(mbps.contains("Lab Review: 8Gbps FC SAN Bolsters VOE"));
    // The one-VM figures (vm-1.mbps) are not the chart's total: not drawn on it.
    assert!(!mbps.contains("one VM&#39;s read MB/s"));
    assert!(!html.contains("MB/s vs block_kib"));
}

#[test]
fn time_charts_shade_the_warm_up_and_say_it_is_not_measured() {
    let report = run("qos-gate", 0.5, None);
    let case = &report.cases[0];
    assert!(case.warmup_s > 0.0, "qos-gate warms up");
    let html = render_html(&report);
    let time: Vec<(String, String)> = figures(&html)
        .into_iter()
        .filter(|(c, _)| c.contains(" over time"))
        .collect();
    assert!(!time.is_empty());
    let label = format!(
        "warm-up {} s, not measured",
        weir_report::fmt_number(case.warmup_s)
    );
    for (caption, svg) in &time {
        let band = svg
            .split("<g class=\"shade\">")
            .nth(1)
            .unwrap_or_else(|| panic!("{caption}: no warm-up band"));
        assert!(band.contains(&format!(">{label}</text>")), "{caption}");
    }
    // The legends name the VMs, not the chart's quantity again.
    let (_, mbps) = time
        .iter()
        .find(|(c, _)| c.starts_with("Throughput"))
        .expect("throughput over time");
    assert!(
        legend(mbps).iter().all(|l| !l.ends_with("MB/s")),
        "{:?}",
        legend(mbps)
    );
}

#[test]
fn app_profiles_has_a_chart_across_the_nine_profiles() {
    let report = run("app-profiles", 0.05, None);
    let html = render_html(&report);
    assert!(html.contains("<h2>Across the cases</h2>"));
    let figs = figures(&html);
    let (_, iops) = figs
        .iter()
        .find(|(c, _)| c.starts_with("I/O rate per case"))
        .expect("IOPS across the profiles");
    // Every profile labels its bars (the long names in full in their tooltip).
    for profile in [
        "oltp",
        "dss",
        "db-logging",
        "hpc-random",
        "hpc-sequential",
        "video-surveillance",
        "hadoop",
        "vdi-boot",
        "vdi-steady",
    ] {
        assert!(
            iops.contains(&format!("<title>{profile}</title>")),
            "{profile}"
        );
    }
    // Weir's bars and the seed's (002's OLTP 3,300 IOPS) side by side.
    assert_eq!(legend(iops), ["Weir", "seed document"]);
    assert!(
        iops.contains("oltp · seed document: 3,300 IOPS"),
        "the seed bar's tooltip"
    );
    assert_eq!(iops.matches(" · seed document: ").count(), 1, "OLTP only");
}

#[test]
fn sources_are_cited_by_title_and_unmeasured_figures_are_counted() {
    let report = run("sioc-shares", 0.1, None);
    let html = render_html(&report);
    let title = "Intel Cloud Builders Guide: Storage I/O Control";
    assert!(html.contains(&format!("<td class=\"src\">{title}")));
    let text = render_text(&report, &TextOptions::default());
    assert!(
        text.lines().take(8).any(|l| l.contains(title)),
        "the header names the document"
    );
    // At a tenth of its length mixed-workload never reaches its storm and Login VSI
    // windows: the header says how many figures were not measured.
    let report = run("mixed-workload", 0.1, Some("qos-on"));
    let unmeasured = report.cases[0]
        .comparisons
        .iter()
        .filter(|c| c.counts() && c.not_measured())
        .count();
    assert!(unmeasured > 0);
    let text = render_text(&report, &TextOptions::default());
    let header: Vec<&str> = text.lines().take(6).collect();
    assert!(
        header
            .iter()
            .any(|l| l.contains(&format!("{unmeasured} not measured in this run"))),
        "{header:#?}"
    );
    let html = render_html(&report);
    assert!(html.contains("predictions not measured in this run"));
}

#[test]
fn raid_characterization_fits_the_width_and_puts_the_summary_first() {
    let report = run("raid-characterization", 0.05, None);
    let width = 100;
    let text = render_text(
        &report,
        &TextOptions {
            width: Some(width),
            ..Default::default()
        },
    );
    let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= width, "a line of {widest} columns");
    // The summary (one line per case) comes before the first case.
    let summary = text.find("Summary (sweep over").expect("summary");
    let first_case = text.find("━━ Case 1/").expect("cases");
    assert!(summary < first_case);
    let lines_before = text[..summary].lines().count();
    assert!(lines_before < 10, "{lines_before} lines before the summary");
    // Case names stay whole in the summary.
    assert!(text[summary..first_case].contains("seq-read/raid0/15k/block_kib=4096"));
    // --summary: the summary and the seed figures only.
    let short = render_text(
        &report,
        &TextOptions {
            summary: true,
            width: Some(width),
            ..Default::default()
        },
    );
    assert!(!short.contains("━━ Case"));
    assert!(short.lines().count() < report.cases.len() + 40);
    assert!(short.contains("Weir vs seed: predictions, every case"));
    assert!(short.contains(
        "Calibrations (seed figures a parameter was fitted on; not counted), every case"
    ));
    assert!(short.lines().all(|l| l.chars().count() <= width));
}
