//! Prints the text rendering of a report read from a JSON file (or stdin), and writes
//! HTML next to it when asked: `cargo run -p weir-report --example sample -- report.json [out.html]`.

use std::io::Read;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut json = String::new();
    match args.first().map(String::as_str) {
        None | Some("-") => {
            std::io::stdin().read_to_string(&mut json)?;
        }
        Some(path) => json = std::fs::read_to_string(path)?,
    }
    let report = weir_report::parse_json(&json)?;
    print!(
        "{}",
        weir_report::render_text(&report, &weir_report::TextOptions::default())
    );
    if let Some(out) = args.get(1) {
        std::fs::write(out, weir_report::render_html(&report))?;
    }
    Ok(())
}
