//! serde_json writes non-finite floats (NaN, ±inf) as `null`; these helpers read such
//! `null`s back as NaN so that a report printed by `render_json` always parses again.

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

pub(crate) fn f64_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

pub(crate) fn vec_f64_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    let values = Vec::<Option<f64>>::deserialize(d)?;
    Ok(values.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

pub(crate) fn map_f64_or_null<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let values = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(values
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}
