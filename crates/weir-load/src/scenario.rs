//! What `weir load` runs: VMs with their access specifications.
//!
//! Three sources ([`ScenarioSource`]):
//! - a scenario file in `weir sim`'s format (scenarios/README.md), deserialised as
//!   the simulator's own types (crate weir-scenario: the same fields, defaults, VM
//!   limit and errors), of which only the workload part is used: `[scenario]` (name,
//!   description, seed, duration_s, warmup_s, timeline_interval_s, window),
//!   `[[workload]]`, `[[model]]` and `[[vm]]` (name, workload — or `model = "…"` —,
//!   disk_gib, count, volume). A file may leave out what only the simulator needs
//!   (the name, the duration, `[array]`, `[[host]]`, a VM's host). Every copy of
//!   every VM running a model is one instance of it: together they run its schedule
//!   once (logins, power-on and clone slots), as in the simulator. The simulated
//!   hardware (`[array]`, `[[host]]`, `[datastore]`, `[array_qos]`, `[[policy]]`,
//!   `[[volume]]`) and `[[case]]` are ignored and listed in [`LoadScenario::notes`];
//!   per-VM QoS and cache fields (host, shares, limits, `host_cache`,
//!   `prewarm_cache`) are the target's business and ignored too. A VM's `volume`
//!   picks the target whose export has that name, when there is one; a VM without
//!   `disk_gib` gets an equal part of the export (the simulator: 100 GiB).
//! - a built-in application profile name (`oltp`, `vdi-boot`, … of weir-workload),
//!   one VM, optionally followed by overrides: `oltp,vms=8,qd=4`;
//! - a simple access specification: `bs=4k,read=70,random=100,qd=32,workers=1,vms=4`,
//!   with the shorthands `randread`, `randwrite`, `randrw`, `seqread`, `seqwrite`
//!   (`disk=64m` sets each VM's disk size; by default the VMs share the export).

use crate::LoadError;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use weir_scenario::ScenarioFile;
use weir_workload::{AccessSpec, ModelSpec, profile, profile_names};

/// Most VMs a run may hold (the simulator's limit too).
pub use weir_workload::MAX_VMS;

/// Where the workload comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ScenarioSource {
    File(PathBuf),
    /// Scenario text in the file format (e.g. a `weir sim` built-in); `name` stands for
    /// the file in messages.
    Text {
        name: String,
        toml: String,
    },
    /// A built-in profile or a simple access specification (see the module docs).
    Spec(String),
}

impl ScenarioSource {
    /// A path when it names an existing file or ends in `.toml`; else the text of the
    /// built-in scenario of that name in `builtins` (`weir_sim::builtin_scenarios()`:
    /// passed in, so that this crate does not build on the simulator); otherwise a spec.
    pub fn parse(text: &str, builtins: &[(&str, &str)]) -> ScenarioSource {
        let p = Path::new(text);
        if text.ends_with(".toml") || p.is_file() {
            ScenarioSource::File(p.to_path_buf())
        } else if let Some((name, toml)) = builtins.iter().find(|(n, _)| *n == text) {
            ScenarioSource::Text {
                name: format!("{name} (built-in)"),
                toml: toml.to_string(),
            }
        } else {
            ScenarioSource::Spec(text.to_string())
        }
    }
}

/// What a VM runs.
#[derive(Clone, Debug, PartialEq)]
pub enum VmWorkload {
    /// An Iometer access specification (`[[workload]]`, profile, simple spec).
    Access(AccessSpec),
    /// An application model; this VM is `instance` of `instances` copies of it.
    Model {
        spec: Box<ModelSpec>,
        instance: u32,
        instances: u32,
    },
}

impl VmWorkload {
    /// The access specification, when it is one.
    pub fn access(&self) -> Option<&AccessSpec> {
        match self {
            VmWorkload::Access(s) => Some(s),
            VmWorkload::Model { .. } => None,
        }
    }
}

/// A named interval of the run on the model clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub name: String,
    pub start_s: f64,
    pub end_s: f64,
}

