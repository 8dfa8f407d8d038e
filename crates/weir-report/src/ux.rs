//! User-experience grades of the VDI study (004, SPEC section 6): a figure is shown as
//! good, fair or poor against fixed thresholds. Pure classification for display.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum UxGrade {
    Good,
    Fair,
    Poor,
}

impl UxGrade {
    fn grade(value: f64, good_max: f64, fair_max: f64) -> Option<UxGrade> {
        if !value.is_finite() || value < 0.0 {
            None
        } else if value <= good_max {
            Some(UxGrade::Good)
        } else if value <= fair_max {
            Some(UxGrade::Fair)
        } else {
            Some(UxGrade::Poor)
        }
    }

    /// Login time: good ≤ 15 s, fair ≤ 60 s, poor above. `None` for NaN / negative.
    pub fn login(login_s: f64) -> Option<UxGrade> {
        Self::grade(login_s, 15.0, 60.0)
    }

    /// Application load time: good ≤ 10 s, fair ≤ 30 s, poor above.
    pub fn app_load(load_s: f64) -> Option<UxGrade> {
        Self::grade(load_s, 10.0, 30.0)
    }

    /// I/O latency seen by a desktop: good ≤ 150 ms, fair ≤ 300 ms, poor above.
    pub fn io_latency(latency_ms: f64) -> Option<UxGrade> {
        Self::grade(latency_ms, 150.0, 300.0)
    }

    pub fn label(self) -> &'static str {
        match self {
            UxGrade::Good => "good",
            UxGrade::Fair => "fair",
            UxGrade::Poor => "poor",
        }
    }
}

impl fmt::Display for UxGrade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_inclusive() {
        assert_eq!(UxGrade::login(15.0), Some(UxGrade::Good));
        assert_eq!(UxGrade::login(15.1), Some(UxGrade::Fair));
        assert_eq!(UxGrade::login(60.0), Some(UxGrade::Fair));
        assert_eq!(UxGrade::login(61.0), Some(UxGrade::Poor));
        assert_eq!(UxGrade::app_load(10.0), Some(UxGrade::Good));
        assert_eq!(UxGrade::app_load(30.5), Some(UxGrade::Poor));
        assert_eq!(UxGrade::io_latency(150.0), Some(UxGrade::Good));
        assert_eq!(UxGrade::io_latency(300.0), Some(UxGrade::Fair));
        assert_eq!(UxGrade::io_latency(300.1), Some(UxGrade::Poor));
        assert_eq!(UxGrade::io_latency(f64::NAN), None);
        assert_eq!(UxGrade::login(-1.0), None);
        assert_eq!(UxGrade::Fair.to_string(), "fair");
    }
}
