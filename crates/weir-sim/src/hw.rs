//! Building the hardware of a case from its TOML description.
//!
//! `[array]` is a weir-model `ArraySpec` (`controller`, `raid`, `drive`, `policy`), or
//! `preset = "15k-sas-raid5x24"` (a weir-model array preset), or
//! `ideal = { servers, service_us, mbps }` (an [`IdealArraySpec`]), or
//! `device = "ramsan-400"` (+ `count = N`: a flash device of the library, or N
//! striped, as the whole array), or
//! `ceph = { osds, replicas, drive, … }` (a weir-model `CephSpec`: a RADOS pool
//! behind the hosts, which are then its RBD gateways). Links are
//! weir-model `LinkSpec`s: a preset name (`fc-4g`, `fc-8g`, `10gbe`, `1gbe`) or a
//! table (`bandwidth_mbps`, `latency_us`); `"none"` means no link at all.

use weir_model::{
    Array, ArraySpec, CephCluster, CephSpec, Completion, Component, DeviceIo, DriveRef, DriveSpec,
    IoDir, Link, LinkSpec, Nanos, Processor, ProcessorSpec, Ssd,
};

/// Every simulated component, statically dispatched.
pub(crate) enum Hw {
    Link(Link),
    /// Parallel FIFO servers: an ideal array, a flash device's channels, a CPU.
    Cpu(Processor),
    /// A flash device of the hardware library (one or more SSDs striped).
    Ssd(Box<Ssd>),
    Array(Box<Array>),
    Ceph(Box<CephCluster>),
}

/// A component's counters at one moment (for utilisation over the measured interval).
#[derive(Clone, Debug)]
pub(crate) struct PartSnapshot {
    pub name: String,
    pub kind: &'static str,
    pub busy_ns: Nanos,
    pub ios: u64,
    pub bytes: u64,
}

impl Hw {
    /// Usable capacity, when the component has one.
    pub(crate) fn capacity_bytes(&self) -> Option<u64> {
        match self {
            Hw::Array(a) => Some(a.capacity_bytes()),
            Hw::Ceph(c) => Some(c.capacity_bytes()),
            Hw::Ssd(s) => Some(s.spec().capacity_bytes),
            _ => None,
        }
    }

