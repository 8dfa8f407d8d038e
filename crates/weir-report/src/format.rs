//! Number formatting shared by the text and HTML renderers (and usable by other crates,
//! e.g. `weir volume stats`). Non-finite values print as `n/a` (NaN) or `inf` / `-inf`.

/// Text shown for NaN.
pub(crate) const NOT_AVAILABLE: &str = "n/a";

fn non_finite(value: f64) -> Option<String> {
    if value.is_nan() {
        Some(NOT_AVAILABLE.to_string())
    } else if value.is_infinite() {
        Some(if value > 0.0 { "inf" } else { "-inf" }.to_string())
    } else {
        None
    }
}

/// `value` with `decimals` decimals and `,` between thousands: `1234567.891, 1` →
/// `1,234,567.9`.
pub fn fmt_thousands(value: f64, decimals: usize) -> String {
    if let Some(text) = non_finite(value) {
        return text;
    }
    let digits = format!("{:.*}", decimals, value.abs());
    let (int_part, frac_part) = match digits.split_once('.') {
        Some((int_part, frac_part)) => (int_part, Some(frac_part)),
        None => (digits.as_str(), None),
    };
    let mut out = String::with_capacity(digits.len() + int_part.len() / 3 + 1);
    // "-0" and "-0.0" read badly: only print the sign when something non-zero shows.
    let shows_non_zero = digits.bytes().any(|b| matches!(b, b'1'..=b'9'));
    if value < 0.0 && shows_non_zero {
        out.push('-');
    }
    let len = int_part.len();
    for (i, ch) in int_part.chars().enumerate() {
        if i > 0 && (len - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if let Some(frac_part) = frac_part {
        out.push('.');
        out.push_str(frac_part);
    }
    out
}

/// Picks decimals by magnitude: `thresholds` are (minimum magnitude, decimals), largest
/// first; below the last threshold `smallest` decimals are used. Exact zero prints `0`.
fn by_magnitude(value: f64, thresholds: &[(f64, usize)], smallest: usize) -> String {
    if let Some(text) = non_finite(value) {
        return text;
    }
    if value == 0.0 {
        return "0".to_string();
    }
    let magnitude = value.abs();
    let decimals = thresholds
        .iter()
        .find(|(min, _)| magnitude >= *min)
        .map_or(smallest, |(_, decimals)| *decimals);
    fmt_thousands(value, decimals)
}

/// IOPS: `75,000`, `323`, `45.3`, `1.25`.
pub fn fmt_iops(iops: f64) -> String {
    by_magnitude(iops, &[(99.5, 0), (9.995, 1)], 2)
}

/// MB/s: `2,800`, `504.0`, `37.5`, `0.52`.
pub fn fmt_mbps(mbps: f64) -> String {
    by_magnitude(mbps, &[(999.95, 0), (9.995, 1)], 2)
}

/// Milliseconds: `1,250`, `250`, `12.5`, `3.21`, `0.085`.
pub fn fmt_ms(latency_ms: f64) -> String {
    by_magnitude(latency_ms, &[(99.95, 0), (9.995, 1), (0.9995, 2)], 3)
}

/// Any figure of unknown unit (comparisons, component counters): `12,345`, `89.6`,
/// `3.14`, `0.047`, `1.20e-5`.
pub fn fmt_number(value: f64) -> String {
    if value.is_finite() && value != 0.0 && value.abs() < 0.001 {
        return format!("{value:.2e}");
    }
    by_magnitude(value, &[(999.95, 0), (9.995, 1), (0.9995, 2)], 3)
}

/// A count: `1,234,567`.
pub fn fmt_count(count: u64) -> String {
    fmt_thousands(count as f64, 0)
}

/// A busy fraction (0..1) as a percentage: `0.873` → `87.3%`.
pub fn fmt_pct(fraction: f64) -> String {
    if let Some(text) = non_finite(fraction) {
        return text;
    }
    format!("{}%", fmt_thousands(fraction * 100.0, 1))
}

/// A ratio such as weir / seed: `1.02×`, `12.3×`, `150×`.
pub fn fmt_ratio(ratio: f64) -> String {
    if let Some(text) = non_finite(ratio) {
        return text;
    }
    let decimals = match ratio.abs() {
        m if m >= 99.5 => 0,
        m if m >= 9.95 => 1,
        _ => 2,
    };
    format!("{}×", fmt_thousands(ratio, decimals))
}

/// A swept parameter value: integers without decimals (`64`, `1,024`), others with up
/// to three decimals and no trailing zeros (`0.5`, `2.25`).
pub fn fmt_param(value: f64) -> String {
    if let Some(text) = non_finite(value) {
        return text;
    }
    if value.fract() == 0.0 {
        return fmt_thousands(value, 0);
    }
    let text = fmt_thousands(value, 3);
    let text = text.trim_end_matches('0');
    text.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(fmt_thousands(0.0, 0), "0");
        assert_eq!(fmt_thousands(999.0, 0), "999");
        assert_eq!(fmt_thousands(1000.0, 0), "1,000");
        assert_eq!(fmt_thousands(1234567.891, 1), "1,234,567.9");
        assert_eq!(fmt_thousands(-75000.0, 0), "-75,000");
        assert_eq!(fmt_thousands(-0.01, 1), "0.0");
        assert_eq!(fmt_thousands(999.96, 1), "1,000.0");
    }

    #[test]
    fn units_pick_sensible_decimals() {
        assert_eq!(fmt_iops(75000.0), "75,000");
        assert_eq!(fmt_iops(323.4), "323");
        assert_eq!(fmt_iops(45.34), "45.3");
        assert_eq!(fmt_iops(1.254), "1.25");
        assert_eq!(fmt_iops(0.0), "0");
        assert_eq!(fmt_mbps(2800.4), "2,800");
        assert_eq!(fmt_mbps(504.0), "504.0");
        assert_eq!(fmt_mbps(0.5), "0.50");
        assert_eq!(fmt_ms(1250.0), "1,250");
        assert_eq!(fmt_ms(12.54), "12.5");
        assert_eq!(fmt_ms(3.214), "3.21");
        assert_eq!(fmt_ms(0.0851), "0.085");
        assert_eq!(fmt_number(0.00001204), "1.20e-5");
        assert_eq!(fmt_number(430.0), "430.0");
        assert_eq!(fmt_pct(0.8734), "87.3%");
        assert_eq!(fmt_ratio(1.0234), "1.02×");
        assert_eq!(fmt_ratio(150.2), "150×");
        assert_eq!(fmt_param(1024.0), "1,024");
        assert_eq!(fmt_param(0.5), "0.5");
        assert_eq!(fmt_param(2.25), "2.25");
        assert_eq!(fmt_count(1234567), "1,234,567");
    }

    #[test]
    fn non_finite_values_do_not_panic() {
        for f in [
            fmt_iops, fmt_mbps, fmt_ms, fmt_number, fmt_pct, fmt_ratio, fmt_param,
        ] {
            assert_eq!(f(f64::NAN), "n/a");
            assert_eq!(f(f64::INFINITY), "inf");
            assert_eq!(f(f64::NEG_INFINITY), "-inf");
        }
    }
}