/// One simulated VM (one virtual disk).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadVm {
    pub name: String,
    /// The `[[vm]]` it comes from (its name before the `-k` of `count` copies); model
    /// metrics are combined per base, as the simulator does.
    pub base: String,
    /// The `[[workload]]`, `[[model]]` or profile it runs.
    pub workload: String,
    pub run: VmWorkload,
    /// Disk size; `None`: an equal share of what the other VMs leave on the target.
    pub disk_bytes: Option<u64>,
    /// Preferred target export name (the sim file's `volume`).
    pub volume: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LoadScenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    /// Model seconds to run (the scenario's duration), when it says.
    pub duration_s: Option<f64>,
    /// Model seconds of ramp-up whose I/Os are not measured.
    pub warmup_s: f64,
    pub timeline_interval_s: Option<f64>,
    /// Named intervals (model seconds from 0, warm-up included): `[scenario] window`.
    pub windows: Vec<Window>,
    pub vms: Vec<LoadVm>,
    /// What of the source was ignored, for the report.
    pub notes: Vec<String>,
}

impl LoadScenario {
    /// The most I/Os its VMs may keep outstanding at once: workers × `qd` of an
    /// access specification, a model's own bound shared by its copies (as `weir sim`
    /// counts them).
    pub fn max_outstanding(&self) -> u64 {
        self.vms
            .iter()
            .map(|v| match &v.run {
                VmWorkload::Access(s) => s.workers as u64 * s.outstanding_ios as u64,
                VmWorkload::Model {
                    spec, instances, ..
                } => spec.max_outstanding().div_ceil((*instances).max(1) as u64),
            })
            .sum()
    }
}

fn scen_err(file: &str, message: impl Into<String>) -> LoadError {
    LoadError::Scenario {
        file: file.to_string(),
        message: message.into(),
    }
}

// Parsing is `#[inline]` (as weir-sim's and weir-server's): the TOML and serde code it
// instantiates is then compiled in its caller, the CLI, at opt-level 0, instead of at
// opt-level 3 here (a quarter of this crate's code; it runs once, for milliseconds).
// The engine takes a parsed scenario ([`crate::LoadOptions::scenario`]) and never
// calls these.
impl LoadScenario {
    /// Reads and parses what `source` names.
    #[inline]
    pub fn load(source: &ScenarioSource) -> Result<LoadScenario, LoadError> {
        match source {
            ScenarioSource::File(path) => {
                let file = path.display().to_string();
                let text = read_bounded(path).map_err(|m| scen_err(&file, m))?;
                LoadScenario::from_toml_str(&file, &text)
            }
            ScenarioSource::Text { name, toml } => LoadScenario::from_toml_str(name, toml),
            ScenarioSource::Spec(s) => LoadScenario::from_spec(s),
        }
    }

