//! # weir-scenario — the scenario file's data model
//!
//! The TOML format of `scenarios/*.toml` (documented in scenarios/README.md) as serde
//! types, unknown fields rejected. One schema for two readers: the simulator
//! (`weir sim`, crate weir-sim, which builds and validates every section) and the load
//! generator (`weir load`, crate weir-load, which runs the `[scenario]`,
//! `[[workload]]`, `[[model]]` and `[[vm]]` parts against real storage and ignores the
//! simulated hardware). The types only say what shape a file has; what each tool
//! requires of it (the simulator: a name, a duration, an `[array]`, a host for every
//! VM) each tool checks.

use serde::{Deserialize, Deserializer, Serialize};
use weir_qos::{CongestionConfig, DepthConfig, Policy, Shares};
use weir_workload::{AccessSpec, ModelSpec};

/// A whole scenario file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    #[serde(default)]
    pub scenario: ScenarioHeader,
    #[serde(default)]
    pub datastore: DatastoreSpec,
    /// The array (weir-model `ArraySpec`), kept as TOML here and built per case by
    /// the simulator (which needs one); `weir load` ignores it.
    #[serde(default)]
    pub array: toml::Table,
    /// Appliance-side QoS (like ioControl): on when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_qos: Option<ArrayQosSpec>,
    /// User-defined QoS policies (the five built-ins of 000 are always there).
    #[serde(default)]
    pub policy: Vec<Policy>,
    /// Array volumes (LUNs) the VMs' disks live on; none: one volume named "datastore".
    #[serde(default)]
    pub volume: Vec<VolumeSpec>,
    #[serde(default)]
    pub host: Vec<HostSpec>,
    #[serde(default)]
    pub vm: Vec<VmSpec>,
    /// Named access specifications (`vm.workload` may also name a built-in profile).
    #[serde(default)]
    pub workload: Vec<AccessSpec>,
    /// Application models (`kind = "vdi" | "oltp" | "exchange"`), named like
    /// workloads: a `[[vm]]`'s `workload` may name one.
    #[serde(default)]
    pub model: Vec<ModelSpec>,
    /// A flash read cache in front of the array (the flash tier of a hybrid array),
    /// optionally clone-aware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_cache: Option<ArrayCacheSpec>,
    #[serde(default, skip_serializing)]
    pub case: Vec<CaseSpec>,
}

/// A named interval of the run (simulated seconds from 0, warm-up included).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    pub name: String,
    pub start_s: f64,
    pub end_s: f64,
}

/// A flash device serving cache hits. Either a device of the hardware library —
/// a weir-model SSD drive by preset name (`"pcie-flash"`: a Fusion-io ioDrive2;
/// `"sata-ssd"`: an Intel 710) or as a table (`{ kind = "ssd", … }`), `count` of
/// them striped — or a storage processor that serves the hits (a weir-model
/// processor preset: its cores, each hit its fixed cost plus its bytes) — or an
/// abstract device of `servers` parallel FIFO channels, each hit taking
/// `service_us + size / mbps` on one of them.
///
/// In TOML: `flash = "pcie-flash"`, `flash = { device = "pcie-flash", count = 2 }`,
/// `flash = { processor = "iocontrol-n5-150-sp" }` or `flash = { servers = 8,
/// service_us = 250, mbps = 400 }`. Default: one `pcie-flash` card.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum FlashSpec {
    Device {
        device: toml::Value,
        count: u32,
    },
    Processor {
        processor: toml::Value,
    },
    Ideal {
        servers: u32,
        service_us: f64,
        mbps: f64,
    },
}

impl Default for FlashSpec {
    fn default() -> Self {
        FlashSpec::Device {
            device: toml::Value::String("pcie-flash".into()),
            count: 1,
        }
    }
}

const FLASH_FORMS: &str = "a flash device is a drive preset name (\"pcie-flash\", \"sata-ssd\"), \
     { device = …, count = N }, { processor = … } or { servers = N, service_us = µs, mbps = MB/s }";

impl TryFrom<toml::Value> for FlashSpec {
    type Error = String;

