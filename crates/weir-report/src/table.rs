//! A small generic terminal table: columns with alignment, optional ANSI colour per
//! cell, separator rows. Used by `render_text`, and meant for other crates too (the
//! server's `weir volume list/stats`).
//!
//! ```
//! use weir_report::{Column, Table};
//! let mut table = Table::new(vec![Column::left("volume"), Column::right("IOPS")]);
//! table.add_row(["db", "75,000"]);
//! table.add_row(["logs", "1,500"]);
//! assert_eq!(table.render(false), "volume    IOPS\n──────  ──────\ndb      75,000\nlogs     1,500\n");
//! ```

use std::fmt;

/// Horizontal alignment of a column's cells (and its header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A column: header text and alignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub header: String,
    pub align: Align,
    /// Left out (rightmost first) when the table does not fit its width otherwise.
    pub droppable: bool,
}

impl Column {
    pub fn left(header: impl Into<String>) -> Self {
        Column {
            header: header.into(),
            align: Align::Left,
            droppable: false,
        }
    }

    pub fn right(header: impl Into<String>) -> Self {
        Column {
            header: header.into(),
            align: Align::Right,
            droppable: false,
        }
    }

    /// This column may be left out to fit a narrow width ([`Table::render_fit`]).
    pub fn droppable(mut self) -> Self {
        self.droppable = true;
        self
    }
}

/// How a cell is shown when colour is on (ignored when it is off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Style {
    #[default]
    Plain,
    Bold,
    Dim,
    Red,
    Green,
    Yellow,
    Cyan,
}

impl Style {
    fn ansi(self) -> Option<&'static str> {
        match self {
            Style::Plain => None,
            Style::Bold => Some("\x1b[1m"),
            Style::Dim => Some("\x1b[2m"),
            Style::Red => Some("\x1b[1;31m"),
            Style::Green => Some("\x1b[32m"),
            Style::Yellow => Some("\x1b[33m"),
            Style::Cyan => Some("\x1b[1;36m"),
        }
    }

    /// `text` wrapped in this style's ANSI codes when `color` is on.
    pub fn paint(self, text: &str, color: bool) -> String {
        match (color, self.ansi()) {
            (true, Some(code)) => format!("{code}{text}\x1b[0m"),
            _ => text.to_string(),
        }
    }
}

/// One cell: its text (control characters are shown as spaces) and style.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    pub text: String,
    pub style: Style,
}

impl Cell {
    pub fn new(text: impl Into<String>) -> Self {
        Cell::styled(text, Style::Plain)
    }

    pub fn styled(text: impl Into<String>, style: Style) -> Self {
        Cell {
            text: sanitize(&text.into()),
            style,
        }
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell::new(text)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::new(text)
    }
}

impl From<&String> for Cell {
    fn from(text: &String) -> Self {
        Cell::new(text.as_str())
    }
}

/// Replaces control characters (newlines, tabs, escape sequences from untrusted names)
/// with spaces so they cannot break the layout or drive the terminal.
pub(crate) fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn display_width(text: &str) -> usize {
    text.chars().count()
}

#[derive(Clone, Debug, PartialEq)]
enum Row {
    Cells(Vec<Cell>),
    Separator,
}

/// A table rendered as aligned columns separated by two spaces, a rule under the
/// header, and optional rule rows. Rows with fewer cells than columns are padded;
/// rows with more cells get extra (headerless, left-aligned) columns.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Row>,
    indent: usize,
}

impl Table {
    pub fn new(columns: Vec<Column>) -> Self {
        Table {
            columns: columns
                .into_iter()
                .map(|c| Column {
                    header: sanitize(&c.header),
                    ..c
                })
                .collect(),
            rows: Vec::new(),
            indent: 0,
        }
    }

    /// Indents every line by `spaces`.
    pub fn with_indent(mut self, spaces: usize) -> Self {
        self.indent = spaces;
        self
    }

    pub fn add_row<I, C>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = C>,
        C: Into<Cell>,
    {
        self.rows
            .push(Row::Cells(cells.into_iter().map(Into::into).collect()));
        self
    }