    /// A profile name or simple access specification (module docs).
    #[inline]
    pub fn from_spec(text: &str) -> Result<LoadScenario, LoadError> {
        let err = |m: String| scen_err(text, m);
        let mut tokens = text.split(',').map(str::trim).filter(|t| !t.is_empty());
        let first = tokens
            .next()
            .ok_or_else(|| err("empty workload specification".into()))?;
        let (mut spec, workload, rest): (AccessSpec, String, Vec<&str>) = match profile(first) {
            Ok(p) => (p.spec, first.to_string(), tokens.collect()),
            Err(_) => (
                AccessSpec::simple(4096, 100.0, 100.0, 1),
                "spec".to_string(),
                std::iter::once(first).chain(tokens).collect(),
            ),
        };
        let mut vms = 1usize;
        let mut disk_bytes = None;
        for tok in rest {
            let (k, v) = match tok.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (tok, None),
            };
            let num = |v: Option<&str>| -> Result<f64, LoadError> {
                let v = v.ok_or_else(|| err(format!("{k}: needs a value ({k}=…)")))?;
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| err(format!("{k}: {v:?} is not a number")))
            };
            let line = &mut spec.lines;
            let set_all = |line: &mut Vec<weir_workload::TransferLine>, read: f64, random: f64| {
                for l in line.iter_mut() {
                    l.read_pct = read;
                    l.random_pct = random;
                }
            };
            match (k, v) {
                ("randread", None) => set_all(line, 100.0, 100.0),
                ("randwrite", None) => set_all(line, 0.0, 100.0),
                ("randrw", None) => set_all(line, 50.0, 100.0),
                ("seqread", None) => set_all(line, 100.0, 0.0),
                ("seqwrite", None) => set_all(line, 0.0, 0.0),
                ("bs" | "block", Some(v)) => {
                    let b = parse_bytes(v).map_err(|m| err(format!("{k}: {m}")))?;
                    let b = u32::try_from(b).map_err(|_| err(format!("{k}: {v} is too large")))?;
                    for l in line.iter_mut() {
                        l.size_bytes = b;
                    }
                }
                ("read", _) => {
                    let x = num(v)?;
                    line.iter_mut().for_each(|l| l.read_pct = x);
                }
                ("random", _) => {
                    let x = num(v)?;
                    line.iter_mut().for_each(|l| l.random_pct = x);
                }
                ("qd", _) => spec.outstanding_ios = count(k, num(v)?).map_err(err)?,
                ("workers", _) => spec.workers = count(k, num(v)?).map_err(err)?,
                ("vms", _) => vms = count(k, num(v)?).map_err(err)? as usize,
                ("dataset", _) => spec.dataset_fraction = num(v)?,
                ("disk", Some(v)) => {
                    disk_bytes = Some(parse_bytes(v).map_err(|m| err(format!("{k}: {m}")))?)
                }
                _ => {
                    return Err(err(format!(
                        "unknown item {tok:?}: use bs=, read=, random=, qd=, workers=, vms=, dataset=, disk=, randread, randwrite, randrw, seqread, seqwrite, or start with a profile ({})",
                        profile_names().join(", ")
                    )));
                }
            }
        }
        spec.validate().map_err(|e| err(e.to_string()))?;
        if vms == 0 || vms > MAX_VMS {
            return Err(err(format!("vms: must be 1..={MAX_VMS}, got {vms}")));
        }
        let vms = (0..vms)
            .map(|i| LoadVm {
                name: if vms == 1 {
                    "vm".to_string()
                } else {
                    format!("vm-{}", i + 1)
                },
                base: "vm".to_string(),
                workload: workload.clone(),
                run: VmWorkload::Access(spec.clone()),
                disk_bytes,
                volume: None,
            })
            .collect();
        Ok(LoadScenario {
            name: text.to_string(),
            description: String::new(),
            seed: 1,
            duration_s: None,
            warmup_s: 0.0,
            timeline_interval_s: None,
            windows: vec![],
            vms,
            notes: vec![],
        })
    }

    /// The workload part of a `weir sim` scenario file (module docs), deserialised
    /// as the simulator's own types (crate weir-scenario): one schema, one set of
    /// defaults and field names.
    #[inline]
    pub fn from_toml_str(file: &str, text: &str) -> Result<LoadScenario, LoadError> {
        let doc: ScenarioFile =
            toml::from_str(text).map_err(|e| scen_err(file, toml_message(text, &e)))?;
        let root: toml::Table =
            toml::from_str(text).map_err(|e| scen_err(file, toml_message(text, &e)))?;
        let mut notes = Vec::new();
        let ignored: Vec<&str> = root
            .keys()
            .map(String::as_str)
            .filter(|k| !matches!(*k, "scenario" | "workload" | "model" | "vm"))
            .collect();
        if !ignored.is_empty() {
            notes.push(format!(
                "ignored by weir load (simulated hardware or cases): {}",
                ignored.join(", ")
            ));
        }
        let h = &doc.scenario;
        let name = if h.name.is_empty() {
            Path::new(file)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| file.to_string())
        } else {
            h.name.clone()
        };
        check_times(file, h)?;
        let interval_given = root
            .get("scenario")
            .and_then(toml::Value::as_table)
            .is_some_and(|t| t.contains_key("timeline_interval_s"));
        let windows = windows(file, h)?;
        let models = models(file, &doc)?;
        let (vms, ignored_vm_fields) = expand_vms(file, &doc, &models)?;
        if !ignored_vm_fields.is_empty() {
            notes.push(format!(
                "VM fields left to the target's QoS: {}",
                ignored_vm_fields.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
        if vms.is_empty() {
            return Err(scen_err(file, "no [[vm]] to run (or every count is 0)"));
        }
        Ok(LoadScenario {
            name,
            description: h.description.clone(),
            seed: h.seed,
            duration_s: h.duration_s,
            warmup_s: h.warmup_s,
            timeline_interval_s: interval_given.then_some(h.timeline_interval_s),
            windows,
            vms,
            notes,
        })
    }
}

/// Largest scenario file read (the shipped ones are a few KiB; 100,000 short `[[vm]]`
/// tables, the most VMs a run takes, about 4 MiB).
pub const MAX_SCENARIO_FILE_BYTES: u64 = 16 << 20;

/// The text of the file at `path`, refused beyond [`MAX_SCENARIO_FILE_BYTES`] (a
/// device such as `/dev/zero` is never read to its end).
fn read_bounded(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut text = String::new();
    file.take(MAX_SCENARIO_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > MAX_SCENARIO_FILE_BYTES {
        return Err(format!(
            "larger than {} MiB: not a scenario file",
            MAX_SCENARIO_FILE_BYTES >> 20
        ));
    }
    Ok(text)
}

/// Longest time a scenario may give (`duration_s`, `warmup_s`,
/// `timeline_interval_s`): 10 years of model time.
pub const MAX_SCENARIO_S: f64 = 10.0 * 365.0 * 86400.0;
/// Shortest `duration_s` (and `timeline_interval_s`): 1 ms of model time.
const MIN_SCENARIO_S: f64 = 1e-3;

/// The header's times in range (at most 10 years; a duration and an interval of at
/// least 1 ms, a warm-up of 0 or more), naming the key of one that is not.
fn check_times(file: &str, h: &weir_scenario::ScenarioHeader) -> Result<(), LoadError> {
    for (k, v, min) in [
        ("duration_s", h.duration_s, MIN_SCENARIO_S),
        ("warmup_s", Some(h.warmup_s), 0.0),
        (
            "timeline_interval_s",
            Some(h.timeline_interval_s),
            MIN_SCENARIO_S,
        ),
    ] {
        if let Some(v) = v
            && !(min..=MAX_SCENARIO_S).contains(&v)
        {
            return Err(scen_err(
                file,
                format!("scenario.{k}: must be {min} to {MAX_SCENARIO_S} s (10 years), got {v}"),
            ));
        }
    }
    Ok(())
}

/// Each `[[scenario.window]]`, checked.
fn windows(file: &str, h: &weir_scenario::ScenarioHeader) -> Result<Vec<Window>, LoadError> {
    let mut windows = Vec::new();
    for (i, w) in h.window.iter().enumerate() {
        if !(w.start_s >= 0.0 && w.end_s > w.start_s) {
            return Err(scen_err(
                file,
                format!(
                    "scenario.window[{i}]: needs 0 ≤ start_s < end_s, got {}..{}",
                    w.start_s, w.end_s
                ),
            ));
        }
        windows.push(Window {
            name: w.name.clone(),
            start_s: w.start_s,
            end_s: w.end_s,
        });
    }
    Ok(windows)
}

/// Each `[[model]]`, validated, with distinct names.
fn models<'a>(file: &str, doc: &'a ScenarioFile) -> Result<Vec<&'a ModelSpec>, LoadError> {
    let mut models: Vec<&ModelSpec> = Vec::new();
    for (i, spec) in doc.model.iter().enumerate() {
        spec.validate()
            .map_err(|e| scen_err(file, format!("model[{}]: {e}", spec.name())))?;
        if models.iter().any(|x| x.name() == spec.name()) {
            return Err(scen_err(
                file,
                format!("model[{i}]: two models are named {:?}", spec.name()),
            ));
        }
        models.push(spec);
    }
    Ok(models)
}

