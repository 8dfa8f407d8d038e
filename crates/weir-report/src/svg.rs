//! Small inline-SVG chart helpers: line charts (linear or log2 x axis), paired bars
//! (Weir beside seed), utilisation bars. Everything is text in, SVG text out; no
//! scripts, no external resources. Non-finite values never reach a coordinate.

use crate::format::{fmt_param, fmt_pct, fmt_ratio, fmt_thousands};
use std::fmt::Write as _;

/// Series colours (Tableau 10, readable on white and for most colour-blind readers).
pub(crate) const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
pub(crate) const GOOD: &str = "#59a14f";
pub(crate) const WARN: &str = "#f28e2b";
pub(crate) const BAD: &str = "#e15759";
/// "Fair" of the user-experience grades (dark text on it).
pub(crate) const AMBER: &str = "#f0b429";
const WEIR_COLOUR: &str = "#4e79a7";
const SEED_COLOUR: &str = "#a5a09b";
/// Colour and dash pattern of series `index`: past the palette, lines are dashed so
/// that series 0 and 10 stay apart.
fn series_stroke(index: usize) -> (&'static str, &'static str) {
    let colour = PALETTE[index % PALETTE.len()];
    let dash = match (index / PALETTE.len()) % 3 {
        0 => "",
        1 => " stroke-dasharray=\"7 4\"",
        _ => " stroke-dasharray=\"2 3\"",
    };
    (colour, dash)
}

/// Rough width of one character of the 12 px chart font, for layout.
const CHAR_PX: f64 = 6.6;

/// Escapes text for HTML and SVG (element content and attribute values).
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `text` cut to `max_chars` with an ellipsis.
pub(crate) fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max_chars.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

fn px(v: f64) -> String {
    format!("{v:.1}")
}

/// A step of 1, 2, 2.5 or 5 × 10^k giving about `target` intervals over `range`.
fn nice_step(range: f64, target: usize) -> f64 {
    let raw = range / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let normalised = raw / magnitude;
    let nice = if normalised <= 1.0 {
        1.0
    } else if normalised <= 2.0 {
        2.0
    } else if normalised <= 2.5 {
        2.5
    } else if normalised <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// Axis domain and ticks covering `[min, max]` (both finite).
pub(crate) fn linear_ticks(min: f64, max: f64, target: usize) -> (f64, f64, Vec<f64>, f64) {
    let (min, max) = if max > min {
        (min, max)
    } else if min == 0.0 {
        (0.0, 1.0)
    } else {
        let pad = min.abs() * 0.5;
        (min - pad, max + pad)
    };
    let step = nice_step(max - min, target);
    let lo = (min / step).floor() * step;
    let hi = (max / step).ceil() * step;
    let count = ((hi - lo) / step).round() as usize;
    let ticks = (0..=count.min(100)).map(|i| lo + step * i as f64).collect();
    (lo, hi, ticks, step)
}

/// Tick label: thousands as `k`, millions as `M` (decided by the axis' largest
/// magnitude so all labels of an axis agree), decimals from the tick step.
pub(crate) fn tick_label(value: f64, step: f64, axis_max_abs: f64) -> String {
    let (divisor, suffix) = if axis_max_abs >= 1e6 {
        (1e6, "M")
    } else if axis_max_abs >= 1e4 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let scaled_step = step / divisor;
    // As many decimals as the step needs (2.5k → 1, 0.25 → 2), at most 6.
    let decimals = (0..=6usize)
        .find(|&d| {
            let scaled = scaled_step * 10f64.powi(d as i32);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.abs().max(1.0)
        })
        .unwrap_or(6);
    let value = value / divisor;
    // Zero reads best bare ("0", not "0k" or "-0" from floating error).
    if value.abs() < scaled_step * 1e-9 {
        return "0".to_string();
    }
    format!("{}{suffix}", fmt_thousands(value, decimals))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XScale {
    Linear,
    Log2,
}

pub(crate) struct LineSeries {
    pub name: String,
    /// (x, y); points with a non-finite coordinate break the line.
    pub points: Vec<(f64, f64)>,
}

pub(crate) struct LineChart {
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<LineSeries>,
    pub x_scale: XScale,
    /// Put x ticks exactly at the data's x values (sweeps with few distinct values).
    pub ticks_at_data: bool,
    /// Include y = 0 in the axis (throughput, latency).
    pub y_from_zero: bool,
    /// Tooltip format for x values (e.g. `t=12 s` or `block_kib=64`).
    pub x_name: String,
    /// The seed documents' figures drawn over the lines (hollow diamonds in their
    /// series' colour).
    pub seeds: Vec<SeedPoint>,
    /// An x range shaded and labelled (the warm-up, which the figures leave out).
    pub shade: Option<Shade>,
}

/// A seed document's figure at `(x, y)` beside series `series` of a [`LineChart`].
pub(crate) struct SeedPoint {
    pub series: usize,
    pub x: f64,
    pub y: f64,
    /// Tooltip: what the figure is and where it comes from.
    pub label: String,
}

/// An x range of a [`LineChart`] drawn as a grey band with a label.
pub(crate) struct Shade {
    pub from: f64,
    pub to: f64,
    pub label: String,
}

/// Series with exactly the same points drawn once, named together (`a = b`), so that
/// none hides under another. Returns the series and, per input series, its index in
/// the output.
fn merge_identical(series: &[LineSeries]) -> (Vec<LineSeries>, Vec<usize>) {
    let same = |a: &[(f64, f64)], b: &[(f64, f64)]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(p, q)| p.0.to_bits() == q.0.to_bits() && p.1.to_bits() == q.1.to_bits())
    };
    let mut out: Vec<LineSeries> = Vec::new();
    let mut index = Vec::with_capacity(series.len());
    for s in series {
        match out.iter_mut().position(|o| same(&o.points, &s.points)) {
            Some(i) => {
                out[i].name = format!("{} = {}", out[i].name, s.name);
                index.push(i);
            }
            None => {
                out.push(LineSeries {
                    name: s.name.clone(),
                    points: s.points.clone(),
                });
                index.push(out.len() - 1);
            }
        }
    }
    (out, index)
}

