//! Policies and service levels.
//!
//! A [`Policy`] is a template: every volume that uses it gets the policy's full
//! targets (two volumes on `mission-critical` each get 75,000 IOPS reserved). All the
//! clients of one volume share that volume's reservation and limit.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Service levels, in the order they are protected under overload (000: "prioritized
/// performance under severe load"). `Ord`: `MissionCritical < BusinessCritical <
/// NonCritical`, i.e. smaller is more important.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceLevel {
    MissionCritical,
    BusinessCritical,
    NonCritical,
}

impl ServiceLevel {
    pub const ALL: [ServiceLevel; 3] = [
        Self::MissionCritical,
        Self::BusinessCritical,
        Self::NonCritical,
    ];
    /// 0 for the most important level.
    pub fn rank(self) -> usize {
        self as usize
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::MissionCritical => "mission-critical",
            Self::BusinessCritical => "business-critical",
            Self::NonCritical => "non-critical",
        }
    }
}

/// Proportional-share weight (003: Low 500, Normal 1000, High 2000, custom 200–4000).
/// In TOML: `"low"`, `"normal"`, `"high"` or a number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Shares(u32);

impl Shares {
    pub const LOW: Shares = Shares(500);
    pub const NORMAL: Shares = Shares(1000);
    pub const HIGH: Shares = Shares(2000);
    pub const MIN_CUSTOM: u32 = 200;
    pub const MAX_CUSTOM: u32 = 4000;

    pub fn new(value: u32) -> Result<Shares, PolicyError> {
        if (Self::MIN_CUSTOM..=Self::MAX_CUSTOM).contains(&value) {
            Ok(Shares(value))
        } else {
            Err(PolicyError::Shares(value))
        }
    }
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for Shares {
    fn default() -> Self {
        Self::NORMAL
    }
}

impl<'de> Deserialize<'de> for Shares {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            Value(u32),
        }
        match Raw::deserialize(d)? {
            Raw::Name(n) => match n.to_ascii_lowercase().as_str() {
                "low" => Ok(Shares::LOW),
                "normal" => Ok(Shares::NORMAL),
                "high" => Ok(Shares::HIGH),
                other => Err(serde::de::Error::custom(format!(
                    "shares must be \"low\", \"normal\", \"high\" or a number 200-4000, not \"{other}\""
                ))),
            },
            Raw::Value(v) => Shares::new(v).map_err(serde::de::Error::custom),
        }
    }
}

/// Smallest and largest IOPS limit (003: 16 to 2,147,483,647; the top means unlimited).
pub const MIN_LIMIT_IOPS: f64 = 16.0;
pub const MAX_LIMIT_IOPS: f64 = 2_147_483_647.0;
/// Smallest and largest IOPS reservation.
pub const MIN_RESERVATION_IOPS: f64 = 1.0;
pub const MAX_RESERVATION_IOPS: f64 = MAX_LIMIT_IOPS;
/// Smallest and largest MB/s figure (reservation or limit): 10 kB/s to 1 TB/s.
/// Outside it a figure is not enforceable (a limit of 1e-300 MB/s overflowed the
/// gate's tags and limited nothing), so it is refused rather than accepted.
pub const MIN_MBPS: f64 = 0.01;
pub const MAX_MBPS: f64 = 1_000_000.0;
/// Smallest and largest latency target, milliseconds (10 µs to 100 s).
pub const MIN_LATENCY_TARGET_MS: f64 = 0.01;
pub const MAX_LATENCY_TARGET_MS: f64 = 100_000.0;
/// Largest `burst_seconds` (an hour of the rate banked).
pub const MAX_BURST_SECONDS: f64 = 3600.0;

/// A QoS policy: any combination of reservation, limit, shares and latency target.
/// `None` means "not set" (no reservation / unlimited / no target).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub name: String,
    #[serde(default)]
    pub service_level: Option<ServiceLevel>,
    /// Minimum IOPS (in cost units, see `SchedulerConfig::cost_unit_bytes`).
    #[serde(default)]
    pub reservation_iops: Option<f64>,
    /// Minimum bandwidth, MB/s.
    #[serde(default)]
    pub reservation_mbps: Option<f64>,
    /// Maximum IOPS (16 ..= 2,147,483,647; the top value means unlimited).
    #[serde(default)]
    pub limit_iops: Option<f64>,
    /// Maximum bandwidth, MB/s.
    #[serde(default)]
    pub limit_mbps: Option<f64>,
    #[serde(default)]
    pub shares: Shares,
    /// Not-to-exceed latency, ms; drives service-level protection under overload.
    #[serde(default)]
    pub latency_target_ms: Option<f64>,
    /// Credit an idle volume may bank, in seconds of its limit/reservation rate
    /// (0 = an idle volume banks nothing).
    #[serde(default)]
    pub burst_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("shares must be 200-4000 (low 500, normal 1000, high 2000), got {0}")]
    Shares(u32),
    #[error("limit_iops must be 16-2147483647, got {0:?}")]
    LimitIops(f64),
    #[error("{field} must be {min}-{max} ({unit}), got {value:?}")]
    OutOfRange {
        field: &'static str,
        value: f64,
        min: f64,
        max: f64,
        unit: &'static str,
    },
    #[error("reservation_{what} ({reservation}) exceeds limit_{what} ({limit})")]
    ReservationAboveLimit {
        what: &'static str,
        reservation: f64,
        limit: f64,
    },
    #[error("policy name must be 1-64 characters of [A-Za-z0-9._-], got {0:?}")]
    Name(String),
    #[error("policy {0:?} is built in and cannot be changed or deleted")]
    BuiltIn(String),
    #[error("no policy named {0:?}")]
    Unknown(String),
    #[error("no volume {0}")]
    UnknownVolume(u32),
    #[error("volume {0} already exists")]
    VolumeExists(u32),
}

