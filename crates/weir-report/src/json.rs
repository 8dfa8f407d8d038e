//! JSON rendering: pretty, deterministic (struct fields in declaration order, maps sorted).

use crate::ScenarioReport;

/// Pretty JSON of the report. Field order follows the type declarations and `params`
/// is a sorted map, so the same report always gives the same bytes. Non-finite numbers
/// (NaN, ±inf) are written as `null`, which [`parse_json`] reads back as NaN.
pub fn render_json(report: &ScenarioReport) -> String {
    // Serialising these plain data types to a String cannot fail (no non-string map
    // keys, no custom serialisers); fall back to an error object rather than panic.
    match serde_json::to_string_pretty(report) {
        Ok(mut text) => {
            text.push('\n');
            text
        }
        Err(err) => format!("{{\"error\": {:?}}}\n", err.to_string()),
    }
}

/// Parses a report printed by [`render_json`] (or `weir sim --json`).
pub fn parse_json(text: &str) -> Result<ScenarioReport, serde_json::Error> {
    serde_json::from_str(text)
}