const CHART_W: f64 = 600.0;
const PLOT_LEFT: f64 = 74.0;
const PLOT_RIGHT: f64 = 18.0;
const PLOT_TOP: f64 = 14.0;
const PLOT_H: f64 = 220.0;

fn no_data_svg(width: f64, height: f64, message: &str) -> String {
    let mut svg = String::new();
    open_svg(&mut svg, "chart", px(width), height);
    let _ = write!(
        svg,
        "<rect x=\"0.5\" y=\"0.5\" width=\"{w1}\" \
         height=\"{h1}\" rx=\"6\" fill=\"#fafafa\" stroke=\"#e3e3e3\"/><text x=\"{cx}\" \
         y=\"{cy}\" text-anchor=\"middle\" class=\"muted\">{msg}</text></svg>",
        w1 = px(width - 1.0),
        h1 = px(height - 1.0),
        cx = px(width / 2.0),
        cy = px(height / 2.0),
        msg = esc(message)
    );
    svg
}

/// Writes the opening `<svg>` tag. `width` is written as given: the plot charts pass
/// it through [`px`] (`600.0`), the bar charts as a bare number (`1140`).
fn open_svg(svg: &mut String, class: &str, width: impl std::fmt::Display, height: f64) {
    let _ = write!(
        svg,
        "<svg class=\"{class}\" viewBox=\"0 0 {width} {h}\" width=\"{width}\" height=\"{h}\" \
         role=\"img\" xmlns=\"http://www.w3.org/2000/svg\">",
        h = px(height)
    );
}

/// The y axis of a plot (line chart, grouped bars): a nice linear domain over
/// `[min, max]` mapped onto the plot's height.
struct YAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    step: f64,
    /// The larger magnitude of the domain's ends: the labels' unit suffix.
    max_abs: f64,
}

impl YAxis {
    fn new(min: f64, max: f64) -> YAxis {
        let (lo, hi, ticks, step) = linear_ticks(min, max, 5);
        YAxis {
            lo,
            hi,
            ticks,
            step,
            max_abs: lo.abs().max(hi.abs()),
        }
    }

    /// Pixel row of value `y`.
    fn px_of(&self, y: f64) -> f64 {
        PLOT_TOP + PLOT_H - (y - self.lo) / (self.hi - self.lo) * PLOT_H
    }

    /// Horizontal grid lines with their tick labels.
    fn write_grid(&self, svg: &mut String) {
        for &t in &self.ticks {
            let y = self.px_of(t);
            let _ = write!(
                svg,
                "<line class=\"grid\" x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\"/>\
                 <text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                px(PLOT_LEFT),
                px(CHART_W - PLOT_RIGHT),
                px(PLOT_LEFT - 8.0),
                px(y + 4.0),
                esc(&tick_label(t, self.step, self.max_abs)),
                y = px(y)
            );
        }
    }
}

/// The axis lines of a plot (the x axis at pixel row `x_axis_y`), the x axis label
/// when there is one, and the rotated y axis label.
fn write_axes(svg: &mut String, x_axis_y: f64, x_label: Option<&str>, y_label: &str) {
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\"/>\
         <line class=\"axis\" x1=\"{l}\" y1=\"{z}\" x2=\"{r}\" y2=\"{z}\"/>",
        l = px(PLOT_LEFT),
        t = px(PLOT_TOP),
        b = px(PLOT_TOP + PLOT_H),
        z = px(x_axis_y),
        r = px(CHART_W - PLOT_RIGHT),
    );
    if let Some(x_label) = x_label {
        let _ = write!(
            svg,
            "<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            px(PLOT_LEFT + (CHART_W - PLOT_LEFT - PLOT_RIGHT) / 2.0),
            px(PLOT_TOP + PLOT_H + 38.0),
            esc(x_label)
        );
    }
    let _ = write!(
        svg,
        "<text class=\"axis-label\" transform=\"translate(16 {}) rotate(-90)\" \
         text-anchor=\"middle\">{}</text>",
        px(PLOT_TOP + PLOT_H / 2.0),
        esc(y_label)
    );
}

/// How a legend item starts: the swatch's width in the item's width, and where the
/// name's text begins after the item's left edge.
struct LegendSwatch {
    item_px: f64,
    text_dx: f64,
}

/// Legend items in rows from `top` under a plot, wrapping at the chart's width. Item
/// `i` gets the swatch `swatch(legend, i, x, y)` writes (y is the text's baseline) and
/// its name, cut to 40 characters. Returns the items' SVG and the baseline of the last
/// row.
fn wrapped_legend<'a>(
    names: impl Iterator<Item = &'a str>,
    top: f64,
    layout: LegendSwatch,
    swatch: impl Fn(&mut String, usize, f64, f64),
) -> (String, f64) {
    let mut legend = String::new();
    let (mut lx, mut ly) = (PLOT_LEFT, top);
    for (i, name) in names.enumerate() {
        let label = truncate(name, 40);
        let item_w = layout.item_px + label.chars().count() as f64 * CHAR_PX + 18.0;
        if lx + item_w > CHART_W && lx > PLOT_LEFT {
            lx = PLOT_LEFT;
            ly += 18.0;
        }
        legend.push_str("<g class=\"legend-item\">");
        swatch(&mut legend, i, lx, ly);
        let _ = write!(
            legend,
            "<text x=\"{}\" y=\"{}\">{}</text></g>",
            px(lx + layout.text_dx),
            px(ly),
            esc(&label)
        );
        lx += item_w;
    }
    (legend, ly)
}

