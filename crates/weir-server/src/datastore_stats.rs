//! The datastore-wide latency that gateway windows step with, shared through a
//! volume on the datastore itself — as SIOC shares per-host statistics through a
//! file on the VMFS datastore, with no coordinator and no gateway-to-gateway link.
//!
//! Why a shared mean and not each gateway's own latency: PARDA's windows hold the
//! share ratio only when every host steps with the *same* latency. A gateway's own
//! figure drifts with its share of the queue (measured here: on an emulated RAID
//! whose disks reorder by seek distance, the gateway with 32 of 38 requests at the
//! array saw 5.0 ms and the one with 6 saw 8.0 ms), and the feedback runs away: the
//! larger window sees the lower latency and grows (split 9.8:1 for 2:1 shares).
//!
//! Layout: the stats volume (`gateway_stats_volume`, at least [`STATS_BYTES`]) holds
//! [`SLOTS`] slots of [`SLOT_BYTES`]; gateway `gateway_id` owns slot `gateway_id`.
//! Every period a gateway writes its slot (its period's latency sum and I/O count,
//! and for the fair rates of `weir_qos::fair_rate` its shares, the cost units it
//! sent and the period's length, with a sequence number) and reads all of them. A slot counts while its sequence number keeps
//! moving: one that has not moved for [`STALE_READS`] of the reader's periods
//! belongs to a gateway that stopped, and is left out. No clock is compared across
//! machines: each gateway's rate is its units over its own period.
//!
//! Slot layout (little-endian): magic `WEIRDSL2` (0..8), gateway id u16 (8..10),
//! flags u8 (10; bit 0: its pace held requests back), zero (11), period µs u32
//! (12..16), sequence (16..24),
//! latency sum ns (24..32), I/Os (32..40), cost units (40..48), shares (48..56),
//! FNV-1a of bytes 0..56 (56..64). A slot of the first layout (`WEIRDSL1`, written
//! by an older gateway) still counts in the mean latency, not in the fair rates.

use std::io;

use weir_qos::{DatastoreLatency, GatewayShare};

use crate::backend::Backend;

/// Gateways one stats volume can hold (ids `0..SLOTS`).
pub const SLOTS: usize = 128;
pub const SLOT_BYTES: usize = 64;
/// The part of the stats volume that is used.
pub const STATS_BYTES: u64 = (SLOTS * SLOT_BYTES) as u64;
/// A slot whose sequence number did not move for this many reads is stale.
pub const STALE_READS: u8 = 3;

const MAGIC: &[u8; 8] = b"WEIRDSL2";
/// The first layout: latency only, checksum at 40..48.
const MAGIC_V1: &[u8; 8] = b"WEIRDSL1";

/// One gateway's period as written in its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRecord {
    pub gateway_id: u32,
    pub seq: u64,
    pub latency_sum_ns: u64,
    pub ios: u64,
    /// For the fair rates (`None` in a slot of the first layout).
    pub share: Option<ShareRecord>,
}

/// A gateway's period for the others' fair rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareRecord {
    pub shares: u64,
    pub units: u64,
    pub period_us: u32,
    pub paced: bool,
}

impl ShareRecord {
    pub fn from_share(s: &GatewayShare, period_us: u32) -> ShareRecord {
        let units = s.units_per_s * period_us as f64 / 1e6;
        ShareRecord {
            shares: s.shares,
            units: if units.is_finite() {
                units.round() as u64
            } else {
                0
            },
            period_us,
            paced: s.paced,
        }
    }
}

impl SlotRecord {
    /// The gateway's period for the fair rates (`None`: a slot of the first layout).
    pub fn gateway_share(&self) -> Option<GatewayShare> {
        let s = self.share?;
        Some(GatewayShare {
            shares: s.shares,
            units_per_s: s.units as f64 * 1e6 / s.period_us.max(1) as f64,
            latency_ms: match self.ios {
                0 => 0.0,
                n => self.latency_sum_ns as f64 / n as f64 / 1e6,
            },
            paced: s.paced,
        })
    }
}