    fn try_from(v: toml::Value) -> Result<Self, String> {
        let t = match v {
            toml::Value::String(_) => {
                return Ok(FlashSpec::Device {
                    device: v,
                    count: 1,
                });
            }
            toml::Value::Table(t) if !t.is_empty() => t,
            other => return Err(format!("{FLASH_FORMS}, got {other}")),
        };
        let allowed: &[&str] = if t.contains_key("device") {
            &["device", "count"]
        } else if t.contains_key("processor") {
            &["processor"]
        } else {
            &["servers", "service_us", "mbps"]
        };
        if let Some(k) = t.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("unknown key `{k}` ({FLASH_FORMS})"));
        }
        if let Some(device) = t.get("device") {
            return Ok(FlashSpec::Device {
                device: device.clone(),
                count: flash_whole(&t, "count")?.unwrap_or(1),
            });
        }
        if let Some(processor) = t.get("processor") {
            return Ok(FlashSpec::Processor {
                processor: processor.clone(),
            });
        }
        Ok(FlashSpec::Ideal {
            servers: flash_whole(&t, "servers")?.unwrap_or(32),
            service_us: flash_num(&t, "service_us")?.unwrap_or(100.0),
            mbps: flash_num(&t, "mbps")?.unwrap_or(1500.0),
        })
    }
}

fn flash_num(t: &toml::Table, k: &str) -> Result<Option<f64>, String> {
    match t.get(k) {
        None => Ok(None),
        Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
        Some(toml::Value::Float(f)) => Ok(Some(*f)),
        Some(o) => Err(format!("`{k}` must be a number, got {o}")),
    }
}

fn flash_whole(t: &toml::Table, k: &str) -> Result<Option<u32>, String> {
    match flash_num(t, k)? {
        Some(x) if x.fract() != 0.0 || !(0.0..=u32::MAX as f64).contains(&x) => {
            Err(format!("`{k}` must be a whole number ≥ 0, got {x}"))
        }
        x => Ok(x.map(|x| x as u32)),
    }
}

/// Array-side flash read cache. Reads that hit are served by the flash device;
/// misses go to the array and fill the cache; writes go to the array and update the
/// cached copy (write-through). `clone_aware`: the blocks of a golden image
/// (a model's shared region) are cached once for all its clones; otherwise each
/// clone's copy is a separate entry (004: Data ONTAP 8.1 vs 8.0.1).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayCacheSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    pub size_gib: f64,
    #[serde(default = "d_block_kib")]
    pub block_kib: u32,
    #[serde(default)]
    pub clone_aware: bool,
    /// Writes land in flash (a hybrid array's flash tier) instead of the disks; the
    /// later destaging to disk is not simulated.
    #[serde(default)]
    pub write_back: bool,
    #[serde(default)]
    pub flash: FlashSpec,
}

/// A host's flash card used as a read cache (ioTurbine-like) by the VMs that opt in
/// with `host_cache = true`. It runs `weir serve`'s flash cache decisions
/// (weir-model's `FlashCache`, docs/FLASH_CACHE.md): a read whose every block is
/// cached is served by the flash and never leaves the host; any other read goes to
/// the array whole and fills the blocks it covered whole when its data is back
/// (unless it is part of a sequential scan); writes go to the array and drop the
/// cached blocks they touch (write-through with invalidation); SLRU replacement.
/// Defaults are the server's.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCacheSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    pub size_gib: f64,
    /// The unit cached, filled and dropped: a power of two, 4-1024 KiB (the
    /// server's `block`, 4 KiB by default).
    #[serde(default = "d_host_block_kib")]
    pub block_kib: u32,
    /// Sequential-scan cutoff (the server's `scan_cutoff`, 4 MiB by default): a read
    /// this long, or continuing a sequential run this long, fills nothing. 0: admit
    /// everything.
    #[serde(default = "d_scan_cutoff_kib")]
    pub scan_cutoff_kib: u64,
    #[serde(default)]
    pub flash: FlashSpec,
}