/// A bar chart's row label, right-aligned at `x_end`, cut to `max_chars` with the
/// full text as its tooltip.
fn write_bar_label(svg: &mut String, x_end: f64, baseline_y: f64, text: &str, max_chars: usize) {
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"bar-label\"><title>{}</title>{}</text>",
        px(x_end),
        px(baseline_y),
        esc(text),
        esc(&truncate(text, max_chars))
    );
}

/// Geometry of a chart of horizontal bars: one row per item under a header band.
struct RowLayout {
    width: f64,
    /// Where the right-aligned row labels end.
    label_end: f64,
    bar_x: f64,
    /// A full bar's length.
    bar_w: f64,
    row_h: f64,
    /// The first row's top.
    top: f64,
}

impl RowLayout {
    /// Top of row `row` (of the space under the last row when `row` is the count).
    fn row_y(&self, row: usize) -> f64 {
        self.top + self.row_h * row as f64
    }

    /// The opening `<svg>` tag for `rows` rows and `margin_px` under them.
    fn open(&self, class: &str, rows: usize, margin_px: f64) -> String {
        let mut svg = String::new();
        open_svg(&mut svg, class, self.width, self.row_y(rows) + margin_px);
        svg
    }
}

/// Vertical grid lines at 0, 25, 50, 75 and 100 % of a bar `bar_w` wide from `bar_x`,
/// from `top_y` down to `bottom`, labelled under it.
fn write_percent_grid(svg: &mut String, bar_x: f64, bar_w: f64, top_y: f64, bottom: f64) {
    for q in 0..=4 {
        let x = bar_x + bar_w * q as f64 / 4.0;
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\
             <text class=\"tick\" x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}%</text>",
            px(top_y),
            px(bottom),
            px(bottom + 15.0),
            q * 25,
            x = px(x)
        );
    }
}

impl LineChart {
    fn x_value(&self, x: f64) -> Option<f64> {
        match self.x_scale {
            XScale::Linear if x.is_finite() => Some(x),
            XScale::Log2 if x.is_finite() && x > 0.0 => Some(x.log2()),
            _ => None,
        }
    }

