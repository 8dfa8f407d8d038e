//! Renders a report printed by `weir sim --json` (or `weir load --json`) again:
//! `cargo run -p weir-report --example render -- REPORT.json [OUT.html]` prints the
//! terminal tables and, when asked, writes the HTML page. `-` reads the report from
//! stdin (`weir sim --json | cargo run -p weir-report --example render -- -`).

use std::io::Read;
use std::process::ExitCode;
use weir_report::{TextOptions, parse_json, render_html, render_text};

/// The text of `input`: a file, or stdin for `-`.
fn read_input(input: &str) -> std::io::Result<String> {
    if input == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(input)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(input) = args.first() else {
        eprintln!("usage: render REPORT.json|- [OUT.html]");
        return ExitCode::FAILURE;
    };
    let report = match read_input(input)
        .map_err(|e| e.to_string())
        .and_then(|text| parse_json(&text).map_err(|e| e.to_string()))
    {
        Ok(report) => report,
        Err(err) => {
            eprintln!("cannot read {input}: {err}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", render_text(&report, &TextOptions::default()));
    if let Some(output) = args.get(1)
        && let Err(err) = std::fs::write(output, render_html(&report))
    {
        eprintln!("cannot write {output}: {err}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