fn yes() -> bool {
    true
}
fn d_block_kib() -> u32 {
    64
}
fn d_host_block_kib() -> u32 {
    4
}
fn d_scan_cutoff_kib() -> u64 {
    4096
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioHeader {
    /// Required by the simulator; `weir load` names a nameless file after itself.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "one_u64")]
    pub seed: u64,
    /// Measured simulated time, s (after the warm-up): required by the simulator;
    /// `weir load` runs for its own `--duration` when the file has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Simulated time before measurement starts, s (Iometer's ramp-up).
    #[serde(default)]
    pub warmup_s: f64,
    /// Interval of the timeline series, s.
    #[serde(default = "one_f64")]
    pub timeline_interval_s: f64,
    /// Named windows reported separately (`[[scenario.window]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window: Vec<WindowSpec>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatastoreSpec {
    #[serde(default = "default_datastore_name")]
    pub name: String,
    /// Datastore-wide congestion control (SIOC/PARDA). Off unless `enabled = true`.
    #[serde(default = "congestion_off")]
    pub congestion: CongestionConfig,
    /// The array's own port (weir-model `LinkSpec`: a preset such as `"10gbe"` or a
    /// table), shared by every host; none: the hosts' links are the only links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_link: Option<toml::Value>,
    /// The storage server's processors (weir-model `ProcessorSpec`: a preset such as
    /// `"ms-iscsi-target"` or a table `{ cores, read_us, write_us, mbps }`): every
    /// request takes one of its cores on arrival, before the array; none: requests
    /// cost no CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cpu: Option<toml::Value>,
    /// Where the VM disks lie on the array: `"contiguous"` (default: one after
    /// another in declaration order) or `"spread"`: the scenario's N-th `[[volume]]`
    /// starts where `weir serve`'s emulated device puts volume id N
    /// (`weir_model::spread_base`), its VM disks one after another from there — for
    /// runs that must match a live emulated pool.
    #[serde(default)]
    pub placement: Placement,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    #[default]
    Contiguous,
    Spread,
}

impl Default for DatastoreSpec {
    fn default() -> Self {
        DatastoreSpec {
            name: default_datastore_name(),
            congestion: congestion_off(),
            target_link: None,
            target_cpu: None,
            placement: Placement::Contiguous,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayQosSpec {
    /// `false`: requests go to the array in arrival order (QoS off).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Requests the appliance keeps outstanding on its back end (its disk tier when
    /// an `[array_cache]` flash tier is present).
    #[serde(default = "default_backend_concurrency")]
    pub backend_concurrency: u32,
    /// Requests the appliance keeps outstanding on its flash tier (`[array_cache]`);
    /// default: the flash's `servers` (channels), so that requests queue in the QoS
    /// scheduler rather than in the flash device's FIFO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_concurrency: Option<u32>,
    /// IOPS are counted in units of this many bytes (weir-qos `cost_unit_bytes`).
    #[serde(default = "default_cost_unit")]
    pub cost_unit_bytes: u32,
    /// The depth controller of the back end (the disk tier): weir-qos `DepthConfig`
    /// (`adaptive`, `min_depth`, `period_ms`, `over_target_budget`,
    /// `over_twice_budget`, `decrease`), with `backend_concurrency` as its ceiling.
    /// Off in the simulator unless `adaptive = true` (the server defaults it on): the
    /// published scenarios were measured with a fixed depth. Keys left out take
    /// weir-qos's defaults.
    #[serde(default = "sim_depth", deserialize_with = "depth_over_sim_default")]
    pub depth: DepthConfig,
    /// The array serves the pieces of protected volumes (mission- or
    /// business-critical with a latency target) ahead of the rest where its drives
    /// can (NCQ priority, SCSI HEAD OF QUEUE), as the server's emulated device does;
    /// `false`: a device without priority queueing (the depth alone protects).
    #[serde(default = "yes")]
    pub priority_queueing: bool,
}

/// The simulator's default depth controller: weir-qos's, not adaptive.
fn sim_depth() -> DepthConfig {
    DepthConfig {
        adaptive: false,
        ..DepthConfig::default()
    }
}

/// `depth = { … }`: the given keys over [`sim_depth`] (so leaving `adaptive` out
/// keeps it off), unknown keys rejected.
fn depth_over_sim_default<'de, D: Deserializer<'de>>(d: D) -> Result<DepthConfig, D::Error> {
    use serde::de::Error;
    let given = toml::Table::deserialize(d)?;
    let mut table = toml::Table::try_from(sim_depth()).map_err(D::Error::custom)?;
    table.extend(given);
    table.try_into().map_err(D::Error::custom)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    pub name: String,
    /// Name of a built-in or `[[policy]]` policy (array-side QoS); none: best effort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub name: String,
    /// HBA/NIC toward the datastore (weir-model `LinkSpec`: preset or table).
    #[serde(default = "default_link")]
    pub link: toml::Value,
    /// Requests the host keeps outstanding on the datastore (ESX's DQLEN /
    /// Disk.SchedNumReqOutstanding, 32 by default).
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    /// Cost unit of the host's scheduler for VM limits/reservations in IOPS
    /// (`4294967295`: every I/O counts as one, as ESXi 5.0 did).
    #[serde(default = "default_cost_unit")]
    pub cost_unit_bytes: u32,
    /// A host-side flash read cache for the VMs that opt in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_cache: Option<HostCacheSpec>,
    /// The host's storage stack as a processor (weir-model `ProcessorSpec`: a preset
    /// such as `"esxi5-sw-iscsi"` or a table): every request its gate releases takes
    /// one of its cores before the host's link; none: the host costs no CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<toml::Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    pub name: String,
    /// The `[[host]]` it runs on: required by the simulator, ignored by `weir load`.
    #[serde(default)]
    pub host: String,
    /// Name of a `[[workload]]`, a `[[model]]` (also written `model = "…"`) or a
    /// built-in profile (`oltp`, `dss`, …).
    #[serde(alias = "model")]
    pub workload: String,
    /// The VM disk's shares on its host (low 500, normal 1000, high 2000, 200-4000).
    #[serde(default)]
    pub shares: Shares,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_iops: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_iops: Option<f64>,
    /// Size of the VM's disk on the datastore (the workload addresses
    /// `dataset_fraction` of it); 0: an equal part of the array space the other VMs
    /// leave (a whole-volume test such as 002's). Left out: [`VmSpec::DEFAULT_DISK_GIB`]
    /// in the simulator, an equal part of the export with `weir load`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gib: Option<f64>,
    /// Array volume the disk lives on (a `[[volume]]` name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Identical copies of this VM (named `name-1` … `name-N` when above 1; 0: the VM
    /// is left out, e.g. by a case).
    #[serde(default = "one_u32")]
    pub count: u32,
    /// Use the host's `flash_cache` for this VM's reads.
    #[serde(default)]
    pub host_cache: bool,
    /// Start the run with the model's data region (OLTP or Exchange database) resident
    /// in the caches on this VM's path (its host's flash cache if `host_cache`, the
    /// array flash tier if any): the state after a long warm-up, without simulating it.
    #[serde(default)]
    pub prewarm_cache: bool,
}

/// One `[[case]]`: overrides of the base file, optional sweeps, seed figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Overrides: dotted paths into the file (`"vm.app05.shares" = "high"`,
    /// `"datastore.congestion.enabled" = true`); arrays of named tables are addressed
    /// by the element's name.
    #[serde(default)]
    pub set: toml::Table,
    #[serde(default)]
    pub sweep: Vec<CaseSweep>,
    #[serde(default)]
    pub compare: Vec<CompareSpec>,
}

/// A swept parameter: a workload parameter (`block_kib`, `queue_depth`, `read_pct`,
/// …) applied to the workloads of `vms` (all VMs when empty), or a dotted path into
/// the file (`array.drives`) set to each value.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSweep {
    pub param: String,
    pub values: Vec<f64>,
    #[serde(default)]
    pub vms: Vec<String>,
}

/// What a `[[case.compare]]` row is (required: a row without one is a parse error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompareKind {
    /// A seed measurement Weir did not use: the figures the header counts.
    Prediction,
    /// A seed measurement a parameter was fitted on: shown beside Weir's figure,
    /// never counted as reproduced; `fitted` names the parameter.
    Calibration,
    /// A configured limit or threshold (a policy target, an SLA line, an
    /// invariant): pass / fail against `at_most` / `at_least`, no ratio.
    Target,
}

/// A figure to put beside Weir's: a seed document's measurement (`prediction`,
/// `calibration`) or a pass / fail line (`target`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "RawCompare", into = "RawCompare")]
pub struct CompareSpec {
    pub kind: CompareKind,
    /// What Weir figure: `<vm>.<field>`, `volume:<name>.<field>`, `total.<field>`,
    /// `component:<name>.<utilisation|mbps|ios|iops>` or `model:<vm>.<metric>`
    /// (`…@window` for a named window); fields: iops, mbps, read_iops, write_iops,
    /// latency_mean_ms, latency_p50_ms, latency_p95_ms, latency_p99_ms,
    /// latency_max_ms; or two such figures (or a number) joined by ` / ` or ` + `,
    /// e.g. `"app05.mbps / app04.mbps"`, `"vm-1.mbps + vm-2.mbps"`, `"x.mbps / 8"`.
    pub metric: String,
    /// Label shown in reports (default: `metric`).
    pub label: String,
    /// The seed's measurement (predictions and calibrations; NaN for targets).
    pub seed: f64,
    /// Targets: the figure must be at most this.
    pub at_most: Option<f64>,
    /// Targets: the figure must be at least this.
    pub at_least: Option<f64>,
    /// Calibrations: the parameter fitted on this figure, and how.
    pub fitted: String,
    /// Where the figure comes from: the seed document, table / figure / page
    /// (`"004 Table 8"`), or for a target where the limit is configured.
    pub source: String,
    pub note: String,
    /// Only for the swept cases whose parameters have these values
    /// (e.g. `when = { block_kib = 64 }`).
    pub when: std::collections::BTreeMap<String, f64>,
}

/// The TOML shape of a compare row, checked into a [`CompareSpec`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompare {
    kind: CompareKind,
    metric: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_most: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_least: Option<f64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    fitted: String,
    source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    when: std::collections::BTreeMap<String, f64>,
}

