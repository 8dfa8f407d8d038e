//! RAID controller description: host-side and drive-side bandwidth caps, per-I/O
//! processing cost, cache size and cache policies (as in MegaRAID/PERC controller UIs).

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, check_between};

/// When a write is acknowledged.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritePolicy {
    /// Acknowledge after the drives have the data.
    WriteThrough,
    /// Acknowledge when the data is in controller cache — only with a good battery /
    /// flash backup; otherwise the controller falls back to write-through.
    WriteBack,
    /// Write-back even without a good battery ("Always Write Back", forced).
    AlwaysWriteBack,
}

/// Controller read-ahead.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPolicy {
    /// "Normal read": no prefetch.
    NoReadAhead,
    /// Prefetch ahead of a stream as soon as one read continues the previous one.
    ReadAhead,
    /// Prefetch once the two most recent reads of a stream were sequential.
    Adaptive,
}

/// Whether read data is kept in controller cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoPolicy {
    /// Read data passes through and stays in cache (re-reads hit).
    Cached,
    /// Read data goes straight to the host (prefetched data is still cached).
    Direct,
}

/// State of the cache backup (BBU or CacheVault flash module).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatteryState {
    Good,
    Absent,
    /// Present but failed / learning / discharged.
    Failed,
}

/// A RAID controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerSpec {
    /// Host-side payload bandwidth per direction (PCIe is full duplex), MB/s.
    pub bandwidth_mbps: f64,
    /// Drive-side bandwidth per direction (the SAS links to the drives, full duplex),
    /// MB/s, counting every byte a drive command moves: a RAID 10 write crosses it
    /// twice, a parity update's reads and writes each once. None: not modelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_mbps: Option<f64>,
    /// Host I/Os the controller processor can handle per second (per-I/O overhead =
    /// 1 / this).
    pub max_iops: f64,
    /// Cache memory, MiB.
    pub cache_mib: u32,
    /// Share of the cache that may hold dirty (not yet destaged) write data.
    #[serde(default = "default_dirty_fraction")]
    pub dirty_fraction: f64,
    /// Prefetch window ahead of a detected sequential stream, bytes.
    #[serde(default = "default_read_ahead_bytes")]
    pub read_ahead_bytes: u32,
    pub write_policy: WritePolicy,
    pub read_policy: ReadPolicy,
    pub io_policy: IoPolicy,
    pub battery: BatteryState,
}

/// The LSISAS2208's drive side: 8 SAS 6 Gb/s lanes, 4,800 MB/s after 8b/10b, ≈ 85 %
/// of it payload (see [`ControllerSpec::pcie_gen3`]), MB/s per direction.
pub const SAS2208_BACKEND_MBPS: f64 = 4_000.0;

fn default_dirty_fraction() -> f64 {
    0.75
}
fn default_read_ahead_bytes() -> u32 {
    4 << 20
}

impl ControllerSpec {
    /// PCIe Gen2 x8 RAID controller (LSI MegaRAID SAS 9266-8i / 9266CV-8i: dual-core
    /// LSISAS2208 ROC at 800 MHz, 1 GB DDR3, CacheVault flash backup), the seed's
    /// controller.
    ///
    /// Bandwidth derivation: Gen2 signals 5 GT/s per lane; 8b/10b leaves 500 MB/s, so
    /// x8 = 4,000 MB/s per direction. Transaction-layer overhead with the common
    /// 128-byte max payload is ≈ 20 B header/framing + 8 B link-layer per TLP
    /// (128/156 ≈ 82 %) → ≈ 3,280 MB/s; device-to-host reads additionally pay
    /// flow-control/ACK DLLPs and the ROC's DMA descriptor traffic (≈ 15 %), giving
    /// ≈ 2,800 MB/s of payload. Per-I/O cost: LSI rates the SAS2208 at ≈ 465,000 IOPS.
    ///
    /// Drive side: the SAS2208's 8 SAS 6 Gb/s lanes, the same as the Gen3 card's
    /// ([`Self::pcie_gen3`]), so the same 4,000 MB/s per direction. CALIBRATION
    /// carried over: that figure is the Gen3 card's, set from 002 Figure 15; on this
    /// card it predicts what the mirror costs (002 Figure 7's RAID 10 writes).
    pub fn pcie_gen2() -> Self {
        Self {
            bandwidth_mbps: 2_800.0,
            backend_mbps: Some(SAS2208_BACKEND_MBPS),
            max_iops: 465_000.0,
            cache_mib: 1024,
            dirty_fraction: default_dirty_fraction(),
            read_ahead_bytes: default_read_ahead_bytes(),
            write_policy: WritePolicy::WriteBack,
            read_policy: ReadPolicy::NoReadAhead,
            io_policy: IoPolicy::Cached,
            battery: BatteryState::Good,
        }
    }