impl Policy {
    /// A policy with no reservation, no limit, normal shares, no latency target.
    pub fn best_effort(name: impl Into<String>) -> Policy {
        Policy {
            name: name.into(),
            service_level: None,
            reservation_iops: None,
            reservation_mbps: None,
            limit_iops: None,
            limit_mbps: None,
            shares: Shares::NORMAL,
            latency_target_ms: None,
            burst_seconds: 0.0,
        }
    }

    /// `limit_iops`, with the documented "unlimited" maximum folded to `None`.
    pub fn effective_limit_iops(&self) -> Option<f64> {
        self.limit_iops.filter(|&l| l < MAX_LIMIT_IOPS)
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(PolicyError::Name(self.name.clone()));
        }
        Shares::new(self.shares.get())?;
        if let Some(l) = self.limit_iops
            && !(MIN_LIMIT_IOPS..=MAX_LIMIT_IOPS).contains(&l)
        {
            return Err(PolicyError::LimitIops(l));
        }
        self.check_ranges()?;
        for (what, r, l) in [
            ("iops", self.reservation_iops, self.effective_limit_iops()),
            ("mbps", self.reservation_mbps, self.limit_mbps),
        ] {
            if let (Some(reservation), Some(limit)) = (r, l)
                && reservation > limit
            {
                return Err(PolicyError::ReservationAboveLimit {
                    what,
                    reservation,
                    limit,
                });
            }
        }
        Ok(())
    }
}

impl Policy {
    /// Every figure within the range the gate enforces (NaN and infinities too).
    fn check_ranges(&self) -> Result<(), PolicyError> {
        let ranges = [
            (
                "reservation_iops",
                self.reservation_iops,
                MIN_RESERVATION_IOPS,
                MAX_RESERVATION_IOPS,
                "IOPS",
            ),
            (
                "reservation_mbps",
                self.reservation_mbps,
                MIN_MBPS,
                MAX_MBPS,
                "MB/s",
            ),
            ("limit_mbps", self.limit_mbps, MIN_MBPS, MAX_MBPS, "MB/s"),
            (
                "latency_target_ms",
                self.latency_target_ms,
                MIN_LATENCY_TARGET_MS,
                MAX_LATENCY_TARGET_MS,
                "ms",
            ),
            (
                "burst_seconds",
                Some(self.burst_seconds),
                0.0,
                MAX_BURST_SECONDS,
                "seconds",
            ),
        ];
        for (field, value, min, max, unit) in ranges {
            if let Some(v) = value
                && !(min..=max).contains(&v)
            {
                return Err(PolicyError::OutOfRange {
                    field,
                    value: v,
                    min,
                    max,
                    unit,
                });
            }
        }
        Ok(())
    }
}

/// The five policies of 000 (Figure 2), as built-ins. `policy-1` … `policy-5` are
/// accepted as aliases.
pub fn builtin_policies() -> Vec<Policy> {
    let p = |name: &str, level, iops: f64, mbps: f64, lat: f64| Policy {
        name: name.to_string(),
        service_level: Some(level),
        reservation_iops: Some(iops),
        reservation_mbps: Some(mbps),
        limit_iops: None,
        limit_mbps: None,
        shares: Shares::NORMAL,
        latency_target_ms: Some(lat),
        burst_seconds: 0.0,
    };
    use ServiceLevel::*;
    vec![
        p("mission-critical", MissionCritical, 75_000.0, 750.0, 10.0),
        p("business-critical", BusinessCritical, 30_000.0, 375.0, 20.0),
        p(
            "business-critical-2",
            BusinessCritical,
            15_000.0,
            150.0,
            40.0,
        ),
        p("non-critical", NonCritical, 7_500.0, 75.0, 100.0),
        p("non-critical-2", NonCritical, 1_500.0, 37.0, 250.0),
    ]
}

fn alias(name: &str) -> &str {
    match name {
        "policy-1" => "mission-critical",
        "policy-2" => "business-critical",
        "policy-3" => "business-critical-2",
        "policy-4" => "non-critical",
        "policy-5" => "non-critical-2",
        other => other,
    }
}

/// Built-in plus user-defined policies, by name.
#[derive(Clone, Debug)]
pub struct PolicyCatalog {
    policies: BTreeMap<String, Policy>,
}

impl Default for PolicyCatalog {
    fn default() -> Self {
        Self::new()
    }
}