impl TryFrom<RawCompare> for CompareSpec {
    type Error = String;

    fn try_from(r: RawCompare) -> Result<Self, String> {
        let what = format!("compare row {:?} (kind = {:?})", r.metric, r.kind);
        let bounded = r.at_most.is_some() || r.at_least.is_some();
        let seed = match (r.kind, r.seed) {
            (CompareKind::Target, Some(_)) => {
                return Err(format!(
                    "{what}: a target has no `seed` (the seed column holds only seed measurements); give `at_most` and/or `at_least`"
                ));
            }
            (CompareKind::Target, None) => f64::NAN,
            (_, None) => {
                return Err(format!(
                    "{what}: needs `seed`, the seed document's measurement"
                ));
            }
            (_, Some(s)) if !s.is_finite() => {
                return Err(format!("{what}: `seed` must be a finite number"));
            }
            (_, Some(s)) => s,
        };
        match r.kind {
            CompareKind::Target if !bounded => {
                return Err(format!(
                    "{what}: a target needs `at_most` and/or `at_least`"
                ));
            }
            CompareKind::Prediction | CompareKind::Calibration if bounded => {
                return Err(format!(
                    "{what}: `at_most` / `at_least` are for targets only"
                ));
            }
            _ => {}
        }
        if [r.at_most, r.at_least]
            .iter()
            .flatten()
            .any(|x| !x.is_finite())
        {
            return Err(format!("{what}: `at_most` / `at_least` must be finite"));
        }
        if let (Some(lo), Some(hi)) = (r.at_least, r.at_most)
            && lo > hi
        {
            return Err(format!("{what}: at_least {lo} > at_most {hi}"));
        }
        match r.kind {
            CompareKind::Calibration if r.fitted.trim().is_empty() => {
                return Err(format!(
                    "{what}: a calibration names the parameter fitted on it (`fitted`)"
                ));
            }
            CompareKind::Prediction | CompareKind::Target if !r.fitted.is_empty() => {
                return Err(format!(
                    "{what}: `fitted` is for calibrations only (a figure a parameter was fitted on is a calibration)"
                ));
            }
            _ => {}
        }
        if r.source.trim().is_empty() {
            return Err(format!(
                "{what}: `source` must say where the figure comes from"
            ));
        }
        Ok(CompareSpec {
            kind: r.kind,
            metric: r.metric,
            label: r.label,
            seed,
            at_most: r.at_most,
            at_least: r.at_least,
            fitted: r.fitted,
            source: r.source,
            note: r.note,
            when: r.when,
        })
    }
}