    /// PCIe Gen3 x8 RAID controller (LSI MegaRAID SAS 9271-8i / 9271CV-8i, same
    /// SAS2208 ROC family, 1 GB cache).
    ///
    /// Bandwidth derivation: Gen3 x8 = 8 GT/s × 8 lanes × 128/130 ≈ 7,880 MB/s; the
    /// Gen2 card's payload share of its link (2,800 of 4,000: 0.70) leaves ≈ 5,500 MB/s,
    /// so PCIe is no longer the limit. The drive side is: 8 SAS 6 Gb/s lanes × 600
    /// MB/s (after 8b/10b) = 4,800 MB/s, of which SAS framing and the ROC's DMA engine
    /// leave ≈ 85 % → ≈ 4,000 MB/s ([`SAS2208_BACKEND_MBPS`]; CALIBRATION: the 85 % was
    /// chosen to land on 002 Figure 15's 4 GB/s).
    pub fn pcie_gen3() -> Self {
        Self {
            bandwidth_mbps: 5_500.0,
            ..Self::pcie_gen2()
        }
    }

    /// The Cisco UCS C220 M3's embedded RAID (UCSC-RAID-ROM55: the chipset's SAS
    /// ports with LSI's software RAID, no cache, so write-through, no read-ahead,
    /// direct I/O). CALIBRATION: `bandwidth_mbps = 1,000` is seed 002's Figure 19
    /// peak ("Read bandwidth on embedded RAID peaked at 1 GBps"); no datasheet
    /// gives it. Its per-I/O rate is the MegaRAID's order, not measured.
    pub fn embedded_rom55() -> Self {
        Self {
            bandwidth_mbps: 1_000.0,
            backend_mbps: None,
            max_iops: 100_000.0,
            cache_mib: 0,
            write_policy: WritePolicy::WriteThrough,
            read_policy: ReadPolicy::NoReadAhead,
            io_policy: IoPolicy::Direct,
            battery: BatteryState::Absent,
            ..Self::pcie_gen2()
        }
    }

    pub fn preset(name: &str) -> Result<Self, ModelError> {
        match name {
            "pcie-gen2" => Ok(Self::pcie_gen2()),
            "pcie-gen3" => Ok(Self::pcie_gen3()),
            "embedded-rom55" => Ok(Self::embedded_rom55()),
            _ => Err(ModelError::UnknownPreset {
                kind: "controller",
                name: name.to_string(),
                known: "pcie-gen2, pcie-gen3, embedded-rom55".into(),
            }),
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        const W: &str = "controller spec";
        check_between(
            W,
            "bandwidth_mbps",
            self.bandwidth_mbps,
            (1.0, 1e9),
            "must be 1-1e9 MB/s",
        )?;
        if let Some(b) = self.backend_mbps {
            check_between(W, "backend_mbps", b, (1.0, 1e9), "must be 1-1e9 MB/s")?;
        }
        let iops = "must be 1-1e12 I/Os per second";
        check_between(W, "max_iops", self.max_iops, (1.0, 1e12), iops)?;
        if !(self.dirty_fraction.is_finite()
            && self.dirty_fraction > 0.0
            && self.dirty_fraction <= 1.0)
        {
            return Err(ModelError::InvalidField {
                what: W,
                field: "dirty_fraction",
                value: self.dirty_fraction.to_string(),
                reason: "must be in (0, 1]",
            });
        }
        if self.cache_mib == 0 && self.effective_write_back() {
            return Err(ModelError::InvalidField {
                what: W,
                field: "cache_mib",
                value: "0".into(),
                reason: "write-back needs a cache",
            });
        }
        Ok(())
    }

    /// Write-back is in effect: requested with a good battery, or forced.
    pub fn effective_write_back(&self) -> bool {
        match self.write_policy {
            WritePolicy::WriteThrough => false,
            WritePolicy::WriteBack => self.battery == BatteryState::Good,
            WritePolicy::AlwaysWriteBack => true,
        }
    }
}
