//! A host↔array link (FC port, Ethernet NIC): FIFO serialisation of the payload at
//! the link's payload bandwidth plus a fixed latency, full duplex.
//!
//! The payload of a read flows array→host, that of a write host→array; each
//! direction is its own FIFO. A command (or a write's status, a read's request) is
//! tiny: it costs only the latency ([`Link::command_latency_ns`]).
//!
//! Use as a [`Component`]: submit a write before the array (its payload crosses
//! host→array), a read after the array returned its data (payload array→host); the
//! completion is when the last byte has arrived at the far end.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, check_between};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos, round_ns};

/// A link's payload bandwidth (per direction) and one-way latency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Payload megabytes (10^6 B) per second per direction.
    pub bandwidth_mbps: f64,
    /// One-way latency (switch hops, HBA/NIC processing), µs.
    pub latency_us: f64,
}

impl LinkSpec {
    /// 4 Gb FC: 4.25 GBd with 8b/10b = 425 MB/s of frames; FC frames carry up to
    /// 2,112 B of payload in 2,148 B (≈ 98 %), and inter-frame idles leave ≈ 400 MB/s.
    pub fn fc_4g() -> Self {
        Self {
            bandwidth_mbps: 400.0,
            latency_us: 10.0,
        }
    }

    /// 8 Gb FC: 8.5 GBd with 8b/10b = 850 MB/s of frames → ≈ 800 MB/s payload.
    pub fn fc_8g() -> Self {
        Self {
            bandwidth_mbps: 800.0,
            latency_us: 10.0,
        }
    }

    /// 10 GbE (iSCSI/NFS): 10.3125 GBd with 64b/66b = 1,250 MB/s of MAC data. A
    /// 1,500 B MTU frame costs 1,538 B on the wire (preamble 8, header 14, FCS 4, IFG
    /// 12) and carries 1,448 B of TCP payload (IP 20 + TCP 20 + timestamps 12):
    /// 1,250 × 1,448 / 1,538 ≈ 1,177 MB/s; iSCSI PDU headers (48 B per ≤ 8 KiB … 256
    /// KiB PDU) take ≈ 1–2 % more → ≈ 1,150 MB/s.
    pub fn ten_gbe() -> Self {
        Self {
            bandwidth_mbps: 1_150.0,
            latency_us: 20.0,
        }
    }

    /// 1 GbE: 125 MB/s × 1,448 / 1,538 ≈ 117.7 MB/s TCP payload, less iSCSI headers
    /// → ≈ 115 MB/s.
    pub fn one_gbe() -> Self {
        Self {
            bandwidth_mbps: 115.0,
            latency_us: 50.0,
        }
    }

    /// Named presets: `fc-4g`, `fc-8g`, `10gbe`, `1gbe`.
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        match name {
            "fc-4g" => Ok(Self::fc_4g()),
            "fc-8g" => Ok(Self::fc_8g()),
            "10gbe" => Ok(Self::ten_gbe()),
            "1gbe" => Ok(Self::one_gbe()),
            _ => Err(ModelError::UnknownPreset {
                kind: "link",
                name: name.to_string(),
                known: "fc-4g, fc-8g, 10gbe, 1gbe".into(),
            }),
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        const W: &str = "link spec";
        check_between(
            W,
            "bandwidth_mbps",
            self.bandwidth_mbps,
            (0.1, 1e9),
            "must be 0.1-1e9 MB/s",
        )?;
        check_between(
            W,
            "latency_us",
            self.latency_us,
            (0.0, 1e7),
            "must be 0-1e7 µs (10 s)",
        )
    }
}

/// A full-duplex link as a pure queueing state machine.
#[derive(Clone, Debug)]
pub struct Link {
    spec: LinkSpec,
    ns_per_byte: f64,
    latency_ns: Nanos,
    /// When each direction's serialiser is free: [host→array, array→host].
    free_ns: [Nanos; 2],
    busy: [Nanos; 2],
    /// Transfers in flight per direction, as (arrival, sequence, token). Each direction
    /// is a FIFO serialiser with a fixed latency, so arrivals come in submission order:
    /// merging the two fronts by (arrival, sequence) is the order a heap would give.
    in_flight: [VecDeque<(Nanos, u64, u64)>; 2],
    seq: u64,
}

impl Link {
    pub fn new(spec: &LinkSpec) -> Result<Self, ModelError> {
        spec.validate()?;
        Ok(Self {
            spec: spec.clone(),
            ns_per_byte: 1e3 / spec.bandwidth_mbps,
            latency_ns: (spec.latency_us * 1e3).round() as Nanos,
            free_ns: [0; 2],
            busy: [0; 2],
            in_flight: [VecDeque::new(), VecDeque::new()],
            seq: 0,
        })
    }

    pub fn spec(&self) -> &LinkSpec {
        &self.spec
    }

    /// One-way delay of a command or status message.
    pub fn command_latency_ns(&self) -> Nanos {
        self.latency_ns
    }

    /// Eager form: when a payload of `bytes` in the direction of `dir` submitted at
    /// `now` has fully arrived (reserves the serialiser).
    pub fn transfer(&mut self, now: Nanos, dir: IoDir, bytes: u32) -> Nanos {
        let lane = Self::lane(dir);
        let start = now.max(self.free_ns[lane]);
        let ser = round_ns(bytes as f64 * self.ns_per_byte);
        self.free_ns[lane] = start + ser;
        self.busy[lane] += ser;
        start + ser + self.latency_ns
    }

    fn lane(dir: IoDir) -> usize {
        match dir {
            IoDir::Write => 0,
            IoDir::Read => 1,
        }
    }

    /// The direction whose next arrival comes first (by arrival, then submission).
    fn next_lane(&self) -> Option<usize> {
        match (self.in_flight[0].front(), self.in_flight[1].front()) {
            (Some(w), Some(r)) => Some(if (r.0, r.1) < (w.0, w.1) { 1 } else { 0 }),
            (Some(_), None) => Some(0),
            (None, Some(_)) => Some(1),
            (None, None) => None,
        }
    }

    /// Serialisation busy time of each direction: [host→array, array→host].
    pub fn busy_by_direction_ns(&self) -> [Nanos; 2] {
        self.busy
    }
}

impl Component for Link {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        let at = self.transfer(now, io.dir, io.size_bytes);
        self.seq += 1;
        self.in_flight[Self::lane(io.dir)].push_back((at, self.seq, token));
    }

    fn next_event_ns(&self) -> Option<Nanos> {
        self.next_lane().map(|l| self.in_flight[l][0].0)
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        while let Some(l) = self.next_lane() {
            let (at, _, token) = self.in_flight[l][0];
            if at > now {
                break;
            }
            self.in_flight[l].pop_front();
            done.push(Completion { token, at_ns: at });
        }
    }

    /// Mean of the two directions' serialisation busy time.
    fn busy_ns(&self) -> Nanos {
        (self.busy[0] + self.busy[1]) / 2
    }
}