impl From<CompareSpec> for RawCompare {
    fn from(c: CompareSpec) -> Self {
        RawCompare {
            kind: c.kind,
            metric: c.metric,
            label: c.label,
            seed: c.seed.is_finite().then_some(c.seed),
            at_most: c.at_most,
            at_least: c.at_least,
            fitted: c.fitted,
            source: c.source,
            note: c.note,
            when: c.when,
        }
    }
}

fn one_u64() -> u64 {
    1
}
fn one_u32() -> u32 {
    1
}
fn one_f64() -> f64 {
    1.0
}
fn default_datastore_name() -> String {
    "datastore".to_string()
}
fn congestion_off() -> CongestionConfig {
    CongestionConfig {
        enabled: false,
        ..CongestionConfig::default()
    }
}
fn default_backend_concurrency() -> u32 {
    64
}
fn default_cost_unit() -> u32 {
    4096
}
fn default_link() -> toml::Value {
    toml::Value::String("fc-8g".to_string())
}
fn default_queue_depth() -> u32 {
    32
}
impl VmSpec {
    /// The simulator's disk size when `disk_gib` is left out.
    pub const DEFAULT_DISK_GIB: f64 = 100.0;
}

impl Default for ScenarioHeader {
    /// What a file without `[scenario]` means (`weir load` accepts one; the simulator
    /// then asks for a name and a duration).
    fn default() -> Self {
        ScenarioHeader {
            name: String::new(),
            description: String::new(),
            seed: one_u64(),
            duration_s: None,
            warmup_s: 0.0,
            timeline_interval_s: one_f64(),
            window: Vec::new(),
        }
    }
}

