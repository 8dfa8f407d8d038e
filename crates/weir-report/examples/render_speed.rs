//! Prints how long each renderer takes on the test fixtures (a 2-case scenario with
//! 1,080 timeline points and a 66-case sweep):
//! `cargo run --release -p weir-report --example render_speed`.

#[path = "../tests/fixtures/mod.rs"]
mod fixtures;

use std::time::Instant;
use weir_report::{TextOptions, render_html, render_json, render_text};

fn time(label: &str, rounds: u32, mut render: impl FnMut() -> String) {
    let start = Instant::now();
    let mut bytes = 0;
    for _ in 0..rounds {
        bytes = std::hint::black_box(render()).len();
    }
    let per_render_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
    println!("{label:<28} {per_render_us:>10.1} µs/render  {bytes:>9} bytes");
}

fn main() {
    for (name, report) in [
        ("scenario", fixtures::sioc_report()),
        ("sweep (66 cases)", fixtures::raid_sweep_report()),
    ] {
        let opts = TextOptions::default();
        time(&format!("{name}: text"), 200, || {
            render_text(&report, &opts)
        });
        time(&format!("{name}: json"), 200, || render_json(&report));
        time(&format!("{name}: html"), 200, || render_html(&report));
    }
}
