//! Building the hardware of a case from its TOML description.
//!
//! `[array]` is a weir-model `ArraySpec`, except that a table with an `ideal` key
//! builds an [`IdealArray`] (N identical servers, fixed service time plus transfer);
//! links are weir-model `LinkSpec`s (a preset name or a table), and `"none"` means no
//! link at all.

use std::collections::VecDeque;
use weir_model::{Completion, Component, DeviceIo, IoDir, Nanos};

pub(crate) type BoxedComponent = Box<dyn Component>;

/// `Ok(None)`: no link.
pub(crate) fn build_link(spec: &toml::Value) -> Result<Option<BoxedComponent>, String> {
    if spec.as_str() == Some("none") {
        return Ok(None);
    }
    let link = crate::model_glue::link(spec)?;
    Ok(Some(link))
}

/// Builds the array; `needed_bytes` is the space the VMs' disks take.
pub(crate) fn build_array(spec: &toml::Table, seed: u64, needed_bytes: u64) -> Result<BoxedComponent, String> {
    if let Some(ideal) = spec.get("ideal") {
        if spec.len() != 1 {
            return Err("an `ideal` array takes no other keys".into());
        }
        let ideal: IdealArraySpec = ideal.clone().try_into().map_err(|e: toml::de::Error| format!("ideal: {}", e.message()))?;
        return Ok(Box::new(IdealArray::new(&ideal)?));
    }
    crate::model_glue::array(spec, seed, needed_bytes)
}

/// An array of identical parallel servers: each request takes
/// `service_us + size / mbps` on one server, FIFO. No caching, no RAID, no seeks:
/// the reference against which the QoS invariants are easiest to read.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdealArraySpec {
    pub servers: u32,
    pub service_us: f64,
    /// Transfer rate of one server, MB/s (0: transfers take no time).
    #[serde(default)]
    pub mbps: f64,
}

pub(crate) struct IdealArray {
    servers: u32,
    service_ns: f64,
    ns_per_byte: f64,
    queue: VecDeque<(u64, Nanos)>,
    /// In service: (finish time, token), kept sorted by finish time.
    running: VecDeque<(Nanos, u64)>,
    busy_ns: u128,
}

impl IdealArray {
    fn new(spec: &IdealArraySpec) -> Result<Self, String> {
        if spec.servers == 0 || spec.servers > 100_000 {
            return Err(format!("ideal.servers must be 1-100000, got {}", spec.servers));
        }
        if !(spec.service_us.is_finite() && spec.service_us >= 0.0) || !(spec.mbps.is_finite() && spec.mbps >= 0.0) {
            return Err("ideal.service_us and ideal.mbps must be finite and ≥ 0".into());
        }
        if spec.service_us == 0.0 && spec.mbps == 0.0 {
            return Err("an ideal array needs service_us > 0 or mbps > 0".into());
        }
        Ok(IdealArray {
            servers: spec.servers,
            service_ns: spec.service_us * 1e3,
            ns_per_byte: if spec.mbps > 0.0 { 1e3 / spec.mbps } else { 0.0 },
            queue: VecDeque::new(),
            running: VecDeque::new(),
            busy_ns: 0,
        })
    }

    fn start(&mut self, at: Nanos, token: u64, size: u32) {
        let service = (self.service_ns + size as f64 * self.ns_per_byte).round().max(1.0) as Nanos;
        self.busy_ns += service as u128;
        let finish = at + service;
        let pos = self.running.partition_point(|&(f, _)| f <= finish);
        self.running.insert(pos, (finish, token));
    }
}

impl Component for IdealArray {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        if (self.running.len() as u32) < self.servers {
            self.start(now, token, io.size_bytes);
        } else {
            self.queue.push_back((token, io.size_bytes as Nanos));
        }
    }
    fn next_event_ns(&self) -> Option<Nanos> {
        self.running.front().map(|&(f, _)| f)
    }
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        while let Some(&(finish, token)) = self.running.front() {
            if finish > now {
                break;
            }
            self.running.pop_front();
            done.push(Completion { token, at_ns: finish });
            if let Some((t, size)) = self.queue.pop_front() {
                self.start(finish, t, size as u32);
            }
        }
    }
    fn busy_ns(&self) -> Nanos {
        (self.busy_ns / self.servers as u128) as Nanos
    }
}

/// Direction helper for links: reads flow toward the host.
pub(crate) fn dir_of(read: bool) -> IoDir {
    if read { IoDir::Read } else { IoDir::Write }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_array_is_fifo_over_parallel_servers() {
        let mut a = IdealArray::new(&IdealArraySpec { servers: 2, service_us: 1000.0, mbps: 0.0 }).unwrap();
        let io = DeviceIo { offset_bytes: 0, size_bytes: 4096, dir: IoDir::Read };
        for t in 0..3 {
            a.submit(0, io, t);
        }
        assert_eq!(a.next_event_ns(), Some(1_000_000));
        let mut done = Vec::new();
        a.advance(1_500_000, &mut done);
        assert_eq!(done.len(), 2);
        assert_eq!(a.next_event_ns(), Some(2_000_000));
        a.advance(2_000_000, &mut done);
        assert_eq!(done[2], Completion { token: 2, at_ns: 2_000_000 });
        assert_eq!(a.busy_ns(), 1_500_000);
    }
}