/// An entry of `[[workload]]` or `[[model]]` that does not deserialize on its
/// own: which array, its index, the entry's name where it has one, and its
/// error with the offset it points at (inside the entry). Their types convert
/// after deserializing (`try_from`), so the whole file's error carries the
/// array's span and pointed at the first entry whatever entry was wrong.
pub struct FailingEntry {
    pub array: &'static str,
    pub index: usize,
    pub name: Option<String>,
    /// Where the entry's error points (the entry's start when it says nothing).
    pub offset: usize,
    /// From the entry's start to the next entry's (or the end of the file).
    pub span: std::ops::Range<usize>,
    pub message: String,
}

impl FailingEntry {
    /// Where to point: `whole`'s place (the whole file's error) when it falls
    /// inside this entry (it is then the more precise), else the entry's own.
    pub fn offset_given(&self, whole: &toml::de::Error) -> usize {
        whole
            .span()
            .filter(|s| s.start > self.span.start && s.start < self.span.end)
            .map_or(self.offset, |s| s.start)
    }
}

/// The first entry of `[[workload]]` or `[[model]]` in `text` that fails on
/// its own ([`FailingEntry`]); `None` when each does (the error is elsewhere).
pub fn failing_entry(text: &str) -> Option<FailingEntry> {
    use serde::de::DeserializeOwned;
    use toml::de::{DeTable, DeValue, ValueDeserializer};
    fn fails<T: DeserializeOwned>(v: toml::Spanned<DeValue<'_>>) -> Option<toml::de::Error> {
        T::deserialize(ValueDeserializer::from(v)).err()
    }
    let root = DeTable::parse(text).ok()?;
    type Check = for<'a> fn(toml::Spanned<DeValue<'a>>) -> Option<toml::de::Error>;
    let checks: [(&'static str, Check); 2] = [
        ("workload", fails::<AccessSpec>),
        ("model", fails::<ModelSpec>),
    ];
    for (array, check) in checks {
        let Some(DeValue::Array(items)) = root.get_ref().get(array).map(|v| v.get_ref()) else {
            continue;
        };
        for (index, item) in items.iter().enumerate() {
            let Some(e) = check(item.clone()) else {
                continue;
            };
            // An array-of-tables entry's own span is its header: its text runs
            // to the next entry (or the file's end).
            let next = items.get(index + 1).map_or(text.len(), |n| n.span().start);
            let span = item.span().start..next.max(item.span().end);
            let offset = e
                .span()
                .filter(|s| s.start >= span.start && s.end <= span.end)
                .map_or(span.start, |s| s.start);
            let name = match item.get_ref() {
                DeValue::Table(t) => t.get("name").and_then(|n| match n.get_ref() {
                    DeValue::String(s) => Some(s.to_string()),
                    _ => None,
                }),
                _ => None,
            };
            return Some(FailingEntry {
                array,
                index,
                name,
                offset,
                span,
                message: e.message().to_string(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case_with(row: &str) -> Result<CaseSpec, String> {
        toml::from_str::<CaseSpec>(&format!("name = \"c\"\n[[compare]]\n{row}"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_compare_row_without_a_kind_is_a_parse_error() {
        let e = case_with("metric = \"total.iops\"\nseed = 1\nsource = \"004 Table 11\"\n")
            .unwrap_err();
        assert!(e.contains("missing field `kind`"), "{e}");
        let e = case_with(
            "kind = \"guess\"\nmetric = \"total.iops\"\nseed = 1\nsource = \"004 Table 11\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("unknown variant `guess`") && e.contains("prediction"),
            "{e}"
        );
    }

    #[test]
    fn each_kind_carries_what_it_needs_and_nothing_else() {
        let p = case_with(
            "kind = \"prediction\"\nmetric = \"total.iops\"\nseed = 4659\nsource = \"004 Table 15\"\n",
        )
        .unwrap();
        assert_eq!(p.compare[0].kind, CompareKind::Prediction);
        assert_eq!(p.compare[0].seed, 4659.0);
        let t = case_with(
            "kind = \"target\"\nmetric = \"x.latency_mean_ms\"\nat_most = 10\nsource = \"000 Figure 9\"\n",
        )
        .unwrap();
        assert!(t.compare[0].seed.is_nan() && t.compare[0].at_most == Some(10.0));
        let c = case_with(
            "kind = \"calibration\"\nmetric = \"total.iops\"\nseed = 1\nfitted = \"boot_ios\"\nsource = \"004 Table 16\"\n",
        )
        .unwrap();
        assert_eq!(c.compare[0].fitted, "boot_ios");
        for (row, says) in [
            // A target compares with a limit, not with a seed figure.
            (
                "kind = \"target\"\nmetric = \"m.iops\"\nseed = 10\nat_most = 10\nsource = \"s\"\n",
                "a target has no `seed`",
            ),
            (
                "kind = \"target\"\nmetric = \"m.iops\"\nsource = \"s\"\n",
                "needs `at_most` and/or `at_least`",
            ),
            (
                "kind = \"prediction\"\nmetric = \"m.iops\"\nsource = \"s\"\n",
                "needs `seed`",
            ),
            (
                "kind = \"prediction\"\nmetric = \"m.iops\"\nseed = 1\nat_least = 1\nsource = \"s\"\n",
                "for targets only",
            ),
            (
                "kind = \"calibration\"\nmetric = \"m.iops\"\nseed = 1\nsource = \"s\"\n",
                "names the parameter fitted",
            ),
            (
                "kind = \"prediction\"\nmetric = \"m.iops\"\nseed = 1\nfitted = \"x\"\nsource = \"s\"\n",
                "for calibrations only",
            ),
            (
                "kind = \"target\"\nmetric = \"m.iops\"\nat_least = 3\nat_most = 2\nsource = \"s\"\n",
                "at_least 3 > at_most 2",
            ),
            (
                "kind = \"prediction\"\nmetric = \"m.iops\"\nseed = 1\nsource = \" \"\n",
                "`source`",
            ),
        ] {
            let e = case_with(row).unwrap_err();
            assert!(e.contains(says), "{row}: {e}");
        }
    }

    #[test]
    fn compare_rows_round_trip_through_toml() {
        let c = case_with(
            "kind = \"target\"\nmetric = \"m.iops\"\nat_least = 1\nat_most = 2\nsource = \"s\"\n",
        )
        .unwrap();
        let text = toml::to_string(&c).unwrap();
        let back: CaseSpec = toml::from_str(&text).unwrap();
        assert_eq!(back.compare[0].at_least, Some(1.0));
        assert_eq!(back.compare[0].at_most, Some(2.0));
        assert!(back.compare[0].seed.is_nan());
    }
}