/// What a `[[vm]]` runs: a `[[workload]]`, a `[[model]]` (instance numbers set
/// per copy later) or a built-in profile, in that order.
fn vm_template(
    file: &str,
    at: &str,
    doc: &ScenarioFile,
    models: &[&ModelSpec],
    workload: &str,
) -> Result<VmWorkload, LoadError> {
    if let Some(w) = doc.workload.iter().find(|w| w.name == workload) {
        return Ok(VmWorkload::Access(w.clone()));
    }
    if let Some(m) = models.iter().find(|m| m.name() == workload) {
        return Ok(VmWorkload::Model {
            spec: Box::new((*m).clone()),
            instance: 0,
            instances: 1,
        });
    }
    let p = profile(workload).map_err(|_| {
        scen_err(
            file,
            format!(
                "{at}.workload: no [[workload]], [[model]] or built-in profile named {workload:?} (profiles: {})",
                profile_names().join(", ")
            ),
        )
    })?;
    Ok(VmWorkload::Access(p.spec))
}

/// The fields of a `[[vm]]` that only the simulator acts on (a live target's QoS
/// does it), where this VM sets them.
fn simulator_only_fields(v: &weir_scenario::VmSpec) -> Vec<&'static str> {
    [
        ("host", !v.host.is_empty()),
        ("shares", v.shares != Default::default()),
        ("limit_iops", v.limit_iops.is_some()),
        ("reservation_iops", v.reservation_iops.is_some()),
        ("host_cache", v.host_cache),
        ("prewarm_cache", v.prewarm_cache),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect()
}