    pub fn render(&self) -> String {
        let (series, index) = merge_identical(&self.series);
        let seeds: Vec<(usize, f64, f64, &str)> = self
            .seeds
            .iter()
            .filter(|p| p.series < index.len() && p.y.is_finite())
            .filter_map(|p| Some((index[p.series], self.x_value(p.x)?, p.y, p.label.as_str())))
            .collect();
        let usable: Vec<(usize, f64, f64)> = series
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                s.points
                    .iter()
                    .filter_map(move |&(x, y)| Some((i, self.x_value(x)?, y)))
                    .filter(|(_, _, y)| y.is_finite())
            })
            .chain(seeds.iter().map(|p| (p.0, p.1, p.2)))
            .collect();
        if usable.is_empty() {
            return no_data_svg(CHART_W, 120.0, "no data");
        }
        let fold = |f: fn(&(usize, f64, f64)) -> f64| {
            usable
                .iter()
                .map(f)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                })
        };
        let (x_min, x_max) = fold(|p| p.1);
        let (mut y_min, mut y_max) = fold(|p| p.2);
        if self.y_from_zero {
            y_min = y_min.min(0.0);
            y_max = y_max.max(0.0);
        }
        let mut data_xs: Vec<f64> = usable.iter().map(|p| p.1).collect();
        data_xs.sort_by(f64::total_cmp);
        data_xs.dedup();
        let (x_lo, x_hi, x_ticks) = self.x_domain(&data_xs, x_min, x_max);
        let frame = Frame {
            x_lo,
            x_hi,
            y_axis: YAxis::new(y_min, y_max),
        };
        let (legend, height) = line_legend(&series, !seeds.is_empty());

        let mut svg = String::new();
        open_svg(&mut svg, "chart", px(CHART_W), height);
        self.write_shade(&mut svg, &frame);
        frame.y_axis.write_grid(&mut svg);
        write_x_ticks(&mut svg, &frame, &x_ticks);
        write_axes(
            &mut svg,
            PLOT_TOP + PLOT_H,
            Some(&self.x_label),
            &self.y_label,
        );
        for (i, s) in series.iter().enumerate() {
            self.write_series(&mut svg, &frame, i, s);
        }
        if !seeds.is_empty() {
            svg.push_str("<g class=\"seeds\">");
            for &(i, x, y, label) in &seeds {
                svg.push_str(&diamond(
                    frame.sx(x),
                    frame.sy(y),
                    series_stroke(i).0,
                    label,
                ));
            }
            svg.push_str("</g>");
        }
        svg.push_str(&legend);
        svg.push_str("</svg>");
        svg
    }

    /// The x domain and its ticks (in transformed units) with their labels: at the
    /// data's x values when asked and there are at most 12, powers of two on a log
    /// scale, else round linear steps.
    fn x_domain(&self, data_xs: &[f64], x_min: f64, x_max: f64) -> (f64, f64, Vec<(f64, String)>) {
        let untransform = |v: f64| match self.x_scale {
            XScale::Linear => v,
            XScale::Log2 => v.exp2(),
        };
        if self.ticks_at_data && data_xs.len() <= 12 {
            let (lo, hi) = if x_max > x_min {
                let pad = (x_max - x_min) * 0.04;
                (x_min - pad, x_max + pad)
            } else {
                (x_min - 1.0, x_max + 1.0)
            };
            let ticks = data_xs
                .iter()
                .map(|&v| (v, fmt_param(untransform(v))))
                .collect();
            (lo, hi, ticks)
        } else if self.x_scale == XScale::Log2 {
            let lo = x_min.floor();
            let hi = x_max.ceil().max(lo + 1.0);
            let stride = (((hi - lo) / 8.0).ceil() as i64).max(1);
            let ticks = (lo as i64..=hi as i64)
                .step_by(stride as usize)
                .map(|e| (e as f64, fmt_param((e as f64).exp2())))
                .collect();
            (lo, hi, ticks)
        } else {
            let (lo, hi, ticks, step) = linear_ticks(x_min, x_max, 6);
            let abs = lo.abs().max(hi.abs());
            let ticks = ticks
                .into_iter()
                .map(|t| (t, tick_label(t, step, abs)))
                .collect();
            (lo, hi, ticks)
        }
    }

    /// The shaded x range (e.g. the warm-up), clipped to the domain, with its label.
    fn write_shade(&self, svg: &mut String, frame: &Frame) {
        let Some(shade) = &self.shade else {
            return;
        };
        let (a, b) = (
            self.x_value(shade.from).map(|v| v.max(frame.x_lo)),
            self.x_value(shade.to).map(|v| v.min(frame.x_hi)),
        );
        if let (Some(a), Some(b)) = (a, b)
            && b > a
        {
            let _ = write!(
                svg,
                "<g class=\"shade\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" \
                 fill=\"#eceff3\"><title>{label}</title></rect><text class=\"muted\" x=\"{}\" \
                 y=\"{}\">{label}</text></g>",
                px(frame.sx(a)),
                px(PLOT_TOP),
                px(frame.sx(b) - frame.sx(a)),
                px(PLOT_H),
                px(frame.sx(a) + 4.0),
                px(PLOT_TOP + 12.0),
                label = esc(&shade.label)
            );
        }
    }

    /// One series: its line (broken at non-finite points) and, for at most 40
    /// points, a marker with a tooltip at each.
    fn write_series(&self, svg: &mut String, frame: &Frame, i: usize, s: &LineSeries) {
        let (colour, dash) = series_stroke(i);
        let mut path = String::new();
        let mut pen_down = false;
        let mut markers = String::new();
        let finite_points = s
            .points
            .iter()
            .filter(|(x, y)| self.x_value(*x).is_some() && y.is_finite())
            .count();
        let draw_markers = finite_points <= 40;
        for &(x_raw, y) in &s.points {
            let Some(x) = self.x_value(x_raw).filter(|_| y.is_finite()) else {
                pen_down = false;
                continue;
            };
            let (px_x, px_y) = (frame.sx(x), frame.sy(y));
            let _ = write!(
                path,
                "{}{} {} ",
                if pen_down { "L" } else { "M" },
                px(px_x),
                px(px_y)
            );
            pen_down = true;
            if draw_markers {
                let _ = write!(
                    markers,
                    "<circle cx=\"{}\" cy=\"{}\" r=\"3.2\" fill=\"{colour}\"><title>{}: {} → {}</title></circle>",
                    px(px_x),
                    px(px_y),
                    esc(&s.name),
                    esc(&format!("{} {}", self.x_name, fmt_param(x_raw))),
                    esc(&format!(
                        "{} {}",
                        fmt_thousands(y, if y.abs() >= 100.0 { 0 } else { 2 }),
                        self.y_label
                    ))
                );
            }
        }
        let _ = write!(
            svg,
            "<g class=\"series\"><path d=\"{}\" fill=\"none\" stroke=\"{colour}\" \
             stroke-width=\"2.2\" stroke-linejoin=\"round\" stroke-linecap=\"round\"{dash}/>{markers}</g>",
            path.trim_end()
        );
    }
}

/// A line chart's plot area: its x domain (transformed units) and y axis, and
/// their mapping to pixels.
struct Frame {
    x_lo: f64,
    x_hi: f64,
    y_axis: YAxis,
}

impl Frame {
    fn sx(&self, x: f64) -> f64 {
        let plot_w = CHART_W - PLOT_LEFT - PLOT_RIGHT;
        PLOT_LEFT + (x - self.x_lo) / (self.x_hi - self.x_lo) * plot_w
    }

    fn sy(&self, y: f64) -> f64 {
        self.y_axis.px_of(y)
    }
}

/// The x ticks and their labels, a label left out where it would overlap the
/// previous one.
fn write_x_ticks(svg: &mut String, frame: &Frame, x_ticks: &[(f64, String)]) {
    let bottom = PLOT_TOP + PLOT_H;
    let mut last_label_end = f64::NEG_INFINITY;
    for (t, label) in x_ticks {
        let x = frame.sx(*t);
        let _ = write!(
            svg,
            "<line class=\"axis\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>",
            px(bottom),
            px(bottom + 5.0),
            x = px(x)
        );
        let half = label.chars().count() as f64 * CHAR_PX / 2.0;
        if x - half > last_label_end + 4.0 {
            let _ = write!(
                svg,
                "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                px(x),
                px(bottom + 18.0),
                esc(label)
            );
            last_label_end = x + half;
        }
    }
}

/// A line chart's legend (wrapping rows under the x axis label; the seed
/// figures' marker last), and the chart's height with it. None for one unnamed
/// series without seed figures.
fn line_legend(series: &[LineSeries], with_seeds: bool) -> (String, f64) {
    let legend_top = PLOT_TOP + PLOT_H + 58.0;
    let show_legend = series.len() > 1 || !series[0].name.is_empty() || with_seeds;
    if !show_legend {
        return (String::new(), legend_top - 8.0);
    }
    let names = series
        .iter()
        .map(|s| s.name.as_str())
        .chain(with_seeds.then_some("seed document's figure"));
    let n_series = series.len();
    let (legend, last_row_y) = wrapped_legend(
        names,
        legend_top,
        LegendSwatch {
            item_px: 26.0,
            text_dx: 24.0,
        },
        |legend, i, x, y| {
            if i == n_series {
                legend.push_str(&diamond(x + 9.0, y - 4.0, "#374151", ""));
                return;
            }
            let (colour, dash) = series_stroke(i);
            let _ = write!(
                legend,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{colour}\" \
                 stroke-width=\"3\"{dash}/>",
                px(x),
                px(y - 4.0),
                px(x + 18.0),
                px(y - 4.0),
            );
        },
    );
    (legend, last_row_y + 10.0)
}

