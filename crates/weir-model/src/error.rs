//! Errors for invalid specifications.

/// Why a model could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// A numeric field is out of its physical range.
    #[error("invalid {what}: {field} = {value} ({reason})")]
    InvalidField {
        what: &'static str,
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// A RAID level cannot be built from this many drives / spans.
    #[error("invalid RAID {level} layout: {reason}")]
    InvalidRaid { level: u32, reason: String },
    /// A preset name is not known.
    #[error("unknown {kind} preset {name:?}; known presets: {known}")]
    UnknownPreset {
        kind: &'static str,
        name: String,
        known: String,
    },
}

pub(crate) fn check_positive(
    what: &'static str,
    field: &'static str,
    value: f64,
) -> Result<(), ModelError> {
    let range = (f64::MIN_POSITIVE, f64::MAX);
    check_between(what, field, value, range, "must be a finite number > 0")
}

pub(crate) fn check_non_negative(
    what: &'static str,
    field: &'static str,
    value: f64,
) -> Result<(), ModelError> {
    check_between(
        what,
        field,
        value,
        (0.0, f64::MAX),
        "must be a finite number >= 0",
    )
}

/// `value` must lie in `range`; `reason` says so in the error.
pub(crate) fn check_in_range(
    what: &'static str,
    field: &'static str,
    value: u64,
    range: std::ops::RangeInclusive<u64>,
    reason: &'static str,
) -> Result<(), ModelError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(ModelError::InvalidField {
            what,
            field,
            value: value.to_string(),
            reason,
        })
    }
}

/// `value` within `[lo, hi]` (and finite): the physical range of a field, which also
/// keeps the device's nanosecond arithmetic far from overflow.
pub(crate) fn check_between(
    what: &'static str,
    field: &'static str,
    value: f64,
    (lo, hi): (f64, f64),
    reason: &'static str,
) -> Result<(), ModelError> {
    if value.is_finite() && (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(ModelError::InvalidField {
            what,
            field,
            value: format!("{value:?}"),
            reason,
        })
    }
}