/// Every copy of every `[[vm]]`, named `name-1`, `name-2`, … when it has more than
/// one, and the simulator-only fields the file sets.
fn expand_vms(
    file: &str,
    doc: &ScenarioFile,
    models: &[&ModelSpec],
) -> Result<(Vec<LoadVm>, std::collections::BTreeSet<&'static str>), LoadError> {
    // A model's schedule is the whole model's (as in the simulator): every copy
    // of every [[vm]] running it is one instance, numbered in file order.
    let mut copies: HashMap<&str, u32> = HashMap::new();
    for v in &doc.vm {
        *copies.entry(v.workload.as_str()).or_insert(0) += v.count;
    }
    let mut names: HashSet<String> = HashSet::new();
    let mut seen: std::collections::BTreeMap<&str, u32> = Default::default();
    let mut vms = Vec::new();
    let mut ignored_vm_fields = std::collections::BTreeSet::new();
    for v in &doc.vm {
        let at = format!("vm[{}]", v.name);
        ignored_vm_fields.extend(simulator_only_fields(v));
        let workload = &v.workload;
        let template = vm_template(file, &at, doc, models, workload)?;
        let disk_gib = v.disk_gib.unwrap_or(0.0);
        if !(0.0..=1e6).contains(&disk_gib) {
            return Err(scen_err(
                file,
                format!("{at}.disk_gib: must be in [0, 1e6], got {disk_gib}"),
            ));
        }
        let disk_bytes = (disk_gib > 0.0)
            .then(|| (disk_gib * (1u64 << 30) as f64) as u64 / 4096 * 4096)
            .filter(|&b| b > 0);
        let count = v.count as usize;
        let first = seen.get(workload.as_str()).copied().unwrap_or(0);
        for k in 0..count {
            let name = if count == 1 {
                v.name.clone()
            } else {
                format!("{}-{}", v.name, k + 1)
            };
            if !names.insert(name.clone()) {
                return Err(scen_err(
                    file,
                    format!("{at}.name: two VMs are named {name:?}"),
                ));
            }
            let mut run = template.clone();
            if let VmWorkload::Model {
                instance,
                instances,
                ..
            } = &mut run
            {
                *instance = first + k as u32;
                *instances = copies[workload.as_str()];
            }
            vms.push(LoadVm {
                name,
                base: v.name.clone(),
                workload: workload.clone(),
                run,
                disk_bytes,
                volume: v.volume.clone(),
            });
            if vms.len() > MAX_VMS {
                return Err(scen_err(file, format!("more than {MAX_VMS} VMs")));
            }
        }
        *seen.entry(workload.as_str()).or_insert(0) += v.count;
    }
    Ok((vms, ignored_vm_fields))
}

fn count(k: &str, x: f64) -> Result<u32, String> {
    if (1.0..=1e9).contains(&x) && x.fract() == 0.0 {
        Ok(x as u32)
    } else {
        Err(format!("{k}: must be a whole number ≥ 1, got {x}"))
    }
}