/// A hollow diamond (a seed document's figure) centred at `(x, y)`, with a tooltip.
fn diamond(x: f64, y: f64, colour: &str, title: &str) -> String {
    let r = 5.5;
    let mut out = format!(
        "<path class=\"seed-point\" d=\"M{} {}L{} {}L{} {}L{} {}Z\" fill=\"#fff\" \
         stroke=\"{colour}\" stroke-width=\"2\">",
        px(x),
        px(y - r),
        px(x + r),
        px(y),
        px(x),
        px(y + r),
        px(x - r),
        px(y)
    );
    if !title.is_empty() {
        let _ = write!(out, "<title>{}</title>", esc(title));
    }
    out.push_str("</path>");
    out
}

/// One Weir-vs-seed pair for [`paired_bars`].
pub(crate) struct Pair<'a> {
    pub label: &'a str,
    pub weir: f64,
    pub seed: f64,
    pub ratio: f64,
    pub differs: bool,
    pub weir_text: String,
    pub seed_text: String,
}

/// Horizontal paired bars, each pair scaled to its own larger figure, with a ratio
/// badge (green within ±20%, red beyond).
pub(crate) fn paired_bars(pairs: &[Pair<'_>]) -> String {
    const L: RowLayout = RowLayout {
        width: 1140.0,
        label_end: 330.0,
        bar_x: 342.0,
        bar_w: 600.0,
        row_h: 48.0,
        top: 30.0,
    };
    const W: f64 = L.width;
    const BAR_X: f64 = L.bar_x;
    const ROW_H: f64 = L.row_h;
    if pairs.is_empty() {
        return no_data_svg(W, 80.0, "no comparisons");
    }
    let mut svg = L.open("chart bars", pairs.len(), 6.0);
    let _ = write!(
        svg,
        "<rect x=\"{BAR_X}\" y=\"6\" width=\"12\" height=\"12\" rx=\"2\" fill=\"{WEIR_COLOUR}\"/>\
         <text x=\"{}\" y=\"16\">Weir</text>\
         <rect x=\"{}\" y=\"6\" width=\"12\" height=\"12\" rx=\"2\" fill=\"{SEED_COLOUR}\"/>\
         <text x=\"{}\" y=\"16\">seed document</text>\
         <text class=\"muted\" x=\"{}\" y=\"16\">each pair scaled to its larger figure</text>\
         <text class=\"muted\" x=\"{}\" y=\"16\" text-anchor=\"middle\">Weir / seed</text>",
        px(BAR_X + 17.0),
        px(BAR_X + 64.0),
        px(BAR_X + 81.0),
        px(BAR_X + 190.0),
        px(W - 50.0),
    );
    for (i, p) in pairs.iter().enumerate() {
        let y = L.row_y(i);
        if i % 2 == 1 {
            let _ = write!(
                svg,
                "<rect x=\"0\" y=\"{}\" width=\"{W}\" height=\"{ROW_H}\" fill=\"#f7f8fa\"/>",
                px(y)
            );
        }
        write_bar_label(&mut svg, L.label_end, y + ROW_H / 2.0 + 4.0, p.label, 44);
        let scale = [p.weir, p.seed]
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
        for (j, (value, text, colour)) in [
            (p.weir, &p.weir_text, WEIR_COLOUR),
            (p.seed, &p.seed_text, SEED_COLOUR),
        ]
        .into_iter()
        .enumerate()
        {
            let bar_y = y + 7.0 + j as f64 * 18.0;
            let len = if value.is_finite() && scale > 0.0 {
                (value.max(0.0) / scale * L.bar_w).max(if value > 0.0 { 1.5 } else { 0.0 })
            } else {
                0.0
            };
            let _ = write!(
                svg,
                "<rect x=\"{BAR_X}\" y=\"{}\" width=\"{}\" height=\"15\" rx=\"3\" fill=\"{colour}\"/>\
                 <text class=\"bar-value\" x=\"{}\" y=\"{}\">{}</text>",
                px(bar_y),
                px(len),
                px(BAR_X + len + 6.0),
                px(bar_y + 12.0),
                esc(text)
            );
        }
        let badge = if p.differs { BAD } else { GOOD };
        let _ = write!(
            svg,
            "<rect x=\"{}\" y=\"{}\" width=\"84\" height=\"24\" rx=\"12\" fill=\"{badge}\" \
             fill-opacity=\"0.14\" stroke=\"{badge}\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"badge-text\" fill=\"{badge}\">{}{}</text>",
            px(W - 92.0),
            px(y + ROW_H / 2.0 - 12.0),
            px(W - 50.0),
            px(y + ROW_H / 2.0 + 4.5),
            esc(&fmt_ratio(p.ratio)),
            if p.differs { " ⚠" } else { "" }
        );
    }
    svg.push_str("</svg>");
    svg
}

pub(crate) fn utilisation_colour(fraction: f64) -> &'static str {
    match fraction {
        f if !f.is_finite() => "#bab0ac",
        f if f >= 0.9 => BAD,
        f if f >= 0.7 => WARN,
        _ => GOOD,
    }
}