impl PolicyCatalog {
    pub fn new() -> Self {
        let policies = builtin_policies()
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        PolicyCatalog { policies }
    }

    pub fn is_builtin(name: &str) -> bool {
        builtin_policies().iter().any(|p| p.name == alias(name))
    }

    pub fn get(&self, name: &str) -> Result<&Policy, PolicyError> {
        self.policies
            .get(alias(name))
            .ok_or_else(|| PolicyError::Unknown(name.to_string()))
    }

    /// Adds or replaces a user-defined policy.
    pub fn insert(&mut self, policy: Policy) -> Result<(), PolicyError> {
        policy.validate()?;
        if Self::is_builtin(&policy.name) {
            return Err(PolicyError::BuiltIn(policy.name));
        }
        self.policies.insert(policy.name.clone(), policy);
        Ok(())
    }

    pub fn remove(&mut self, name: &str) -> Result<Policy, PolicyError> {
        if Self::is_builtin(name) {
            return Err(PolicyError::BuiltIn(name.to_string()));
        }
        self.policies
            .remove(name)
            .ok_or_else(|| PolicyError::Unknown(name.to_string()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Policy> {
        self.policies.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_match_000_figure_2() {
        let c = PolicyCatalog::new();
        let mc = c.get("policy-1").unwrap();
        assert_eq!(mc.name, "mission-critical");
        assert_eq!(mc.reservation_iops, Some(75_000.0));
        assert_eq!(mc.latency_target_ms, Some(10.0));
        assert_eq!(
            c.get("non-critical-2").unwrap().reservation_mbps,
            Some(37.0)
        );
        for p in builtin_policies() {
            p.validate().unwrap();
        }
    }

    #[test]
    fn builtins_cannot_be_replaced_or_removed() {
        let mut c = PolicyCatalog::new();
        assert!(matches!(
            c.remove("mission-critical"),
            Err(PolicyError::BuiltIn(_))
        ));
        assert!(matches!(
            c.insert(Policy::best_effort("policy-2")),
            Err(PolicyError::BuiltIn(_))
        ));
        c.insert(Policy::best_effort("gold")).unwrap();
        assert!(c.get("gold").is_ok());
        c.remove("gold").unwrap();
        assert!(matches!(c.get("gold"), Err(PolicyError::Unknown(_))));
    }

    #[test]
    fn validation_rejects_out_of_range_values() {
        assert!(Shares::new(199).is_err());
        assert!(Shares::new(4001).is_err());
        assert_eq!(Shares::new(4000).unwrap().get(), 4000);
        let mut p = Policy::best_effort("x");
        p.limit_iops = Some(15.0);
        assert_eq!(p.validate(), Err(PolicyError::LimitIops(15.0)));
        p.limit_iops = Some(MAX_LIMIT_IOPS);
        assert!(p.validate().is_ok());
        assert_eq!(p.effective_limit_iops(), None);
        p.reservation_iops = Some(f64::NAN);
        assert!(p.validate().is_err());
        // Figures the gate cannot enforce are refused, naming the field and range.
        let bad = [
            ("limit_mbps", 1e-300),
            ("limit_mbps", 1e300),
            ("reservation_mbps", 0.001),
            ("reservation_iops", 0.5),
            ("latency_target_ms", 1e9),
            ("burst_seconds", 1e7),
            ("limit_mbps", f64::INFINITY),
        ];
        for (field, value) in bad {
            let mut p = Policy::best_effort("x");
            match field {
                "limit_mbps" => p.limit_mbps = Some(value),
                "reservation_mbps" => p.reservation_mbps = Some(value),
                "reservation_iops" => p.reservation_iops = Some(value),
                "latency_target_ms" => p.latency_target_ms = Some(value),
                _ => p.burst_seconds = value,
            }
            let e = p.validate().unwrap_err().to_string();
            assert!(e.starts_with(&format!("{field} must be ")), "{e}");
        }
        let mut p = Policy::best_effort("x");
        p.limit_mbps = Some(1e-300);
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "limit_mbps must be 0.01-1000000 (MB/s), got 1e-300"
        );
        p.limit_mbps = Some(MIN_MBPS);
        p.reservation_iops = Some(MIN_RESERVATION_IOPS);
        p.latency_target_ms = Some(MIN_LATENCY_TARGET_MS);
        p.burst_seconds = MAX_BURST_SECONDS;
        assert!(p.validate().is_ok());
        let mut q = Policy::best_effort("y");
        q.reservation_iops = Some(500.0);
        q.limit_iops = Some(100.0);
        assert!(matches!(
            q.validate(),
            Err(PolicyError::ReservationAboveLimit { .. })
        ));
        assert!(Policy::best_effort("bad name").validate().is_err());
    }

    #[test]
    fn shares_parse_names_and_numbers() {
        let v: Shares = serde_json::from_str("\"Low\"").unwrap();
        assert_eq!(v, Shares::LOW);
        let v: Shares = serde_json::from_str("3000").unwrap();
        assert_eq!(v.get(), 3000);
        assert!(serde_json::from_str::<Shares>("100").is_err());
        assert!(serde_json::from_str::<Shares>("\"medium\"").is_err());
    }
}