    /// A horizontal rule across all columns (e.g. before a total line).
    pub fn add_separator(&mut self) -> &mut Self {
        self.rows.push(Row::Separator);
        self
    }

    /// Number of data rows (separators not counted).
    pub fn len(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| matches!(r, Row::Cells(_)))
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table as text, one line per row, each ending in `\n`, with no trailing
    /// spaces. `color` adds ANSI styles (bold header, per-cell styles).
    pub fn render(&self, color: bool) -> String {
        self.render_fit(color, usize::MAX)
    }

    /// Like [`Table::render`], in at most `max_width` columns where it can: the
    /// widest left-aligned (text) columns are narrowed, widest first, down to 6
    /// characters or their header, and cells cut with `…`; then droppable columns
    /// are left out, rightmost first. Numbers are never cut.
    pub fn render_fit(&self, color: bool, max_width: usize) -> String {
        let column_count = self
            .rows
            .iter()
            .map(|r| match r {
                Row::Cells(cells) => cells.len(),
                Row::Separator => 0,
            })
            .max()
            .unwrap_or(0)
            .max(self.columns.len());
        let align = |i: usize| self.columns.get(i).map_or(Align::Left, |c| c.align);
        let mut widths: Vec<usize> = (0..column_count)
            .map(|i| self.columns.get(i).map_or(0, |c| display_width(&c.header)))
            .collect();
        for row in &self.rows {
            if let Row::Cells(cells) = row {
                for (i, cell) in cells.iter().enumerate() {
                    widths[i] = widths[i].max(display_width(&cell.text));
                }
            }
        }
        let mut keep = vec![true; column_count];
        let total = |w: &[usize], keep: &[bool]| {
            let shown: Vec<usize> = w.iter().zip(keep).filter(|x| *x.1).map(|x| *x.0).collect();
            self.indent + shown.iter().sum::<usize>() + 2 * shown.len().saturating_sub(1)
        };
        let floor = |i: usize| {
            self.columns
                .get(i)
                .map_or(0, |c| display_width(&c.header))
                .max(6)
        };
        while total(&widths, &keep) > max_width {
            let widest = (0..widths.len())
                .filter(|&i| align(i) == Align::Left && widths[i] > floor(i))
                .max_by_key(|&i| (widths[i], std::cmp::Reverse(i)));
            let Some(i) = widest else { break };
            let excess = total(&widths, &keep) - max_width;
            widths[i] -= excess.min(widths[i] - floor(i)).max(1);
        }
        while total(&widths, &keep) > max_width {
            let Some(i) = (0..column_count)
                .rev()
                .find(|&i| keep[i] && self.columns.get(i).is_some_and(|c| c.droppable))
            else {
                break;
            };
            keep[i] = false;
        }
        let fit = |text: &str, width: usize| -> String {
            if display_width(text) <= width {
                text.to_string()
            } else {
                let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
                cut.push('…');
                cut
            }
        };
        let indent = " ".repeat(self.indent);
        let rule = {
            let parts: Vec<String> = widths
                .iter()
                .zip(&keep)
                .filter(|x| *x.1)
                .map(|(w, _)| "─".repeat(*w))
                .collect();
            format!("{indent}{}\n", parts.join("  "))
        };
        let line = |cells: Vec<(&str, Style)>| -> String {
            let mut out = indent.clone();
            let mut pending_spaces = 0usize;
            let mut first = true;
            for (i, width) in widths.iter().enumerate() {
                if !keep[i] {
                    continue;
                }
                let (text, style) = cells.get(i).copied().unwrap_or(("", Style::Plain));
                let text = &fit(text, *width);
                let pad = width - display_width(text);
                let (left_pad, right_pad) = match align(i) {
                    Align::Left => (0, pad),
                    Align::Right => (pad, 0),
                };
                if !first {
                    pending_spaces += 2;
                }
                first = false;
                pending_spaces += left_pad;
                if !text.is_empty() {
                    out.push_str(&" ".repeat(pending_spaces));
                    pending_spaces = 0;
                    out.push_str(&style.paint(text, color));
                }
                pending_spaces += right_pad;
            }
            out.push('\n');
            out
        };
        let mut out = String::new();
        if self.columns.iter().any(|c| !c.header.is_empty()) {
            out.push_str(&line(
                self.columns
                    .iter()
                    .map(|c| (c.header.as_str(), Style::Bold))
                    .collect(),
            ));
            out.push_str(&rule);
        }
        for row in &self.rows {
            match row {
                Row::Cells(cells) => out.push_str(&line(
                    cells.iter().map(|c| (c.text.as_str(), c.style)).collect(),
                )),
                Row::Separator => out.push_str(&rule),
            }
        }
        out
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_and_pads_short_rows() {
        let mut table = Table::new(vec![
            Column::left("name"),
            Column::right("IOPS"),
            Column::left("note"),
        ]);
        table.add_row(["oltp", "3,300", "RAID 5"]);
        table.add_row(["vdi-boot-storm", "36,085"]);
        table.add_separator();
        table.add_row(["total", "39,385", ""]);
        let text = table.render(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name              IOPS  note");
        assert_eq!(lines[2], "oltp             3,300  RAID 5");
        assert_eq!(lines[3], "vdi-boot-storm  36,085");
        assert!(lines[4].starts_with("──────────────  ──────"));
        assert_eq!(lines[5], "total           39,385");
        assert_eq!(table.len(), 3);
        assert!(text.lines().all(|l| !l.ends_with(' ')));
    }

    #[test]
    fn extra_cells_get_columns_and_control_chars_are_neutralised() {
        let mut table = Table::new(vec![Column::left("a")]).with_indent(2);
        table.add_row(["x\x1b[31m", "extra"]);
        let text = table.render(false);
        assert!(!text.contains('\x1b'));
        assert!(text.contains("  x [31m  extra"));
    }

    #[test]
    fn narrows_text_columns_to_the_width_and_never_cuts_numbers() {
        let mut table = Table::new(vec![
            Column::left("metric"),
            Column::right("Weir"),
            Column::left("source"),
        ])
        .with_indent(2);
        table.add_row([
            "one VM's read MB/s, 8 Gb",
            "101.2",
            "001: \"each VM converging on 100MBps\" and a long note about the HBA",
        ]);
        let wide = table.render(false);
        assert!(wide.lines().any(|l| l.chars().count() > 80));
        let narrow = table.render_fit(false, 60);
        assert!(narrow.lines().all(|l| l.chars().count() <= 60), "{narrow}");
        assert!(narrow.contains("101.2") && narrow.contains('…'));
        // Only numbers left to cut: the line stays as wide as it must.
        let mut numbers = Table::new(vec![Column::right("a"), Column::right("b")]);
        numbers.add_row(["123456789", "987654321"]);
        assert_eq!(numbers.render_fit(false, 5), numbers.render(false));
        // Then droppable columns go, rightmost first.
        let mut t = Table::new(vec![
            Column::left("name"),
            Column::right("p50").droppable(),
            Column::right("p99"),
            Column::right("max").droppable(),
        ]);
        t.add_row(["a", "1.000", "2.000", "9.000"]);
        assert_eq!(t.render_fit(false, 80), t.render(false));
        assert_eq!(
            t.render_fit(false, 19),
            "name    p50    p99\n────  ─────  ─────\na     1.000  2.000\n"
        );
        assert_eq!(
            t.render_fit(false, 12),
            "name    p99\n────  ─────\na     2.000\n"
        );
    }

    #[test]
    fn colour_only_when_asked() {
        let mut table = Table::new(vec![Column::left("flag")]);
        table.add_row([Cell::styled("!! >20%", Style::Red)]);
        assert!(!table.render(false).contains('\x1b'));
        let coloured = table.render(true);
        assert!(coloured.contains("\x1b[1;31m!! >20%\x1b[0m"));
        assert!(coloured.contains("\x1b[1mflag\x1b[0m"));
    }
}