/// Horizontal 0–100 % bars, one per (label, kind, busy fraction).
pub(crate) fn utilisation_bars(rows: &[(&str, &str, f64)]) -> String {
    const L: RowLayout = RowLayout {
        width: 1140.0,
        label_end: 300.0,
        bar_x: 312.0,
        bar_w: 740.0,
        row_h: 26.0,
        top: 8.0,
    };
    const BAR_X: f64 = L.bar_x;
    const BAR_W: f64 = L.bar_w;
    if rows.is_empty() {
        return no_data_svg(L.width, 80.0, "no components");
    }
    let mut svg = L.open("chart bars", rows.len(), 22.0);
    write_percent_grid(&mut svg, BAR_X, BAR_W, L.top, L.row_y(rows.len()));
    for (i, (label, kind, fraction)) in rows.iter().enumerate() {
        let y = L.row_y(i);
        let colour = utilisation_colour(*fraction);
        let len = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0) * BAR_W
        } else {
            0.0
        };
        let full = if kind.is_empty() {
            label.to_string()
        } else {
            format!("{label} ({kind})")
        };
        write_bar_label(&mut svg, L.label_end, y + 17.0, &full, 38);
        let _ = write!(
            svg,
            "<rect x=\"{BAR_X}\" y=\"{}\" width=\"{BAR_W}\" height=\"16\" rx=\"3\" fill=\"#eef0f3\"/>\
             <rect x=\"{BAR_X}\" y=\"{}\" width=\"{}\" height=\"16\" rx=\"3\" fill=\"{colour}\"/>\
             <text class=\"bar-value\" x=\"{}\" y=\"{}\">{}</text>",
            px(y + 5.0),
            px(y + 5.0),
            px(len),
            px(BAR_X + BAR_W + 8.0),
            px(y + 17.0),
            esc(&fmt_pct(*fraction))
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One coloured part of a [`ShareRow`].
pub(crate) struct Segment {
    pub label: String,
    pub value: f64,
    pub colour: &'static str,
}

/// One horizontal 100 % bar: its label, segments (drawn as shares of their sum) and a
/// note on the right.
pub(crate) struct ShareRow {
    pub label: String,
    pub segments: Vec<Segment>,
    pub note: String,
}

/// Horizontal stacked 100 % bars (user-experience grades, random vs sequential), with
/// a legend of the segment labels of the first row. Rows whose segments are all zero
/// or not finite show "no data".
/// `wide` draws across a card (1140 px); otherwise it fits half a card (600 px).
pub(crate) fn share_bars(rows: &[ShareRow], wide: bool) -> String {
    let (width, label_end, bar_x, bar_w) = if wide {
        (1140.0, 300.0, 312.0, 600.0)
    } else {
        (600.0, 62.0, 72.0, 380.0)
    };
    let l = RowLayout {
        width,
        label_end,
        bar_x,
        bar_w,
        row_h: 30.0,
        top: 30.0,
    };
    if rows.is_empty() {
        return no_data_svg(l.width, 80.0, "no data");
    }
    let class = if wide { "chart bars" } else { "chart" };
    let mut svg = l.open(class, rows.len(), 20.0);
    // Legend: the segments of the first row.
    let mut lx = bar_x;
    for seg in &rows[0].segments {
        let _ = write!(
            svg,
            "<g class=\"legend-item\"><rect x=\"{}\" y=\"6\" width=\"12\" height=\"12\" rx=\"2\" \
             fill=\"{}\"/><text x=\"{}\" y=\"16\">{}</text></g>",
            px(lx),
            seg.colour,
            px(lx + 17.0),
            esc(&seg.label)
        );
        lx += 30.0 + seg.label.chars().count() as f64 * CHAR_PX;
    }
    write_percent_grid(&mut svg, bar_x, bar_w, l.top - 2.0, l.row_y(rows.len()));
    for (i, row) in rows.iter().enumerate() {
        let y = l.row_y(i);
        let max_chars = if wide { 42 } else { 9 };
        write_bar_label(&mut svg, l.label_end, y + 19.0, &row.label, max_chars);
        let clean: Vec<f64> = row
            .segments
            .iter()
            .map(|s| {
                if s.value.is_finite() && s.value > 0.0 {
                    s.value
                } else {
                    0.0
                }
            })
            .collect();
        let sum: f64 = clean.iter().sum();
        if sum <= 0.0 {
            let _ = write!(
                svg,
                "<rect x=\"{bar_x}\" y=\"{}\" width=\"{bar_w}\" height=\"20\" rx=\"3\" fill=\"#f3f4f6\"/>\
                 <text class=\"muted\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>",
                px(y + 5.0),
                px(bar_x + bar_w / 2.0),
                px(y + 19.0)
            );
        } else {
            let mut x = bar_x;
            for (seg, value) in row.segments.iter().zip(&clean) {
                if *value <= 0.0 {
                    continue;
                }
                let share = value / sum;
                let w = share * bar_w;
                let text = format!("{}%", fmt_thousands(share * 100.0, 0));
                let _ = write!(
                    svg,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"20\" fill=\"{}\"><title>{}: {}%</title></rect>",
                    px(x),
                    px(y + 5.0),
                    px(w),
                    seg.colour,
                    esc(&format!("{} · {}", row.label, seg.label)),
                    esc(&fmt_thousands(share * 100.0, 1))
                );
                if w >= text.chars().count() as f64 * CHAR_PX + 8.0 {
                    let _ = write!(
                        svg,
                        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\" \
                         font-weight=\"600\" font-size=\"12\">{}</text>",
                        px(x + w / 2.0),
                        px(y + 19.5),
                        if seg.colour == AMBER {
                            "#3d2e00"
                        } else {
                            "#fff"
                        },
                        esc(&text)
                    );
                }
                x += w;
            }
        }
        let _ = write!(
            svg,
            "<text class=\"bar-value\" x=\"{}\" y=\"{}\">{}</text>",
            px(bar_x + bar_w + 12.0),
            px(y + 19.0),
            esc(&truncate(&row.note, if wide { 36 } else { 20 }))
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One series of a [`grouped_bars`] chart: one value per group.
pub(crate) struct BarSeries {
    pub name: String,
    pub colour: &'static str,
    pub values: Vec<f64>,
    /// Tooltip text per value (the formatted figure with its unit).
    pub tooltips: Vec<String>,
}

/// Vertical bars, one group per entry of `groups` (windows, size buckets), one bar per
/// series inside each group, y from zero; non-finite values leave a gap.
pub(crate) fn grouped_bars(groups: &[String], series: &[BarSeries], y_label: &str) -> String {
    let finite: Vec<f64> = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .collect();
    if groups.is_empty() || series.is_empty() || finite.is_empty() {
        return no_data_svg(CHART_W, 120.0, "no data");
    }
    let y_max = finite.iter().fold(0.0f64, |m, v| m.max(*v));
    let y_min = finite.iter().fold(0.0f64, |m, v| m.min(*v));
    let y_axis = YAxis::new(y_min, y_max);
    let plot_w = CHART_W - PLOT_LEFT - PLOT_RIGHT;
    let sy = |y: f64| y_axis.px_of(y);
    let group_w = plot_w / groups.len() as f64;
    let bar_w = (group_w * 0.8 / series.len() as f64).min(48.0);
    let bottom = PLOT_TOP + PLOT_H;

    // Group labels that would touch their neighbours alternate between two rows.
    const TICK_CHAR_PX: f64 = 6.2;
    let stagger = groups
        .iter()
        .any(|g| g.chars().count() as f64 * TICK_CHAR_PX > group_w - 4.0);
    // Legend rows under the axis.
    let legend_top = bottom + if stagger { 53.0 } else { 40.0 };
    let (legend, last_row_y) = wrapped_legend(
        series.iter().map(|s| s.name.as_str()),
        legend_top,
        LegendSwatch {
            item_px: 22.0,
            text_dx: 17.0,
        },
        |legend, i, x, y| {
            let _ = write!(
                legend,
                "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" rx=\"2\" fill=\"{}\"/>",
                px(x),
                px(y - 10.0),
                series[i].colour
            );
        },
    );
    let height = last_row_y + 10.0;
    let mut svg = String::new();
    open_svg(&mut svg, "chart", px(CHART_W), height);
    y_axis.write_grid(&mut svg);
    let zero_y = sy(0.0f64.clamp(y_axis.lo, y_axis.hi));
    for (gi, group) in groups.iter().enumerate() {
        let gx = PLOT_LEFT + group_w * gi as f64;
        let bars_w = bar_w * series.len() as f64;
        let start = gx + (group_w - bars_w) / 2.0;
        for (si, s) in series.iter().enumerate() {
            let Some(value) = s.values.get(gi).copied().filter(|v| v.is_finite()) else {
                continue;
            };
            let (top, bar_h) = if value >= 0.0 {
                (sy(value), zero_y - sy(value))
            } else {
                (zero_y, sy(value) - zero_y)
            };
            let tip = s.tooltips.get(gi).cloned().unwrap_or_default();
            let _ = write!(
                svg,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"2\" fill=\"{}\">\
                 <title>{}</title></rect>",
                px(start + bar_w * si as f64 + 1.0),
                px(top),
                px((bar_w - 2.0).max(1.0)),
                px(bar_h.max(if value != 0.0 { 1.0 } else { 0.0 })),
                s.colour,
                esc(&format!("{} · {}: {}", group, s.name, tip))
            );
        }
        // Group label, cut to the room it has (two groups' width when staggered).
        let room = if stagger { group_w * 2.0 } else { group_w };
        let max_chars = ((room - 6.0) / TICK_CHAR_PX).floor().max(3.0) as usize;
        let row_offset = if stagger && gi % 2 == 1 { 13.0 } else { 0.0 };
        let _ = write!(
            svg,
            "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\"><title>{}</title>{}</text>",
            px(gx + group_w / 2.0),
            px(bottom + 16.0 + row_offset),
            esc(group),
            esc(&truncate(group, max_chars))
        );
    }
    write_axes(&mut svg, zero_y, None, y_label);
    svg.push_str(&legend);
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_nice_and_cover_the_range() {
        let (lo, hi, ticks, step) = linear_ticks(3.0, 97.0, 5);
        assert_eq!((lo, hi, step), (0.0, 100.0, 20.0));
        assert_eq!(ticks, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let (lo, hi, ticks, _) = linear_ticks(5.0, 5.0, 5);
        assert!(lo < 5.0 && hi > 5.0 && ticks.len() >= 2);
        let (lo, hi, _, _) = linear_ticks(0.0, 0.0, 5);
        assert_eq!((lo, hi), (0.0, 1.0));
    }

    #[test]
    fn tick_labels_use_suffixes_per_axis() {
        assert_eq!(tick_label(25000.0, 5000.0, 75000.0), "25k");
        assert_eq!(tick_label(2500.0, 2500.0, 75000.0), "2.5k");
        assert_eq!(tick_label(1_500_000.0, 500_000.0, 3e6), "1.5M");
        assert_eq!(tick_label(0.25, 0.05, 1.0), "0.25");
        assert_eq!(tick_label(800.0, 200.0, 1000.0), "800");
        assert_eq!(tick_label(0.0, 50_000.0, 200_000.0), "0");
        assert_eq!(tick_label(-1e-12, 0.5, 2.0), "0");
    }

    #[test]
    fn share_and_grouped_bars_handle_empty_and_nan() {
        let row = |values: [f64; 2]| ShareRow {
            label: "login".into(),
            segments: values
                .iter()
                .map(|&value| Segment {
                    label: "good".into(),
                    value,
                    colour: GOOD,
                })
                .collect(),
            note: String::new(),
        };
        let svg = share_bars(&[row([75.0, 25.0]), row([f64::NAN, 0.0])], true);
        assert!(svg.contains(">75%</text>") && svg.contains(">25%</text>"));
        assert!(svg.contains("no data"));
        assert!(!svg.contains("NaN"));
        assert!(share_bars(&[], false).contains("no data"));
        let series = |values: Vec<f64>| BarSeries {
            name: "mission-critical".into(),
            colour: PALETTE[0],
            values,
            tooltips: vec![],
        };
        let svg = grouped_bars(
            &["pre-storm".into(), "storm".into()],
            &[series(vec![100.0, f64::NAN])],
            "IOPS",
        );
        assert_eq!(
            svg.matches("<rect").count(),
            2,
            "one bar, one legend swatch"
        );
        assert!(!svg.contains("NaN"));
        assert!(grouped_bars(&["a".into()], &[series(vec![f64::NAN])], "x").contains("no data"));
        // Ten long labels do not fit side by side: they alternate between two rows.
        let groups: Vec<String> = (0..10).map(|i| format!("{i}28–256K")).collect();
        let svg = grouped_bars(&groups, &[series(vec![1.0; 10])], "%");
        let label_rows: std::collections::BTreeSet<&str> = svg
            .split("<text class=\"tick\" x=\"")
            .skip(1)
            .filter(|t| t.contains("28–256K</text>"))
            .filter_map(|t| t.split("y=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(label_rows.len(), 2, "{label_rows:?}");
    }

    #[test]
    fn escaping() {
        assert_eq!(
            esc("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn line_chart_handles_degenerate_series() {
        let chart = |points: Vec<(f64, f64)>| {
            LineChart {
                x_label: "time (s)".into(),
                y_label: "MB/s".into(),
                series: vec![LineSeries {
                    name: "a".into(),
                    points,
                }],
                x_scale: XScale::Linear,
                ticks_at_data: false,
                y_from_zero: true,
                x_name: "t".into(),
                seeds: vec![],
                shade: None,
            }
            .render()
        };
        let empty = chart(vec![]);
        assert!(empty.contains("no data"));
        let nan = chart(vec![(0.0, f64::NAN), (1.0, f64::INFINITY)]);
        assert!(nan.contains("no data"));
        let single = chart(vec![(3.0, 42.0)]);
        assert!(single.contains("<circle"));
        assert!(!single.contains("NaN") && !single.contains("inf"));
        let gap = chart(vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0)]);
        let path_d = gap.split("d=\"").nth(1).unwrap_or("");
        assert_eq!(
            path_d.split('"').next().unwrap_or("").matches('M').count(),
            2
        );
    }

    fn two_series(a: Vec<(f64, f64)>, b: Vec<(f64, f64)>) -> LineChart {
        LineChart {
            x_label: "time (s)".into(),
            y_label: "MB/s".into(),
            series: vec![
                LineSeries {
                    name: "app04".into(),
                    points: a,
                },
                LineSeries {
                    name: "app05".into(),
                    points: b,
                },
            ],
            x_scale: XScale::Linear,
            ticks_at_data: false,
            y_from_zero: true,
            x_name: "t".into(),
            seeds: vec![],
            shade: None,
        }
    }

    #[test]
    fn identical_series_are_drawn_once_and_named_together() {
        let pts = vec![(0.0, 5.0), (1.0, 6.0)];
        let svg = two_series(pts.clone(), pts.clone()).render();
        assert_eq!(svg.matches("<g class=\"series\">").count(), 1, "{svg}");
        assert!(svg.contains(">app04 = app05</text>"));
        let svg = two_series(pts, vec![(0.0, 5.0), (1.0, 7.0)]).render();
        assert_eq!(svg.matches("<g class=\"series\">").count(), 2);
        assert!(svg.contains(">app04</text>") && svg.contains(">app05</text>"));
    }

    #[test]
    fn seed_points_and_the_warm_up_band_are_drawn() {
        let mut chart = two_series(vec![(0.0, 5.0), (10.0, 6.0)], vec![(0.0, 1.0), (10.0, 2.0)]);
        chart.seeds = vec![SeedPoint {
            series: 1,
            x: 10.0,
            y: 40.0,
            label: "seed 40 (001)".into(),
        }];
        chart.shade = Some(Shade {
            from: 0.0,
            to: 4.0,
            label: "warm-up, not measured".into(),
        });
        let svg = chart.render();
        assert_eq!(
            svg.matches("class=\"seed-point\"").count(),
            2,
            "the point and its legend swatch"
        );
        assert!(svg.contains("<title>seed 40 (001)</title>"));
        assert!(svg.contains(">seed document&#39;s figure</text>"));
        // The seed figure is inside the y axis (40 is above both lines).
        assert!(svg.contains(">40</text>"), "{svg}");
        let band = svg
            .split("<g class=\"shade\">")
            .nth(1)
            .expect("a warm-up band");
        assert!(band.contains(">warm-up, not measured</text>"));
        // From x = 0 (the plot's left edge, after the 4 % pad) to x = 4 of 0..10.
        let width: f64 = band
            .split("width=\"")
            .nth(1)
            .and_then(|w| w.split('"').next())
            .and_then(|w| w.parse().ok())
            .expect("band width");
        let plot_w = CHART_W - PLOT_LEFT - PLOT_RIGHT;
        assert!(width > 0.2 * plot_w && width < 0.5 * plot_w, "{width}");
    }
}