    /// Internal parts worth reporting (controller, drives) with their counters.
    pub(crate) fn parts(&self) -> Vec<PartSnapshot> {
        match self {
            Hw::Array(a) => {
                let st = a.stats();
                let bytes = st.host_read_bytes + st.host_write_bytes;
                let ns_per_byte = 1e3 / a.controller().bandwidth_mbps;
                let mut parts = vec![PartSnapshot {
                    name: "controller".into(),
                    kind: "controller",
                    busy_ns: (bytes as f64 * ns_per_byte) as Nanos,
                    ios: st.host_reads + st.host_writes,
                    bytes,
                }];
                for d in a.drive_stats() {
                    parts.push(PartSnapshot {
                        name: format!("drive {}", d.drive),
                        kind: "drive",
                        busy_ns: d.stats.busy_ns,
                        ios: d.stats.reads + d.stats.writes,
                        bytes: d.stats.read_bytes + d.stats.write_bytes,
                    });
                }
                parts
            }
            Hw::Ceph(c) => c
                .osd_stats()
                .iter()
                .enumerate()
                .flat_map(|(i, o)| {
                    [
                        PartSnapshot {
                            name: format!("osd {i} cpu"),
                            kind: "osd-cpu",
                            busy_ns: o.cpu_busy_ns / c.spec().cores_per_osd as u64,
                            ios: 0,
                            bytes: 0,
                        },
                        PartSnapshot {
                            name: format!("osd {i} drive"),
                            kind: "drive",
                            busy_ns: o.drive_busy_ns,
                            ios: o.drive_ios,
                            bytes: o.drive_bytes,
                        },
                    ]
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Component for Hw {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        match self {
            Hw::Link(l) => l.submit(now, io, token),
            Hw::Cpu(a) => a.submit(now, io, token),
            Hw::Ssd(s) => s.submit(now, io, token),
            Hw::Array(a) => a.submit(now, io, token),
            Hw::Ceph(c) => c.submit(now, io, token),
        }
    }
    fn submit_urgent(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        match self {
            Hw::Link(l) => l.submit_urgent(now, io, token),
            Hw::Cpu(a) => a.submit_urgent(now, io, token),
            Hw::Ssd(s) => s.submit_urgent(now, io, token),
            Hw::Array(a) => a.submit_urgent(now, io, token),
            Hw::Ceph(c) => c.submit_urgent(now, io, token),
        }
    }
    fn submit_from(&mut self, now: Nanos, io: DeviceIo, token: u64, client: u32, urgent: bool) {
        match self {
            Hw::Ceph(c) => c.submit_from(now, io, token, client, urgent),
            _ if urgent => self.submit_urgent(now, io, token),
            _ => self.submit(now, io, token),
        }
    }
    fn next_event_ns(&self) -> Option<Nanos> {
        match self {
            Hw::Link(l) => l.next_event_ns(),
            Hw::Cpu(a) => a.next_event_ns(),
            Hw::Ssd(s) => s.next_event_ns(),
            Hw::Array(a) => a.next_event_ns(),
            Hw::Ceph(c) => c.next_event_ns(),
        }
    }
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        match self {
            Hw::Link(l) => l.advance(now, done),
            Hw::Cpu(a) => a.advance(now, done),
            Hw::Ssd(s) => s.advance(now, done),
            Hw::Array(a) => a.advance(now, done),
            Hw::Ceph(c) => c.advance(now, done),
        }
    }
    fn busy_ns(&self) -> Nanos {
        match self {
            Hw::Link(l) => l.busy_ns(),
            Hw::Cpu(a) => a.busy_ns(),
            Hw::Ssd(s) => s.busy_ns(),
            Hw::Array(a) => a.busy_ns(),
            Hw::Ceph(c) => c.busy_ns(),
        }
    }
}

/// `Ok(None)`: no link.
pub(crate) fn build_link(spec: &toml::Value) -> Result<Option<Hw>, String> {
    let link_spec = match spec {
        toml::Value::String(s) if s == "none" => return Ok(None),
        toml::Value::String(s) => LinkSpec::preset(s).map_err(|e| format!("{e} (or \"none\")"))?,
        other => other
            .clone()
            .try_into::<LinkSpec>()
            .map_err(|e| e.message().to_string())?,
    };
    Ok(Some(Hw::Link(
        Link::new(&link_spec).map_err(|e| e.to_string())?,
    )))
}

/// A cache's flash device and the operations it serves at once (its channels):
/// `count` SSDs of the hardware library striped (weir-model `Ssd`), a processor
/// preset serving the hits (its cores), or an ideal array of `servers` channels.
pub(crate) fn build_flash(f: &crate::topology::FlashSpec) -> Result<(Hw, u32), String> {
    use crate::topology::FlashSpec;
    match f {
        FlashSpec::Device { device, count } => {
            let drive: DriveRef = device
                .clone()
                .try_into()
                .map_err(|e: toml::de::Error| format!("flash device: {}", e.message()))?;
            let ssd = match drive.spec().map_err(|e| format!("flash device: {e}"))? {
                DriveSpec::Ssd(s) => s,
                DriveSpec::Hdd(_) => {
                    return Err(format!(
                        "flash device {device} is a hard disk; a flash device is an SSD \
                         (\"pcie-flash\", \"sata-ssd\" or {{ kind = \"ssd\", … }})"
                    ));
                }
            };
            let ssd = ssd
                .striped(*count)
                .map_err(|e| format!("flash device: {e}"))?;
            let channels = ssd.channels;
            let dev = Ssd::new(&ssd).map_err(|e| format!("flash device: {e}"))?;
            Ok((Hw::Ssd(Box::new(dev)), channels))
        }
        FlashSpec::Processor { processor } => {
            let spec = processor_spec(processor)?;
            let cpu = Processor::new(&spec).map_err(|e| e.to_string())?;
            Ok((Hw::Cpu(cpu), spec.cores))
        }
        FlashSpec::Ideal {
            servers,
            service_us,
            mbps,
        } => {
            let spec = IdealArraySpec {
                servers: *servers,
                service_us: *service_us,
                mbps: *mbps,
            };
            let cpu = spec.build().map_err(|e| format!("flash: {e}"))?;
            Ok((Hw::Cpu(cpu), *servers))
        }
    }
}

/// Builds the array; `needed_bytes` is the space the VMs' disks take.
pub(crate) fn build_array(spec: &toml::Table, seed: u64, needed_bytes: u64) -> Result<Hw, String> {
    if let Some(ideal) = spec.get("ideal") {
        if spec.len() != 1 {
            return Err("an `ideal` array takes no other keys".into());
        }
        let ideal: IdealArraySpec = ideal
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| format!("ideal: {}", e.message()))?;
        return Ok(Hw::Cpu(ideal.build().map_err(|e| format!("ideal: {e}"))?));
    }
    if spec.contains_key("device") {
        // One flash device of the library (or `count` striped) as the whole array.
        let flash = crate::topology::FlashSpec::try_from(toml::Value::Table(spec.clone()))?;
        return fits(build_flash(&flash)?.0, needed_bytes);
    }
    if let Some(ceph) = spec.get("ceph") {
        if spec.len() != 1 {
            return Err("a `ceph` cluster takes no other keys".into());
        }
        let ceph: CephSpec = ceph
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| format!("ceph: {}", e.message()))?;
        let cluster = CephCluster::new(&ceph).map_err(|e| format!("ceph: {e}"))?;
        return fits(Hw::Ceph(Box::new(cluster)), needed_bytes);
    }
    let array_spec = match spec.get("preset") {
        Some(p) => {
            if spec.len() != 1 {
                return Err("an array `preset` takes no other keys".into());
            }
            let name = p.as_str().ok_or("preset must be a string")?;
            ArraySpec::preset(name).map_err(|e| e.to_string())?
        }
        None => toml::Value::Table(spec.clone())
            .try_into::<ArraySpec>()
            .map_err(|e| e.message().to_string())?,
    };
    let array = Array::new(&array_spec, seed).map_err(|e| e.to_string())?;
    fits(Hw::Array(Box::new(array)), needed_bytes)
}

/// The array, if the VMs' disks fit on it.
fn fits(array: Hw, needed_bytes: u64) -> Result<Hw, String> {
    let capacity = array.capacity_bytes().unwrap_or(u64::MAX);
    if needed_bytes > capacity {
        return Err(format!(
            "the VMs' disks need {:.1} GiB but the array holds {:.1} GiB",
            needed_bytes as f64 / (1u64 << 30) as f64,
            capacity as f64 / (1u64 << 30) as f64
        ));
    }
    Ok(array)
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

impl IdealArraySpec {
    /// The ideal array as the processor queue it is: `servers` cores, each request
    /// `service_us` plus its bytes at `mbps`.
    pub(crate) fn build(&self) -> Result<Processor, String> {
        if self.servers == 0 || self.servers > 100_000 {
            return Err(format!("servers must be 1-100000, got {}", self.servers));
        }
        if self.service_us == 0.0 && self.mbps == 0.0 {
            return Err("an ideal array needs service_us > 0 or mbps > 0".into());
        }
        Processor::new(&ProcessorSpec {
            cores: self.servers,
            read_us: self.service_us,
            write_us: self.service_us,
            mbps: self.mbps,
        })
        .map_err(|e| {
            // Say it in the spec's own words.
            e.to_string()
                .replace("processor", "ideal/flash device")
                .replace("read_us", "service_us")
        })
    }
}

/// A processor: a preset name (`PROCESSOR_PRESETS`) or a table (`cores`, `read_us`,
/// `write_us`, `mbps`).
pub(crate) fn build_processor(spec: &toml::Value) -> Result<Hw, String> {
    let spec = processor_spec(spec)?;
    Ok(Hw::Cpu(Processor::new(&spec).map_err(|e| e.to_string())?))
}

fn processor_spec(spec: &toml::Value) -> Result<ProcessorSpec, String> {
    match spec {
        toml::Value::String(s) => ProcessorSpec::preset(s).map_err(|e| e.to_string()),
        toml::Value::Table(_) => spec
            .clone()
            .try_into::<ProcessorSpec>()
            .map_err(|e| e.message().to_string()),
        other => Err(format!(
            "a processor is a preset name or a table {{ cores, read_us, write_us, mbps }}, got {}",
            other.type_str()
        )),
    }
}

/// Direction of a request as the hardware sees it.
pub(crate) fn dir_of(read: bool) -> IoDir {
    if read { IoDir::Read } else { IoDir::Write }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_array_is_fifo_over_parallel_servers() {
        let mut a = (IdealArraySpec {
            servers: 2,
            service_us: 1000.0,
            mbps: 0.0,
        })
        .build()
        .unwrap();
        let io = DeviceIo {
            offset_bytes: 0,
            size_bytes: 4096,
            dir: IoDir::Read,
        };
        for t in 0..3 {
            a.submit(0, io, t);
        }
        assert_eq!(a.next_event_ns(), Some(1_000_000));
        let mut done = Vec::new();
        a.advance(1_500_000, &mut done);
        assert_eq!(done.len(), 2);
        assert_eq!(a.next_event_ns(), Some(2_000_000));
        a.advance(2_000_000, &mut done);
        assert_eq!(
            done[2],
            Completion {
                token: 2,
                at_ns: 2_000_000
            }
        );
        assert_eq!(a.busy_ns(), 1_500_000);
    }
}