impl SlotRecord {
    pub fn encode(&self) -> [u8; SLOT_BYTES] {
        let mut b = [0u8; SLOT_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&(self.gateway_id as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.latency_sum_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.ios.to_le_bytes());
        if let Some(s) = self.share {
            b[10] = s.paced as u8;
            b[12..16].copy_from_slice(&s.period_us.to_le_bytes());
            b[40..48].copy_from_slice(&s.units.to_le_bytes());
            b[48..56].copy_from_slice(&s.shares.to_le_bytes());
        }
        let sum = checksum(&b[..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// `None` for an empty, torn or foreign slot.
    pub fn decode(b: &[u8]) -> Option<SlotRecord> {
        let b = b.get(..SLOT_BYTES)?;
        if &b[..8] == MAGIC_V1 && u64_at(b, 40) == checksum(&b[..40]) {
            return Some(SlotRecord {
                gateway_id: u32::from_le_bytes(b[8..12].try_into().ok()?),
                seq: u64_at(b, 16),
                latency_sum_ns: u64_at(b, 24),
                ios: u64_at(b, 32),
                share: None,
            });
        }
        if &b[..8] != MAGIC || u64_at(b, 56) != checksum(&b[..56]) {
            return None;
        }
        let period_us = u32::from_le_bytes(b[12..16].try_into().ok()?);
        Some(SlotRecord {
            gateway_id: u16::from_le_bytes(b[8..10].try_into().ok()?) as u32,
            seq: u64_at(b, 16),
            latency_sum_ns: u64_at(b, 24),
            ios: u64_at(b, 32),
            share: (period_us > 0).then(|| ShareRecord {
                shares: u64_at(b, 48),
                units: u64_at(b, 40),
                period_us,
                paced: b[10] & 1 == 1,
            }),
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// FNV-1a: catches a torn or foreign slot, not an adversary (the stats volume is
/// the operator's, like the datastore).
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The datastore-wide period as one gateway reads it.
#[derive(Clone, Debug, Default)]
pub struct Merged {
    /// Every live gateway's latencies, this one's included.
    pub latency: DatastoreLatency,
    /// The other live gateways' last periods (those that publish them).
    pub others: Vec<GatewayShare>,
}

/// What one gateway remembers of the others' slots (pure: bytes in, mean out).
#[derive(Clone, Debug)]
pub struct StatsMerge {
    gateway_id: u32,
    seq: u64,
    /// Per slot: the last sequence number seen and reads since it moved.
    seen: Vec<Option<(u64, u8)>>,
}

impl StatsMerge {
    pub fn new(gateway_id: u32) -> StatsMerge {
        assert!((gateway_id as usize) < SLOTS, "gateway_id out of range");
        StatsMerge {
            gateway_id,
            seq: 0,
            seen: vec![None; SLOTS],
        }
    }

    /// This gateway's slot for its period `own` (the next sequence number).
    pub fn own_slot(
        &mut self,
        own: &DatastoreLatency,
        share: Option<ShareRecord>,
    ) -> (u64, [u8; SLOT_BYTES]) {
        self.seq += 1;
        let record = SlotRecord {
            gateway_id: self.gateway_id,
            seq: self.seq,
            latency_sum_ns: own.latency_sum_ns().min(u64::MAX as u128) as u64,
            ios: own.samples(),
            share,
        };
        (self.gateway_id as u64 * SLOT_BYTES as u64, record.encode())
    }

    /// The datastore-wide period from the whole stats area: this gateway's own
    /// figures plus every other live slot's last period, and the other live
    /// gateways' shares for the fair rates.
    pub fn merge(&mut self, own: &DatastoreLatency, area: &[u8]) -> Merged {
        let mut all = Merged {
            latency: own.clone(),
            others: Vec::new(),
        };
        for (slot, bytes) in area.chunks(SLOT_BYTES).take(SLOTS).enumerate() {
            if slot == self.gateway_id as usize {
                continue;
            }
            let Some(r) = SlotRecord::decode(bytes).filter(|r| r.gateway_id as usize == slot)
            else {
                self.seen[slot] = None;
                continue;
            };
            let age = match self.seen[slot] {
                Some((seq, age)) if seq == r.seq => age.saturating_add(1),
                _ => 0,
            };
            self.seen[slot] = Some((r.seq, age));
            if age < STALE_READS {
                all.latency.record_host(r.latency_sum_ns as u128, r.ios);
                all.others.extend(r.gateway_share());
            }
        }
        all
    }

    /// Writes this gateway's slot and reads the whole area through `backend`
    /// (blocking), returning the datastore-wide period.
    pub fn exchange(
        &mut self,
        backend: &dyn Backend,
        own: &DatastoreLatency,
        share: Option<ShareRecord>,
    ) -> io::Result<Merged> {
        let (offset, slot) = self.own_slot(own, share);
        backend.write(offset, &slot)?;
        let mut area = vec![0u8; STATS_BYTES as usize];
        backend.read(0, &mut area)?;
        Ok(self.merge(own, &area))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(ms: &[u64]) -> DatastoreLatency {
        let mut d = DatastoreLatency::new();
        for m in ms {
            d.record(m * 1_000_000);
        }
        d
    }

    fn area_with(slots: &[(u32, SlotRecord)]) -> Vec<u8> {
        let mut area = vec![0u8; STATS_BYTES as usize];
        for (i, r) in slots {
            let at = *i as usize * SLOT_BYTES;
            area[at..at + SLOT_BYTES].copy_from_slice(&r.encode());
        }
        area
    }

    #[test]
    fn slots_round_trip_and_torn_or_foreign_bytes_are_refused() {
        let r = SlotRecord {
            gateway_id: 7,
            seq: 42,
            latency_sum_ns: 123_456_789,
            ios: 1000,
            share: Some(ShareRecord {
                shares: 3000,
                units: 2500,
                period_us: 250_000,
                paced: true,
            }),
        };
        let mut b = r.encode();
        assert_eq!(SlotRecord::decode(&b), Some(r));
        let share = r.gateway_share().unwrap();
        assert_eq!(
            (share.units_per_s, share.shares, share.paced),
            (10_000.0, 3000, true)
        );
        assert!((share.latency_ms - 0.123_456_789).abs() < 1e-12);
        for at in [9, 30, 50] {
            b[at] ^= 1;
            assert_eq!(SlotRecord::decode(&b), None, "torn at {at}");
            b[at] ^= 1;
        }
        assert_eq!(SlotRecord::decode(&[0u8; SLOT_BYTES]), None, "empty");
        assert_eq!(SlotRecord::decode(&[0xffu8; 10]), None, "short");
        // A slot of the first layout (an older gateway): latency only.
        let mut v1 = [0u8; SLOT_BYTES];
        v1[..8].copy_from_slice(MAGIC_V1);
        v1[8..12].copy_from_slice(&7u32.to_le_bytes());
        v1[16..24].copy_from_slice(&42u64.to_le_bytes());
        v1[24..32].copy_from_slice(&123_456_789u64.to_le_bytes());
        v1[32..40].copy_from_slice(&1000u64.to_le_bytes());
        let sum = checksum(&v1[..40]);
        v1[40..48].copy_from_slice(&sum.to_le_bytes());
        let old = SlotRecord::decode(&v1).unwrap();
        assert_eq!(old, SlotRecord { share: None, ..r });
        assert_eq!(old.gateway_share(), None);
    }

    #[test]
    fn the_mean_is_io_weighted_over_live_gateways_and_stale_ones_drop_out() {
        let mut m = StatsMerge::new(0);
        // Another gateway: 300 I/Os at 8 ms; ours: 100 at 4 ms.
        let share = ShareRecord {
            shares: 2000,
            units: 500,
            period_us: 250_000,
            paced: false,
        };
        let other = |seq| SlotRecord {
            gateway_id: 3,
            seq,
            latency_sum_ns: 300 * 8_000_000,
            ios: 300,
            share: Some(share),
        };
        let own = period(&[4; 100]);
        let mut all = m.merge(&own, &area_with(&[(3, other(1))]));
        assert_eq!(all.latency.take_mean_ms(), Some(7.0));
        assert_eq!(all.others, vec![other(1).gateway_share().unwrap()]);
        assert_eq!(all.others[0].units_per_s, 2000.0);
        assert_eq!(all.others[0].latency_ms, 8.0);
        // A record in the wrong slot (a misconfigured id) is not counted.
        let mut all = m.merge(&own, &area_with(&[(5, other(2))]));
        assert_eq!(all.latency.take_mean_ms(), Some(4.0));
        assert!(all.others.is_empty());
        // The other gateway stops: its slot counts for STALE_READS reads, then not.
        let area = area_with(&[(3, other(9))]);
        for read in 0..6 {
            let mut all = m.merge(&own, &area);
            let live = read < STALE_READS as usize;
            let mean = all.latency.take_mean_ms().unwrap();
            assert_eq!(mean, if live { 7.0 } else { 4.0 }, "read {read}");
            assert_eq!(all.others.len(), live as usize, "read {read}");
        }
        // It comes back: counted again at once.
        let mut all = m.merge(&own, &area_with(&[(3, other(10))]));
        assert_eq!(all.latency.take_mean_ms(), Some(7.0));
    }

    #[test]
    fn own_slot_is_at_the_ids_offset_with_a_rising_sequence() {
        let mut m = StatsMerge::new(5);
        let (at, b1) = m.own_slot(&period(&[2, 4]), None);
        let (_, b2) = m.own_slot(&DatastoreLatency::new(), None);
        assert_eq!(at, 5 * SLOT_BYTES as u64);
        let (r1, r2) = (
            SlotRecord::decode(&b1).unwrap(),
            SlotRecord::decode(&b2).unwrap(),
        );
        assert_eq!((r1.seq, r1.ios, r1.latency_sum_ns), (1, 2, 6_000_000));
        assert_eq!((r2.seq, r2.ios), (2, 0));
    }
}
