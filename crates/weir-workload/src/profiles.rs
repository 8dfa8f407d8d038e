//! The application profiles of 002 Table 15, measured on 24 × 15K SAS drives.

use crate::{AccessSpec, WorkloadError};

/// What the source reports for a profile.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ProfileMetric {
    /// IOPS and response time (random profiles).
    IopsLatency,
    /// Transfer rate, MB/s (sequential profiles).
    TransferRate,
}

/// A named workload with the RAID level and stripe size it was measured on.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    pub description: &'static str,
    pub raid_level: u8,
    pub stripe_bytes: u32,
    pub metric: ProfileMetric,
    pub spec: AccessSpec,
}

const KIB: u32 = 1024;
const MIB: u32 = 1024 * 1024;
/// 002: "a queue depth of 48 requests on a 24-drive RAID 5 volume" (random profiles).
const RANDOM_QUEUE_DEPTH: u32 = 48;
/// 002: "a queue depth of 24 requests … for various sequential application workloads".
const SEQUENTIAL_QUEUE_DEPTH: u32 = 24;

/// All nine profiles, in the order of 002 Table 15.
pub fn profiles() -> Vec<Profile> {
    use ProfileMetric::*;
    let p = |name: &'static str,
             description: &'static str,
             raid_level,
             random: bool,
             read_pct,
             block,
             stripe| {
        let qd = if random {
            RANDOM_QUEUE_DEPTH
        } else {
            SEQUENTIAL_QUEUE_DEPTH
        };
        let mut spec = AccessSpec::simple(block, read_pct, if random { 100.0 } else { 0.0 }, qd);
        spec.name = name.to_string();
        // 002 Phase II: "Run time is 30 minutes. Ramp-up time is 120 seconds."
        spec.run_time_s = 1800.0;
        spec.ramp_up_s = 120.0;
        Profile {
            name,
            description,
            raid_level,
            stripe_bytes: stripe,
            metric: if random { IopsLatency } else { TransferRate },
            spec,
        }
    };
    vec![
        p(
            "oltp",
            "online transaction processing",
            5,
            true,
            70.0,
            8 * KIB,
            64 * KIB,
        ),
        p(
            "dss",
            "decision support, business intelligence, video on demand",
            5,
            false,
            100.0,
            512 * KIB,
            MIB,
        ),
        p(
            "db-logging",
            "database logging",
            10,
            false,
            0.0,
            64 * KIB,
            64 * KIB,
        ),
        p(
            "hpc-random",
            "high-performance computing, random",
            5,
            true,
            50.0,
            64 * KIB,
            MIB,
        ),
        p(
            "hpc-sequential",
            "high-performance computing, sequential",
            5,
            false,
            50.0,
            MIB,
            MIB,
        ),
        p(
            "video-surveillance",
            "digital video surveillance",
            10,
            false,
            10.0,
            512 * KIB,
            MIB,
        ),
        p("hadoop", "Hadoop", 0, true, 60.0, 64 * KIB, 64 * KIB),
        p(
            "vdi-boot",
            "virtual desktop infrastructure, boot",
            5,
            true,
            80.0,
            64 * KIB,
            64 * KIB,
        ),
        p(
            "vdi-steady",
            "virtual desktop infrastructure, steady state",
            5,
            true,
            20.0,
            64 * KIB,
            MIB,
        ),
    ]
}

pub fn profile_names() -> Vec<&'static str> {
    profiles().iter().map(|p| p.name).collect()
}

/// A built-in profile by name.
pub fn profile(name: &str) -> Result<Profile, WorkloadError> {
    profiles()
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| WorkloadError::UnknownProfile(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_15_rows() {
        let all = profiles();
        assert_eq!(all.len(), 9);
        assert!(all.iter().all(|p| p.spec.validate().is_ok()));
        let oltp = profile("oltp").unwrap();
        assert_eq!((oltp.raid_level, oltp.stripe_bytes), (5, 64 * 1024));
        assert_eq!(oltp.spec.lines[0].size_bytes, 8192);
        assert_eq!(oltp.spec.lines[0].read_pct, 70.0);
        assert_eq!(oltp.spec.outstanding_ios, 48);
        let logging = profile("db-logging").unwrap();
        assert_eq!(
            (logging.raid_level, logging.metric),
            (10, ProfileMetric::TransferRate)
        );
        assert_eq!(logging.spec.lines[0].random_pct, 0.0);
        assert_eq!(profile("hadoop").unwrap().raid_level, 0);
        assert_eq!(profile("vdi-steady").unwrap().spec.lines[0].read_pct, 20.0);
        assert!(matches!(
            profile("exchange"),
            Err(WorkloadError::UnknownProfile(_))
        ));
    }
}