fn toml_message(text: &str, e: &toml::de::Error) -> String {
    let line_column = |offset: usize| {
        let before = &text[..offset.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        format!("{line}:{column}")
    };
    // An entry that converts after deserializing: its own place and name (the
    // whole file's error pointed at the first entry of its array).
    if let Some(f) = weir_scenario::failing_entry(text) {
        let which = f.name.clone().unwrap_or_else(|| f.index.to_string());
        return format!(
            "{}: {}[{which}]: {}",
            line_column(f.offset_given(e)),
            f.array,
            f.message
        );
    }
    match e.span() {
        Some(span) => format!("{}: {}", line_column(span.start), e.message()),
        None => e.message().to_string(),
    }
}

/// `4096`, `4k`, `4KiB`, `1m`, `2g` (binary units) → bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let x: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, 4k, 1m)"))?;
    let bytes = x * mult as f64;
    if !(bytes.is_finite() && (1.0..1.8e19).contains(&bytes) && bytes.fract() == 0.0) {
        return Err(format!("{text:?} is not a whole number of bytes ≥ 1"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    /// An error in a later `[[workload]]` names that entry and its line
    /// (session 30: "1:1: random_pct: missing", the first entry's place).
    #[test]
    fn a_later_workload_s_error_is_placed_at_that_entry() {
        let text = "[[workload]]\nname = \"w\"\nblock_kib = 4\nread_pct = 100\nrandom_pct = 100\n\
                    [[workload]]\nname = \"second\"\nblock_kib = 4\nread_pct = 100\n";
        let e = LoadScenario::from_toml_str("w.toml", text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(" 6:1: workload[second]"), "{e}");
        assert!(e.contains("random_pct"), "{e}");
    }

    use super::*;
    use weir_workload::Direction;

    #[test]
    fn simple_specs_and_profiles() {
        let s = LoadScenario::from_spec("bs=4k,randread,qd=32,vms=3,disk=1m").unwrap();
        assert_eq!(s.vms.len(), 3);
        let vm = &s.vms[2];
        assert_eq!(vm.name, "vm-3");
        let spec = vm.run.access().unwrap();
        assert_eq!(spec.lines[0].size_bytes, 4096);
        assert_eq!(spec.lines[0].read_pct, 100.0);
        assert_eq!(spec.outstanding_ios, 32);
        assert_eq!(vm.disk_bytes, Some(1 << 20));
        let s = LoadScenario::from_spec("oltp,vms=2,qd=4").unwrap();
        assert_eq!(s.vms[0].workload, "oltp");
        let spec = s.vms[0].run.access().unwrap();
        assert_eq!(spec.lines[0].size_bytes, 8192);
        assert_eq!(spec.outstanding_ios, 4);
        let s = LoadScenario::from_spec("bs=64k,read=30,random=0").unwrap();
        let spec = s.vms[0].run.access().unwrap();
        assert_eq!(spec.lines[0].random_pct, 0.0);
        assert!((spec.read_pct() - 30.0).abs() < 1e-9);
        let _ = Direction::Read;
    }

    #[test]
    fn bad_specs_say_why() {
        for (s, why) in [
            ("bs=4x", "not a size"),
            ("qd=0", "whole number"),
            ("read=150", "percentage"),
            ("frobnicate", "unknown item"),
            ("vms=1.5", "whole number"),
            ("", "empty"),
        ] {
            let e = LoadScenario::from_spec(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn sim_scenario_files_keep_the_workload_part() {
        let text = r#"
[scenario]
name = "two"
seed = 9
duration_s = 30
warmup_s = 2

[array]
preset = "15k-sas-raid5x24"

[[host]]
name = "esx-1"

[[workload]]
name = "seq"
block_kib = 64
read_pct = 100
random_pct = 0
outstanding_ios = 4

[[vm]]
name = "a"
host = "esx-1"
workload = "seq"
shares = "high"
disk_gib = 0.5

[[vm]]
name = "b"
host = "esx-1"
workload = "oltp"
count = 2
volume = "vol-b"
"#;
        let s = LoadScenario::from_toml_str("t.toml", text).unwrap();
        assert_eq!(
            (s.name.as_str(), s.seed, s.duration_s, s.warmup_s),
            ("two", 9, Some(30.0), 2.0)
        );
        let names: Vec<&str> = s.vms.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["a", "b-1", "b-2"]);
        assert_eq!(s.vms[0].disk_bytes, Some(512 << 20));
        assert_eq!(s.vms[0].run.access().unwrap().lines[0].size_bytes, 65536);
        assert_eq!(s.vms[1].volume.as_deref(), Some("vol-b"));
        assert!(
            s.notes
                .iter()
                .any(|n| n.contains("array") && n.contains("host")),
            "{:?}",
            s.notes
        );
        assert!(s.notes.iter().any(|n| n.contains("shares")));

        let e =
            LoadScenario::from_toml_str("t.toml", "[[vm]]\nname = \"x\"\nworkload = \"nope\"\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("t.toml") && e.contains("nope"), "{e}");
        let e = LoadScenario::from_toml_str(
            "t.toml",
            "[[vm]]\nname = \"x\"\nworkload = \"oltp\"\nsharez = 1\n",
        )
        .unwrap_err()
        .to_string();
        // The simulator's own types: the same fields, the same rejection.
        assert!(e.contains("t.toml: 4:1: unknown field `sharez`"), "{e}");
        let e = LoadScenario::from_toml_str("t.toml", "[scenario\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml: 1:"), "{e}");
    }

    #[test]
    fn models_become_instances() {
        let text = r#"
[[model]]
kind = "exchange"
name = "mail"

[[vm]]
name = "ex"
workload = "mail"
count = 3

[[vm]]
name = "both"
workload = "mail"
model = "mail"
"#;
        let e = LoadScenario::from_toml_str("m.toml", text)
            .unwrap_err()
            .to_string();
        // `model = "…"` is the simulator's alias of `workload`: not both.
        assert!(e.contains("duplicate field `workload`"), "{e}");
        let text = text.split("[[vm]]\nname = \"both\"").next().unwrap();
        let s = LoadScenario::from_toml_str("m.toml", text).unwrap();
        assert_eq!(s.vms.len(), 3);
        // A second [[vm]] of the same model continues the numbering: the five
        // copies are instances 0-4 of 5 (one schedule for the model).
        let two = format!("{text}\n[[vm]]\nname = \"ex2\"\nworkload = \"mail\"\ncount = 2\n");
        let s2 = LoadScenario::from_toml_str("m.toml", &two).unwrap();
        let numbers: Vec<(u32, u32)> = s2
            .vms
            .iter()
            .map(|v| match &v.run {
                VmWorkload::Model {
                    instance,
                    instances,
                    ..
                } => (*instance, *instances),
                other => panic!("expected a model, got {other:?}"),
            })
            .collect();
        assert_eq!(numbers, [(0, 5), (1, 5), (2, 5), (3, 5), (4, 5)]);
        match &s.vms[2].run {
            VmWorkload::Model {
                spec,
                instance,
                instances,
            } => {
                assert_eq!(spec.name(), "mail");
                assert_eq!((*instance, *instances), (2, 3));
            }
            other => panic!("expected a model, got {other:?}"),
        }
        let e = LoadScenario::from_toml_str("m.toml", "[[model]]\nkind = \"tape\"\nname = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("m.toml: 2:") && e.contains("tape"), "{e}");
    }

    #[test]
    fn shipped_sim_scenarios_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "toml") {
                let s = LoadScenario::load(&ScenarioSource::File(p.clone()))
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert!(!s.vms.is_empty());
                n += 1;
            }
        }
        assert!(n >= 5, "found {n} scenario files");
    }

    /// One schema: the simulator's shipped week, read by weir load, has the same
    /// VMs, and its four pools are the four instances of one model (as the
    /// simulator runs them), not four models of one instance each.
    #[test]
    fn the_simulators_files_read_the_same_way() {
        let s = LoadScenario::load(&ScenarioSource::parse(
            "vdi-week",
            weir_sim::builtin_scenarios(),
        ))
        .unwrap();
        assert_eq!(s.name, "vdi-week");
        assert_eq!(s.duration_s, Some(1800.0));
        let pools: Vec<(&str, u32, u32)> = s
            .vms
            .iter()
            .map(|v| match &v.run {
                VmWorkload::Model {
                    instance,
                    instances,
                    ..
                } => (v.name.as_str(), *instance, *instances),
                other => panic!("expected a model, got {other:?}"),
            })
            .collect();
        assert_eq!(
            pools,
            [
                ("pool1", 0, 4),
                ("pool2", 1, 4),
                ("pool3", 2, 4),
                ("pool4", 3, 4)
            ]
        );
        assert_eq!(s.vms[0].disk_bytes, Some(200 << 30));
    }

    #[test]
    fn sources_are_told_apart() {
        assert!(matches!(
            ScenarioSource::parse("x/y.toml", weir_sim::builtin_scenarios()),
            ScenarioSource::File(_)
        ));
        assert!(matches!(
            ScenarioSource::parse("sioc-shares", weir_sim::builtin_scenarios()),
            ScenarioSource::Text { .. }
        ));
        assert!(matches!(
            ScenarioSource::parse("bs=4k", weir_sim::builtin_scenarios()),
            ScenarioSource::Spec(_)
        ));
        let s = LoadScenario::load(&ScenarioSource::parse(
            "sioc-shares",
            weir_sim::builtin_scenarios(),
        ))
        .unwrap();
        assert!(!s.vms.is_empty());
    }

    /// Times beyond 10 years (which panicked converting to a duration) or a
    /// duration below 1 ms are refused, naming the key.
    #[test]
    fn out_of_range_times_name_their_key() {
        for (line, key) in [
            ("duration_s = 1e300", "scenario.duration_s"),
            ("duration_s = 1e-300", "scenario.duration_s"),
            ("duration_s = 0", "scenario.duration_s"),
            ("warmup_s = 1e300", "scenario.warmup_s"),
            ("warmup_s = -1", "scenario.warmup_s"),
            (
                "timeline_interval_s = 1e300",
                "scenario.timeline_interval_s",
            ),
            (
                "timeline_interval_s = 1e-300",
                "scenario.timeline_interval_s",
            ),
            ("duration_s = nan", "scenario.duration_s"),
        ] {
            let text = format!("[scenario]\n{line}\n[[vm]]\nname = \"a\"\nworkload = \"oltp\"\n");
            let e = LoadScenario::from_toml_str("t.toml", &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("10 years"), "{line}: {e}");
        }
        let ok = "[scenario]\nduration_s = 315360000\nwarmup_s = 0\n[[vm]]\nname = \"a\"\nworkload = \"oltp\"\n";
        assert!(LoadScenario::from_toml_str("t.toml", ok).is_ok());
    }

    /// 100,000 VMs are expanded without a scan of the earlier ones for each (62 s
    /// before connecting); a repeated name is still found.
    #[test]
    fn many_vms_expand_in_linear_time() {
        let text = "[[vm]]\nname = \"d\"\nworkload = \"oltp\"\ncount = 100000\n";
        let t = std::time::Instant::now();
        let s = LoadScenario::from_toml_str("big.toml", text).unwrap();
        assert_eq!(s.vms.len(), 100_000);
        assert!(t.elapsed().as_secs_f64() < 10.0, "{:?}", t.elapsed());
        let mut models = String::from("[[model]]\nkind = \"exchange\"\nname = \"m\"\n");
        for i in 0..20_000 {
            models.push_str(&format!("[[vm]]\nname = \"x{i}\"\nworkload = \"m\"\n"));
        }
        let t = std::time::Instant::now();
        let s = LoadScenario::from_toml_str("big.toml", &models).unwrap();
        assert!(t.elapsed().as_secs_f64() < 10.0, "{:?}", t.elapsed());
        assert!(matches!(
            s.vms[7].run,
            VmWorkload::Model {
                instance: 7,
                instances: 20_000,
                ..
            }
        ));
        let twice = "[[vm]]\nname = \"a-2\"\nworkload = \"oltp\"\n[[vm]]\nname = \"a\"\nworkload = \"oltp\"\ncount = 3\n";
        let e = LoadScenario::from_toml_str("t.toml", twice)
            .unwrap_err()
            .to_string();
        assert!(e.contains("two VMs are named \"a-2\""), "{e}");
    }

    /// A scenario file is read up to 16 MiB (a symlink to /dev/zero grew to GBs).
    #[test]
    fn oversized_scenario_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("weir-load-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.toml");
        let line = "# padding padding padding padding padding padding padding\n";
        let text = line.repeat((MAX_SCENARIO_FILE_BYTES as usize / line.len()) + 1);
        std::fs::write(&big, text).unwrap();
        let zero = Path::new("/dev/zero");
        for p in [big.as_path(), zero].into_iter().filter(|p| p.exists()) {
            let e = LoadScenario::load(&ScenarioSource::File(p.to_path_buf()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("larger than 16 MiB"), "{}: {e}", p.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("1m"), Ok(1 << 20));
        assert_eq!(parse_bytes("512"), Ok(512));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("1.5").is_err());
    }
}
