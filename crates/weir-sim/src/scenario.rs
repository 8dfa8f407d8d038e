//! Loading scenario files: parse, apply each case's overrides and sweeps, validate,
//! and turn errors into `file:line:column: field: message`.

use crate::hw;
use crate::topology::{CaseSpec, CompareSpec, ScenarioFile};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use weir_qos::{CongestionConfig, Policy, PolicyCatalog};
use weir_workload::{AccessGenerator, AccessSpec, ModelSpec, SWEEP_PARAMS};

/// A scenario file that failed to load.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    #[error("{file}: {message}")]
    Io { file: String, message: String },
    /// `field` is a dotted path into the file (`vm[app05].host`, `case[2].set`).
    #[error("{file}:{line}:{column}: {field}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        field: String,
        message: String,
    },
}

/// A path inside the document: table keys and array indices.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

pub(crate) type PathErr = (Vec<Seg>, String);

fn key(s: &str) -> Seg {
    Seg::Key(s.to_string())
}

/// One fully resolved case, ready to run.
#[derive(Clone, Debug)]
pub(crate) struct CasePlan {
    pub name: String,
    pub description: String,
    pub params: BTreeMap<String, f64>,
    pub duration_ns: u64,
    pub warmup_ns: u64,
    pub interval_ns: u64,
    pub file: ScenarioFile,
    pub hosts: Vec<HostPlan>,
    pub vms: Vec<VmPlan>,
    pub volumes: Vec<VolumePlan>,
    pub congestion: CongestionConfig,
    pub compare: Vec<CompareSpec>,
    pub windows: Vec<WindowPlan>,
}

#[derive(Clone, Debug)]
pub(crate) struct HostPlan {
    pub name: String,
    pub link: toml::Value,
    pub cpu: Option<toml::Value>,
    pub queue_depth: u32,
    pub cost_unit_bytes: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct VmPlan {
    pub name: String,
    pub host: usize,
    pub volume: usize,
    /// The VM disk's shares/limit/reservation as a host-scheduler policy.
    pub policy: Policy,
    pub spec: AccessSpec,
    /// An application model instead of `spec`.
    pub model: Option<ModelSpec>,
    /// This VM's index among all the copies of its model (every `[[vm]]` that runs
    /// the same `[[model]]`, each `count` times), and their number: the model's
    /// schedule (login interval, power-on and clone slots) is split across them so
    /// that together they run it once.
    pub instance: u32,
    pub instances: u32,
    /// Copies of this `[[vm]]` entry (`count`).
    pub copies: u32,
    /// The `[[vm]]` name (without the copy suffix).
    pub base: String,
    pub host_cache: bool,
    /// Bytes from the disk's start to load into the caches before the run.
    pub prewarm_bytes: u64,
    pub disk_bytes: u64,
    /// Where the disk starts on the array.
    pub base_offset: u64,
}

/// A named window, in ns of the simulated clock.
#[derive(Clone, Debug)]
pub(crate) struct WindowPlan {
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct VolumePlan {
    pub name: String,
    pub policy: Policy,
}

/// A loaded scenario: its cases, expanded and validated.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// Seed used when `run` gets none.
    pub seed: u64,
    pub(crate) cases: Vec<CasePlan>,
}

// `from_file`, `from_toml_str` and `deserialize_file` are `#[inline]` for build time:
// an inline function is compiled in the crate that calls it, at that crate's
// optimisation level, so the serde code for the scenario model (about half of this
// crate's generated code) is compiled in the CLI at opt-level 0, not here at
// opt-level 3. Loading runs once per scenario; the event loop stays here.
impl Scenario {
    #[inline]
    pub fn from_file(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let io = |message: String| ScenarioError::Io {
            file: file.clone(),
            message,
        };
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(
                std::fs::File::open(path).map_err(|e| io(e.to_string()))?,
                MAX_FILE_BYTES + 1,
            ),
            &mut text,
        )
        .map_err(|e| io(e.to_string()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(io(format!(
                "larger than {} MiB: not a scenario file",
                MAX_FILE_BYTES >> 20
            )));
        }
        Scenario::from_toml_str(&file, &text)
    }

    /// Parses scenario text; `name_for_errors` stands for the file in messages.
    ///
    /// One parse and one deserializer: the text is parsed once into toml's spanned
    /// tree; the base file and each case (that tree with the case's `set` and dotted
    /// sweep values applied) are deserialized from it by toml's own deserializer, so
    /// the serde code of the scenario model is compiled for a single deserializer.
    #[inline]
    pub fn from_toml_str(name_for_errors: &str, text: &str) -> Result<Scenario, ScenarioError> {
        let located =
            |path: &[Seg], message: String| locate_error(name_for_errors, text, path, message);
        let invalid = |root: Option<&DeTable<'_>>, e: toml::de::Error| {
            let offset = e.span().unwrap_or(0..0).start;
            let field = root.map(|r| path_at(r, offset)).unwrap_or_default();
            invalid_at(
                name_for_errors,
                line_col(text, offset),
                field,
                e.message().to_string(),
            )
        };
        let root = DeTable::parse(text).map_err(|e| invalid(None, e))?;
        let file = deserialize_file(root.clone()).map_err(|e| {
            // An entry that converts after deserializing: its own place.
            match weir_scenario::failing_entry(text) {
                Some(f) => {
                    let offset = f.offset_given(&e);
                    invalid_at(
                        name_for_errors,
                        line_col(text, offset),
                        path_at(root.get_ref(), offset),
                        f.message,
                    )
                }
                None => invalid(Some(root.get_ref()), e),
            }
        })?;
        // The base file must be valid on its own.
        plan_case(&file, "base", "", BTreeMap::new(), &[]).map_err(|(p, m)| located(&p, m))?;
        // What each case starts from: the document without its cases.
        let mut base_doc = root.get_ref().clone();
        base_doc.remove("case");
        let case_docs: &[toml::Spanned<DeValue<'_>>] = match root.get_ref().get("case") {
            Some(c) => match c.get_ref() {
                DeValue::Array(items) => items,
                _ => &[],
            },
            None => &[],
        };
        // Dotted sweep values as TOML number text (the values of a case borrow it).
        let numbers: BTreeMap<u64, String> = file
            .case
            .iter()
            .flat_map(|c| &c.sweep)
            .filter(|s| s.param.contains('.'))
            .flat_map(|s| &s.values)
            .map(|x| (x.to_bits(), toml_number(*x)))
            .collect();
        let mut cases = Vec::new();
        let specs: Vec<CaseSpec> = if file.case.is_empty() {
            vec![CaseSpec {
                name: "base".into(),
                description: String::new(),
                set: Default::default(),
                sweep: vec![],
                compare: vec![],
            }]
        } else {
            file.case.clone()
        };
        check_case_count(&specs).map_err(|(p, m)| located(&p, m))?;
        let mut names = std::collections::BTreeSet::new();
        for (ci, case) in specs.iter().enumerate() {
            let at = |sub: &[Seg]| {
                let mut p = vec![key("case"), Seg::Index(ci)];
                p.extend_from_slice(sub);
                p
            };
            let case_doc = case_docs.get(ci).map(|c| c.get_ref());
            let mut value = DeValue::Table(base_doc.clone());
            if let Some(set) = case_doc
                .and_then(|c| c.get("set"))
                .and_then(|s| s.get_ref().as_table())
            {
                for (k, v) in set.iter() {
                    let k: &str = k.get_ref();
                    set_path(&mut value, k, v.clone())
                        .map_err(|m| located(&at(&[key("set"), key(k)]), m))?;
                }
            }
            check_sweeps(case).map_err(|(p, m)| located(&at(&p), m))?;
            let sweeps: Vec<weir_workload::Sweep> = case
                .sweep
                .iter()
                .map(|s| weir_workload::Sweep {
                    param: s.param.clone(),
                    values: s.values.clone(),
                })
                .collect();
            let sweep_span = case_doc
                .and_then(|c| c.get("sweep"))
                .map(|s| s.span())
                .unwrap_or(0..0);
            for params in weir_workload::expand_sweeps(&sweeps) {
                let v = with_dotted_values(&value, &params, &numbers, &sweep_span)
                    .map_err(|m| located(&at(&[key("sweep")]), m))?;
                let DeValue::Table(t) = v else {
                    return Err(located(&[], "internal: the document is not a table".into()));
                };
                let resolved = deserialize_file(toml::Spanned::new(root.span(), t)).map_err(
                    |e: toml::de::Error| {
                        located(
                            &at(&[key("set")]),
                            format!("after this case's overrides: {}", e.message()),
                        )
                    },
                )?;
                let name = point_name(&case.name, &params);
                if !names.insert(name.clone()) {
                    return Err(located(
                        &at(&[key("name")]),
                        format!("two cases are named {name:?}"),
                    ));
                }
                let mut plan = plan_case(
                    &resolved,
                    &name,
                    &case.description,
                    params.clone(),
                    &case.compare,
                )
                .map_err(|(p, m)| {
                    let field = render_path(&p);
                    located(&at(&[]), format!("case {name:?}: {field}: {m}"))
                })?;
                apply_workload_sweeps(&mut plan, case, &params)
                    .map_err(|(p, m)| located(&at(&p), m))?;
                cases.push(plan);
            }
        }
        Ok(Scenario {
            name: file.scenario.name.clone(),
            description: file.scenario.description.clone(),
            seed: file.scenario.seed,
            cases,
        })
    }

    /// Names of the (expanded) cases, in run order.
    pub fn case_names(&self) -> Vec<String> {
        self.cases.iter().map(|c| c.name.clone()).collect()
    }

    /// Scales every case's warm-up and measured time by `factor` (0 < factor ≤ 1), e.g.
    /// for quick checks; the timeline interval is kept.
    pub fn scale_duration(&mut self, factor: f64) {
        let f = factor.clamp(1e-6, 1.0);
        for c in &mut self.cases {
            c.duration_ns =
                ((c.duration_ns as f64 * f) as u64).max(c.interval_ns.min(c.duration_ns));
            c.warmup_ns = (c.warmup_ns as f64 * f) as u64;
        }
    }

    /// Simulated seconds each case runs (warm-up + duration), in run order.
    pub fn case_simulated_s(&self) -> Vec<f64> {
        self.cases
            .iter()
            .map(|c| (c.warmup_ns + c.duration_ns) as f64 / 1e9)
            .collect()
    }

    /// Keeps only the cases whose name contains `pattern`.
    pub fn retain_cases(&mut self, pattern: &str) {
        self.cases.retain(|c| c.name.contains(pattern));
    }
}

/// Largest scenario file read (the shipped ones are under 100 KB; `weir load`
/// reads the same 16 MiB at most).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Most `[[volume]]`s a scenario declares (the shipped ones: at most 6; 20,000
/// took more than 3 GB).
pub const MAX_VOLUMES: usize = 10_000;

/// Most cases a scenario expands to (sweeps multiplied out): the shipped ones
/// have at most 78; every case is planned (its hardware built) while loading.
pub const MAX_CASES: u64 = 1000;

/// The scenario's cases, sweeps multiplied out, are at most [`MAX_CASES`]:
/// counted before anything is expanded (3 sweeps of 1,000 values each asked
/// for a 24 GB allocation).
fn check_case_count(specs: &[CaseSpec]) -> Result<(), PathErr> {
    let mut total = 0u64;
    for (ci, case) in specs.iter().enumerate() {
        let points = (case.sweep.iter()).fold(1u64, |n, s| n.saturating_mul(s.values.len() as u64));
        total = total.saturating_add(points);
        if total > MAX_CASES {
            return Err(err(
                vec![key("case"), Seg::Index(ci), key("sweep")],
                format!(
                    "the scenario expands to more than {MAX_CASES} cases here (this case's \
                     sweeps: {points} points): split it, or sweep fewer values"
                ),
            ));
        }
    }
    Ok(())
}

/// A case's sweeps name known parameters and have values; the error's path is
/// inside the case.
fn check_sweeps(case: &CaseSpec) -> Result<(), PathErr> {
    for (si, sweep) in case.sweep.iter().enumerate() {
        let known = sweep.param.contains('.') || SWEEP_PARAMS.contains(&sweep.param.as_str());
        if known && !sweep.values.is_empty() {
            continue;
        }
        let m = if known {
            "a sweep needs at least one value".to_string()
        } else {
            format!(
                "unknown sweep parameter {:?} (workload parameters: {}; or a dotted path such as \"array.drives\")",
                sweep.param,
                SWEEP_PARAMS.join(", ")
            )
        };
        return Err((vec![key("sweep"), Seg::Index(si), key("param")], m));
    }
    Ok(())
}

/// `value` (a case's document) with one sweep point's dotted parameters set, each
/// from its TOML number text in `numbers` (keyed by the value's bits).
fn with_dotted_values<'a>(
    value: &DeValue<'a>,
    params: &BTreeMap<String, f64>,
    numbers: &'a BTreeMap<u64, String>,
    span: &Range<usize>,
) -> Result<DeValue<'a>, String> {
    let mut v = value.clone();
    for (p, x) in params.iter().filter(|(p, _)| p.contains('.')) {
        let num = numbers
            .get(&x.to_bits())
            .map(|t| DeValue::parse(t))
            .ok_or_else(|| format!("internal: no text for sweep value {x}"))?
            .map_err(|e| e.message().to_string())?
            .into_inner();
        set_path(&mut v, p, toml::Spanned::new(span.clone(), num))?;
    }
    Ok(v)
}

/// A sweep point's case name: the case's, then `/param=value,…`.
fn point_name(case: &str, params: &BTreeMap<String, f64>) -> String {
    if params.is_empty() {
        return case.to_string();
    }
    let p: Vec<String> = params
        .iter()
        .map(|(k, x)| format!("{k}={}", fmt_num(*x)))
        .collect();
    format!("{case}/{}", p.join(","))
}

/// Sets a sweep point's workload parameters on the planned VMs they name (all
/// without a model when they name none), checking each VM's access spec still
/// builds; the error's path is inside the case.
fn apply_workload_sweeps(
    plan: &mut CasePlan,
    case: &CaseSpec,
    params: &BTreeMap<String, f64>,
) -> Result<(), PathErr> {
    let named = |s: &weir_scenario::CaseSweep, vm: &str| {
        s.vms.iter().any(|n| n == vm || n == base_name(vm))
    };
    for (si, s) in case.sweep.iter().enumerate() {
        if s.param.contains('.') {
            continue;
        }
        if let Some(missing) = s.vms.iter().find(|n| {
            !plan
                .vms
                .iter()
                .any(|v| &&v.name == n || base_name(&v.name) == n.as_str())
        }) {
            let path = vec![key("sweep"), Seg::Index(si), key("vms")];
            return Err((path, format!("no VM named {missing:?}")));
        }
        let x = params[&s.param];
        let chosen = plan
            .vms
            .iter_mut()
            .filter(|v| v.model.is_none() && (s.vms.is_empty() || named(s, &v.name)));
        for vm in chosen {
            vm.spec
                .set_param(&s.param, x)
                .and_then(|_| AccessGenerator::new(&vm.spec, vm.disk_bytes, 0).map(|_| ()))
                .map_err(|e| {
                    let path = vec![key("sweep"), Seg::Index(si), key("values")];
                    (path, format!("case {:?}, VM {}: {e}", plan.name, vm.name))
                })?;
        }
    }
    Ok(())
}

fn base_name(vm: &str) -> &str {
    match vm.rsplit_once('-') {
        Some((b, n)) if n.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => vm,
    }
}

pub(crate) fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

#[inline]
fn deserialize_file(doc: toml::Spanned<DeTable<'_>>) -> Result<ScenarioFile, toml::de::Error> {
    serde::Deserialize::deserialize(toml::de::Deserializer::from(doc))
}

/// A sweep value as TOML: an integer when it is whole (and exact as one), else a float.
fn toml_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 9e15 {
        format!("{}", x as i64)
    } else if x.is_nan() {
        "nan".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        // Debug prints the shortest text that reads back as the same f64, always
        // with a `.` or an exponent (so TOML reads a float).
        format!("{x:?}")
    }
}

/// Sets `path` (dot separated; arrays of named tables addressed by name) to `value`.
fn set_path<'a>(
    root: &mut DeValue<'a>,
    path: &str,
    value: toml::Spanned<DeValue<'a>>,
) -> Result<(), String> {
    let segs: Vec<&str> = path.split('.').collect();
    let Some((last, parents)) = segs.split_last() else {
        return Err(format!("bad path {path:?}: empty segment"));
    };
    if segs.iter().any(|s| s.is_empty()) {
        return Err(format!("bad path {path:?}: empty segment"));
    }
    let span = value.span();
    let key = |seg: &str| toml::Spanned::new(span.clone(), Cow::Owned(seg.to_string()));
    let not_a_table = |i: usize| format!("{path:?}: {:?} is not a table", segs[..i].join("."));
    let mut cur = root;
    for (i, seg) in parents.iter().enumerate() {
        cur = match cur {
            DeValue::Table(t) => t
                .entry(key(seg))
                .or_insert_with(|| toml::Spanned::new(span.clone(), DeValue::Table(DeTable::new())))
                .get_mut(),
            DeValue::Array(items) => {
                let pos = named_element(items, seg, path)?;
                items.as_mut()[pos].get_mut()
            }
            _ => return Err(not_a_table(i)),
        };
    }
    match cur {
        DeValue::Table(t) => {
            t.insert(key(last), value);
        }
        DeValue::Array(items) => {
            let pos = named_element(items, last, path)?;
            items.as_mut()[pos] = value;
        }
        _ => return Err(not_a_table(parents.len())),
    }
    Ok(())
}

/// The index of the table named `name` in an array of tables.
fn named_element(items: &toml::de::DeArray<'_>, name: &str, path: &str) -> Result<usize, String> {
    let name_of = |v: &toml::Spanned<DeValue<'_>>| -> Option<String> {
        Some(v.get_ref().get("name")?.get_ref().as_str()?.to_string())
    };
    items
        .iter()
        .position(|v| name_of(v).as_deref() == Some(name))
        .ok_or_else(|| {
            let names: Vec<String> = items.iter().filter_map(name_of).collect();
            format!(
                "{path:?}: no entry named {name:?} (have: {})",
                names.join(", ")
            )
        })
}

/// Most I/Os the VMs of one case may keep outstanding (memory bound).
const MAX_IN_FLIGHT: u64 = 4_000_000;
/// Most per-VM timeline points of one case (memory bound).
const MAX_TIMELINE_POINTS: u64 = 5_000_000;

/// A VM's disk in GiB as the simulator sizes it (the file's, or the default).
fn disk_gib(v: &crate::topology::VmSpec) -> f64 {
    v.disk_gib
        .unwrap_or(crate::topology::VmSpec::DEFAULT_DISK_GIB)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A [`PathErr`]: `message` about the field at `path`.
fn err(path: Vec<Seg>, message: String) -> PathErr {
    (path, message)
}

/// The path of field `field` of entry `i` of the array of tables `table`.
fn entry_field(table: &str, i: usize, field: &str) -> Vec<Seg> {
    vec![key(table), Seg::Index(i), key(field)]
}

/// Checks a volume, host or VM name (at `path`).
fn check_name(path: Vec<Seg>, name: &str) -> Result<(), PathErr> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(err(
            path,
            format!("names are 1-64 characters of [A-Za-z0-9_-], got {name:?}"),
        ))
    }
}

/// Resolves and validates one case; errors carry a path into `file`.
pub(crate) fn plan_case(
    file: &ScenarioFile,
    name: &str,
    description: &str,
    params: BTreeMap<String, f64>,
    compare: &[CompareSpec],
) -> Result<CasePlan, PathErr> {
    let clock = check_header(file)?;
    let mut volumes = plan_volumes(file)?;
    let hosts = plan_hosts(file)?;
    check_datastore(file)?;
    if let Some(q) = &file.array_qos {
        check_array_qos(q)?;
    }
    check_workload_names(file)?;
    let (vms, disks_end) = plan_vms(file, &hosts, &mut volumes)?;
    check_vm_load(&vms, &clock)?;
    hw::build_array(&file.array, 0, disks_end).map_err(|m| err(vec![key("array")], m))?;
    let compare: Vec<CompareSpec> = compare
        .iter()
        .filter(|c| c.when.iter().all(|(k, v)| params.get(k) == Some(v)))
        .cloned()
        .collect();
    let windows = plan_windows(file)?;
    check_caches(file)?;
    for (i, cmp) in compare.iter().enumerate() {
        crate::engine::check_metric(&cmp.metric, &vms, &volumes, &windows)
            .map_err(|m| err(entry_field("compare", i, "metric"), m))?;
    }
    Ok(CasePlan {
        name: name.to_string(),
        description: description.to_string(),
        params,
        duration_ns: clock.duration_ns,
        warmup_ns: clock.warmup_ns,
        interval_ns: clock.interval_ns,
        file: file.clone(),
        hosts,
        vms,
        volumes,
        congestion: file.datastore.congestion.clone(),
        compare,
        windows,
    })
}

/// A case's measured time, warm-up and timeline interval, in ns.
struct Clock {
    duration_ns: u64,
    warmup_ns: u64,
    interval_ns: u64,
}

/// `[scenario].<field>` = `v` seconds in ns: in (0, 1e6] (`min_exclusive`) or [0, 1e6].
fn field_ns(field: &str, v: f64, min_exclusive: bool) -> Result<u64, PathErr> {
    let ok = v.is_finite() && v <= 1e6 && if min_exclusive { v > 0.0 } else { v >= 0.0 };
    if ok {
        Ok((v * 1e9).round() as u64)
    } else {
        Err(err(
            vec![key("scenario"), key(field)],
            format!(
                "must be {} 1e6 s, got {v}",
                if min_exclusive { "in (0," } else { "in [0," }
            )
            .replace(" 1e6", " 1e6]"),
        ))
    }
}

/// Checks `[scenario]` (times, name, timeline length) and that there is an `[array]`.
fn check_header(file: &ScenarioFile) -> Result<Clock, PathErr> {
    let h = &file.scenario;
    let duration_s = h.duration_s.ok_or_else(|| {
        err(
            vec![key("scenario"), key("duration_s")],
            "missing: the simulator needs the measured time, s".into(),
        )
    })?;
    let clock = Clock {
        duration_ns: field_ns("duration_s", duration_s, true)?,
        warmup_ns: field_ns("warmup_s", h.warmup_s, false)?,
        interval_ns: field_ns("timeline_interval_s", h.timeline_interval_s, true)?,
    };
    if h.name.is_empty() {
        return Err(err(
            vec![key("scenario"), key("name")],
            "must not be empty (the simulator needs a name)".into(),
        ));
    }
    if file.array.is_empty() {
        return Err(err(
            vec![key("array")],
            "missing: the simulator needs an [array]".into(),
        ));
    }
    if (clock.duration_ns + clock.warmup_ns) / clock.interval_ns > 100_000 {
        return Err(err(
            vec![key("scenario"), key("timeline_interval_s")],
            "more than 100,000 timeline intervals".into(),
        ));
    }
    Ok(clock)
}

/// The `[[volume]]`s with their `[[policy]]` (best effort without one).
fn plan_volumes(file: &ScenarioFile) -> Result<Vec<VolumePlan>, PathErr> {
    if file.volume.len() > MAX_VOLUMES {
        return Err(err(
            vec![key("volume")],
            format!(
                "{} volumes: at most {MAX_VOLUMES} (each keeps its own latency histogram)",
                file.volume.len()
            ),
        ));
    }
    let mut catalog = PolicyCatalog::new();
    let mut policy_names = std::collections::HashSet::new();
    for (i, p) in file.policy.iter().enumerate() {
        if !policy_names.insert(p.name.as_str()) {
            return Err(err(
                entry_field("policy", i, "name"),
                format!("two policies are named {:?}", p.name),
            ));
        }
        catalog
            .insert(p.clone())
            .map_err(|e| err(vec![key("policy"), Seg::Index(i)], e.to_string()))?;
    }
    let mut volumes = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, v) in file.volume.iter().enumerate() {
        check_name(entry_field("volume", i, "name"), &v.name)?;
        if !names.insert(v.name.as_str()) {
            return Err(err(
                entry_field("volume", i, "name"),
                format!("two volumes are named {:?}", v.name),
            ));
        }
        let policy = match &v.policy {
            Some(p) => catalog
                .get(p)
                .map_err(|e| err(entry_field("volume", i, "policy"), e.to_string()))?
                .clone(),
            None => Policy::best_effort(v.name.clone()),
        };
        volumes.push(VolumePlan {
            name: v.name.clone(),
            policy,
        });
    }
    Ok(volumes)
}

/// The `[[host]]`s (at least one), names unique, queue and link valid.
fn plan_hosts(file: &ScenarioFile) -> Result<Vec<HostPlan>, PathErr> {
    if file.host.is_empty() {
        return Err(err(
            vec![key("host")],
            "a scenario needs at least one [[host]]".into(),
        ));
    }
    let mut hosts = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, hs) in file.host.iter().enumerate() {
        let at = |f: &str| entry_field("host", i, f);
        check_name(at("name"), &hs.name)?;
        if !names.insert(hs.name.as_str()) {
            return Err(err(
                at("name"),
                format!("two hosts are named {:?}", hs.name),
            ));
        }
        if !(1..=65536).contains(&hs.queue_depth) {
            return Err(err(
                at("queue_depth"),
                format!("must be 1-65536, got {}", hs.queue_depth),
            ));
        }
        if hs.cost_unit_bytes == 0 {
            return Err(err(at("cost_unit_bytes"), "must be at least 1".into()));
        }
        hw::build_link(&hs.link).map_err(|m| err(at("link"), m))?;
        if let Some(cpu) = &hs.cpu {
            hw::build_processor(cpu).map_err(|m| err(at("cpu"), m))?;
        }
        hosts.push(HostPlan {
            name: hs.name.clone(),
            link: hs.link.clone(),
            cpu: hs.cpu.clone(),
            queue_depth: hs.queue_depth,
            cost_unit_bytes: hs.cost_unit_bytes,
        });
    }
    Ok(hosts)
}

/// Checks `[datastore]`: its target link and processor and the congestion control's settings.
fn check_datastore(file: &ScenarioFile) -> Result<(), PathErr> {
    if let Some(t) = &file.datastore.target_link {
        hw::build_link(t).map_err(|m| err(vec![key("datastore"), key("target_link")], m))?;
    }
    if let Some(c) = &file.datastore.target_cpu {
        hw::build_processor(c).map_err(|m| err(vec![key("datastore"), key("target_cpu")], m))?;
    }
    // The same rule as the server's (weir_qos's `validate`), reported at its key.
    let c = &file.datastore.congestion;
    if let Err(e) = c.validate() {
        use weir_qos::CongestionError as E;
        let field = match e {
            E::ThresholdMs(_) => "threshold_ms",
            E::Gamma(_) => "gamma",
            E::Window { .. } => "min_window",
            E::PeriodMs(_) => "period_ms",
            E::Beta(_) => "beta_per_1000_shares",
        };
        let at = vec![key("datastore"), key("congestion"), key(field)];
        return Err(err(at, e.to_string()));
    }
    Ok(())
}

/// Checks `[array_qos]`: concurrency, cost unit and the depth controller.
fn check_array_qos(q: &crate::topology::ArrayQosSpec) -> Result<(), PathErr> {
    if q.backend_concurrency == 0 || q.backend_concurrency > 65536 {
        return Err(err(
            vec![key("array_qos"), key("backend_concurrency")],
            format!("must be 1-65536, got {}", q.backend_concurrency),
        ));
    }
    if let Some(n) = q.flash_concurrency
        && (n == 0 || n > 65536)
    {
        return Err(err(
            vec![key("array_qos"), key("flash_concurrency")],
            format!("must be 1-65536, got {n}"),
        ));
    }
    if q.cost_unit_bytes == 0 {
        return Err(err(
            vec![key("array_qos"), key("cost_unit_bytes")],
            "must be at least 1".into(),
        ));
    }
    check_depth(&q.depth)
}

/// Checks `[array_qos].depth`, the back end's depth controller.
fn check_depth(d: &weir_qos::DepthConfig) -> Result<(), PathErr> {
    let at = |f: &str| vec![key("array_qos"), key("depth"), key(f)];
    let fraction = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
    if d.min_depth == 0 {
        return Err(err(at("min_depth"), "must be at least 1".into()));
    }
    if !(d.period_ms.is_finite() && d.period_ms >= 1.0) {
        return Err(err(
            at("period_ms"),
            format!("must be at least 1 ms, got {}", d.period_ms),
        ));
    }
    for (f, x) in [
        ("over_target_budget", d.over_target_budget),
        ("over_twice_budget", d.over_twice_budget),
    ] {
        if !fraction(x) {
            return Err(err(at(f), format!("must be in [0, 1], got {x}")));
        }
    }
    if !(d.decrease.is_finite() && d.decrease > 0.0 && d.decrease < 1.0) {
        return Err(err(
            at("decrease"),
            format!("must be in (0, 1), got {}", d.decrease),
        ));
    }
    Ok(())
}

/// Checks the names of the `[[workload]]`s and `[[model]]`s: valid workload names,
/// and no name twice among them (a VM's `workload` names one of them: a second
/// entry of the same name would be ignored).
fn check_workload_names(file: &ScenarioFile) -> Result<(), PathErr> {
    for (i, w) in file.workload.iter().enumerate() {
        if !valid_name(&w.name) {
            return Err(err(
                entry_field("workload", i, "name"),
                format!(
                    "a [[workload]] needs a name of [A-Za-z0-9_-], got {:?}",
                    w.name
                ),
            ));
        }
        if file.workload[..i].iter().any(|x| x.name == w.name) {
            return Err(err(
                entry_field("workload", i, "name"),
                format!("two workloads are named {:?}", w.name),
            ));
        }
    }
    for (i, m) in file.model.iter().enumerate() {
        let name = m.name();
        if file.model[..i].iter().any(|x| x.name() == name) {
            return Err(err(
                entry_field("model", i, "name"),
                format!("two models are named {name:?}"),
            ));
        }
        if file.workload.iter().any(|w| w.name == name) {
            return Err(err(
                entry_field("model", i, "name"),
                format!(
                    "a [[workload]] is named {name:?} too: a VM's `workload` would not say which"
                ),
            ));
        }
    }
    Ok(())
}

/// One plan per copy of every `[[vm]]` (at least one entry), their disks laid out
/// one after the other on the array; also where the last disk ends. Adds the
/// datastore's volume to `volumes` when a VM names none.
fn plan_vms(
    file: &ScenarioFile,
    hosts: &[HostPlan],
    volumes: &mut Vec<VolumePlan>,
) -> Result<(Vec<VmPlan>, u64), PathErr> {
    if file.vm.is_empty() {
        return Err(err(
            vec![key("vm")],
            "a scenario needs at least one [[vm]]".into(),
        ));
    }
    let fill_bytes = fill_disk_bytes(file)?;
    let mut vms: Vec<VmPlan> = Vec::new();
    let mut next_offset = 0u64;
    // Copies of each model seen so far (see `VmEntry::first_instance`).
    let mut model_seen: BTreeMap<&str, u32> = BTreeMap::new();
    // Names taken so far: one look-up per copy (a scan of `vms` was quadratic:
    // 50,000 VMs took 20 s to parse).
    let mut names: std::collections::HashSet<String> = std::collections::HashSet::new();
    for i in 0..file.vm.len() {
        let entry = VmEntry::resolve(file, i, hosts, volumes, fill_bytes, &mut model_seen)?;
        for k in 0..entry.v.count {
            let vm = entry.copy(file, k, &names, next_offset)?;
            next_offset += vm.disk_bytes;
            names.insert(vm.name.clone());
            vms.push(vm);
        }
    }
    Ok((vms, next_offset))
}

/// The disk of a VM with `disk_gib = 0`: an equal part of what the other VMs'
/// disks leave of the array (MiB-aligned); 0 when no VM asks for one.
fn fill_disk_bytes(file: &ScenarioFile) -> Result<u64, PathErr> {
    let fill_vms: u64 = file
        .vm
        .iter()
        .filter(|v| disk_gib(v) == 0.0)
        .map(|v| v.count as u64)
        .sum();
    if fill_vms == 0 {
        return Ok(0);
    }
    let capacity = hw::build_array(&file.array, 0, 0)
        .map_err(|m| err(vec![key("array")], m))?
        .capacity_bytes()
        .ok_or_else(|| err(vec![key("array")], "`disk_gib = 0` (the rest of the array) needs an array with a capacity; an ideal array has none".into()))?;
    let fixed: f64 = file
        .vm
        .iter()
        .filter(|v| disk_gib(v) > 0.0)
        .map(|v| disk_gib(v) * v.count as f64 * (1u64 << 30) as f64)
        .sum();
    let rest = capacity.saturating_sub(fixed as u64);
    Ok(rest.checked_div(fill_vms).unwrap_or(0) / (1 << 20) * (1 << 20))
}

/// Copies of model `name` in the file: every copy of every `[[vm]]` running it.
fn model_copies(file: &ScenarioFile, name: &str) -> u32 {
    file.vm
        .iter()
        .filter(|v| v.workload == name)
        .map(|v| v.count)
        .sum()
}

/// One `[[vm]]` entry, resolved: what its copies share.
struct VmEntry<'f> {
    /// Its index in `file.vm`.
    i: usize,
    v: &'f crate::topology::VmSpec,
    host: usize,
    volume: usize,
    spec: AccessSpec,
    model: Option<ModelSpec>,
    disk_bytes: u64,
    /// A model's schedule is the model's, not each `[[vm]]` entry's: every copy of
    /// every `[[vm]]` running it is one instance of it (numbered in file order). The
    /// first copy's instance number, and the number of instances.
    first_instance: u32,
    instances: u32,
}

impl<'f> VmEntry<'f> {
    /// Resolves entry `i` of `file.vm`: its host, workload, volume and disk size.
    fn resolve(
        file: &'f ScenarioFile,
        i: usize,
        hosts: &[HostPlan],
        volumes: &mut Vec<VolumePlan>,
        fill_bytes: u64,
        model_seen: &mut BTreeMap<&'f str, u32>,
    ) -> Result<VmEntry<'f>, PathErr> {
        let v = &file.vm[i];
        let at = |f: &str| entry_field("vm", i, f);
        check_name(at("name"), &v.name)?;
        // Also with `count = 0` (a case's `vm.NAME.…` would only reach the first).
        if file.vm[..i].iter().any(|x| x.name == v.name) {
            return Err(err(at("name"), format!("two VMs are named {:?}", v.name)));
        }
        if v.host.is_empty() {
            return Err(err(
                at("host"),
                "missing: the simulator places every VM on a [[host]]".into(),
            ));
        }
        let host = hosts
            .iter()
            .position(|x| x.name == v.host)
            .ok_or_else(|| err(at("host"), format!("no [[host]] named {:?}", v.host)))?;
        let model = file.model.iter().find(|m| m.name() == v.workload).cloned();
        let spec = vm_access_spec(file, i, model.is_some())?;
        let volume = vm_volume(file, i, volumes)?;
        let disk_bytes = vm_disk_bytes(file, i, fill_bytes)?;
        let (first_instance, instances) = match &model {
            Some(_) => {
                let seen = model_seen.entry(v.workload.as_str()).or_insert(0);
                let first = *seen;
                *seen += v.count;
                (first, model_copies(file, &v.workload))
            }
            None => (0, v.count),
        };
        Ok(VmEntry {
            i,
            v,
            host,
            volume,
            spec,
            model,
            disk_bytes,
            first_instance,
            instances,
        })
    }

    /// Copy `k` of the entry, its disk at `base_offset`; `vms`: the VMs so far.
    fn copy(
        &self,
        file: &ScenarioFile,
        k: u32,
        taken: &std::collections::HashSet<String>,
        base_offset: u64,
    ) -> Result<VmPlan, PathErr> {
        let v = self.v;
        let at = |f: &str| entry_field("vm", self.i, f);
        let vm_name = if v.count == 1 {
            v.name.clone()
        } else {
            format!("{}-{}", v.name, k + 1)
        };
        if taken.contains(&vm_name) {
            return Err(err(at("name"), format!("two VMs are named {vm_name:?}")));
        }
        let policy = Policy {
            name: vm_name.clone(),
            service_level: None,
            reservation_iops: v.reservation_iops,
            reservation_mbps: None,
            limit_iops: v.limit_iops,
            limit_mbps: None,
            shares: v.shares,
            latency_target_ms: None,
            burst_seconds: 0.0,
        };
        policy
            .validate()
            .map_err(|e| err(at("limit_iops"), e.to_string()))?;
        self.check_generator(k)?;
        let host = &file.host[self.host];
        if v.host_cache && !host.flash_cache.as_ref().is_some_and(|c| c.enabled) {
            return Err(err(
                at("host_cache"),
                format!("host {:?} has no enabled flash_cache", host.name),
            ));
        }
        let prewarm_bytes = match (
            v.prewarm_cache,
            self.model.as_ref().and_then(|m| m.data_bytes()),
        ) {
            (false, _) => 0,
            (true, Some(bytes)) => bytes.min(self.disk_bytes),
            (true, None) => {
                return Err(err(
                    at("prewarm_cache"),
                    "only an OLTP or Exchange model has a data region to pre-warm".into(),
                ));
            }
        };
        Ok(VmPlan {
            name: vm_name,
            host: self.host,
            volume: self.volume,
            policy,
            spec: self.spec.clone(),
            model: self.model.clone(),
            instance: self.first_instance + k,
            instances: self.instances,
            copies: v.count,
            base: v.name.clone(),
            host_cache: v.host_cache,
            prewarm_bytes,
            disk_bytes: self.disk_bytes,
            base_offset,
        })
    }

    /// Checks that copy `k`'s model or access generator builds on its disk.
    fn check_generator(&self, k: u32) -> Result<(), PathErr> {
        let at = |f: &str| entry_field("vm", self.i, f);
        let workload = &self.v.workload;
        match &self.model {
            Some(m) => {
                if let Err(e) = m.build(self.disk_bytes, 0, self.first_instance + k, self.instances)
                {
                    return Err(err(at("workload"), format!("model {workload:?}: {e}")));
                }
            }
            None => {
                AccessGenerator::new(&self.spec, self.disk_bytes, 0)
                    .map_err(|e| err(at("workload"), format!("workload {workload:?}: {e}")))?;
            }
        }
        Ok(())
    }
}

/// The access specification of `[[vm]]` entry `i`: its `[[workload]]`, a placeholder
/// when it runs a model (`is_model`), else the built-in profile of that name.
fn vm_access_spec(file: &ScenarioFile, i: usize, is_model: bool) -> Result<AccessSpec, PathErr> {
    let v = &file.vm[i];
    match file.workload.iter().find(|w| w.name == v.workload) {
        Some(w) => Ok(w.clone()),
        None if is_model => Ok(AccessSpec::simple(4096, 100.0, 100.0, 1)),
        None => weir_workload::profile(&v.workload)
            .map(|p| p.spec)
            .map_err(|_| {
                err(
                    entry_field("vm", i, "workload"),
                    format!(
                        "no [[workload]], [[model]] or built-in profile named {:?} (profiles: {})",
                        v.workload,
                        weir_workload::profile_names().join(", ")
                    ),
                )
            }),
    }
}

/// The volume of `[[vm]]` entry `i`: the one it names, else the datastore's (added
/// to `volumes`, best effort, when it is not there yet).
fn vm_volume(
    file: &ScenarioFile,
    i: usize,
    volumes: &mut Vec<VolumePlan>,
) -> Result<usize, PathErr> {
    match &file.vm[i].volume {
        Some(name) => volumes.iter().position(|x| &x.name == name).ok_or_else(|| {
            err(
                entry_field("vm", i, "volume"),
                format!("no [[volume]] named {name:?}"),
            )
        }),
        None => {
            if let Some(p) = volumes.iter().position(|x| x.name == file.datastore.name) {
                Ok(p)
            } else {
                volumes.push(VolumePlan {
                    name: file.datastore.name.clone(),
                    policy: Policy::best_effort("datastore"),
                });
                Ok(volumes.len() - 1)
            }
        }
    }
}

/// The disk of each copy of `[[vm]]` entry `i`, 4 KiB-aligned (`fill_bytes` for
/// `disk_gib = 0`); also checks the VM count so far.
fn vm_disk_bytes(file: &ScenarioFile, i: usize, fill_bytes: u64) -> Result<u64, PathErr> {
    let at = |f: &str| entry_field("vm", i, f);
    let gib = disk_gib(&file.vm[i]);
    if !(gib.is_finite() && (0.0..=1e6).contains(&gib)) {
        return Err(err(
            at("disk_gib"),
            format!("must be in [0, 1e6] (0: the rest of the array), got {gib}"),
        ));
    }
    let total: u64 = file.vm[..=i].iter().map(|v| v.count as u64).sum();
    if total > weir_workload::MAX_VMS as u64 {
        return Err(err(
            at("count"),
            format!(
                "the scenario's VMs (every count together) must be at most {}, got {total}",
                weir_workload::MAX_VMS
            ),
        ));
    }
    let disk_bytes = if gib == 0.0 {
        fill_bytes
    } else {
        (gib * (1u64 << 30) as f64) as u64 / 4096 * 4096
    };
    if disk_bytes == 0 {
        return Err(err(
            at("disk_gib"),
            "the other VMs' disks leave no room on the array".into(),
        ));
    }
    Ok(disk_bytes)
}

/// Checks what the VMs cost to simulate (I/Os in flight, timeline points), and that
/// there is at least one.
fn check_vm_load(vms: &[VmPlan], clock: &Clock) -> Result<(), PathErr> {
    let in_flight: u64 = vms
        .iter()
        .map(|v| match &v.model {
            Some(m) => m.max_outstanding() / v.copies.max(1) as u64,
            None => v.spec.workers as u64 * v.spec.outstanding_ios as u64,
        })
        .sum();
    if in_flight > MAX_IN_FLIGHT {
        return Err(err(
            vec![key("vm")],
            format!(
                "the VMs keep {in_flight} I/Os outstanding; at most {MAX_IN_FLIGHT} are simulated"
            ),
        ));
    }
    let intervals = (clock.duration_ns + clock.warmup_ns) / clock.interval_ns + 1;
    if vms.len() as u64 * intervals > MAX_TIMELINE_POINTS {
        return Err(err(
            vec![key("scenario"), key("timeline_interval_s")],
            format!(
                "{} VMs × {intervals} timeline intervals is too many points (max {MAX_TIMELINE_POINTS}); use a longer interval",
                vms.len()
            ),
        ));
    }
    if vms.is_empty() {
        return Err(err(
            vec![key("vm")],
            "every [[vm]] has count = 0: nothing to run".into(),
        ));
    }
    Ok(())
}

/// The `[[scenario.window]]`s: unique names, 0 <= start_s < end_s.
fn plan_windows(file: &ScenarioFile) -> Result<Vec<WindowPlan>, PathErr> {
    let mut windows = Vec::new();
    for (i, w) in file.scenario.window.iter().enumerate() {
        let at = |f: &str| vec![key("scenario"), key("window"), Seg::Index(i), key(f)];
        if !valid_name(&w.name) || windows.iter().any(|x: &WindowPlan| x.name == w.name) {
            return Err(err(
                at("name"),
                format!(
                    "window names are unique, 1-64 characters of [A-Za-z0-9_-], got {:?}",
                    w.name
                ),
            ));
        }
        if !(w.start_s.is_finite()
            && w.end_s.is_finite()
            && 0.0 <= w.start_s
            && w.start_s < w.end_s)
        {
            return Err(err(
                at("end_s"),
                format!(
                    "needs 0 <= start_s < end_s, got {} .. {}",
                    w.start_s, w.end_s
                ),
            ));
        }
        windows.push(WindowPlan {
            name: w.name.clone(),
            start_ns: (w.start_s * 1e9) as u64,
            end_ns: (w.end_s * 1e9) as u64,
        });
    }
    Ok(windows)
}

/// Checks the sizes and blocks of the array's and the hosts' flash caches.
fn check_caches(file: &ScenarioFile) -> Result<(), PathErr> {
    if let Some(c) = &file.array_cache
        && !(c.size_gib.is_finite()
            && c.size_gib > 0.0
            && c.size_gib <= 1e5
            && (4..=4096).contains(&c.block_kib))
    {
        return Err(err(
            vec![key("array_cache")],
            format!(
                "a cache needs 0 < size_gib <= 1e5 and block_kib in 4..=4096, got {} GiB, {} KiB",
                c.size_gib, c.block_kib
            ),
        ));
    }
    if let Some(c) = &file.array_cache {
        hw::build_flash(&c.flash).map_err(|m| err(vec![key("array_cache"), key("flash")], m))?;
    }
    for (i, h) in file.host.iter().enumerate() {
        if let Some(c) = &h.flash_cache {
            let at = |f: &str| vec![key("host"), Seg::Index(i), key("flash_cache"), key(f)];
            check_host_cache(c, at)?;
            hw::build_flash(&c.flash).map_err(|m| err(at("flash"), m))?;
        }
    }
    Ok(())
}

/// Blocks of a host's flash cache.
pub(crate) fn host_cache_blocks(c: &crate::topology::HostCacheSpec) -> u64 {
    (c.size_gib * (1u64 << 30) as f64) as u64 / (c.block_kib as u64 * 1024)
}

/// Checks a host's `flash_cache` (`at`: the path of one of its fields) against the
/// bounds of `weir serve`'s `flash_cache` (the model both run).
fn check_host_cache(
    c: &crate::topology::HostCacheSpec,
    at: impl Fn(&str) -> Vec<Seg>,
) -> Result<(), PathErr> {
    if !(c.size_gib.is_finite() && c.size_gib > 0.0 && c.size_gib <= 1e5) {
        return Err(err(
            at("size_gib"),
            format!("must be in (0, 1e5] GiB, got {}", c.size_gib),
        ));
    }
    if !(c.block_kib.is_power_of_two() && (4..=1024).contains(&c.block_kib)) {
        return Err(err(
            at("block_kib"),
            format!(
                "must be a power of two from 4 to 1024 KiB (as the server's flash_cache.block), got {}",
                c.block_kib
            ),
        ));
    }
    let blocks = host_cache_blocks(c);
    if blocks == 0 {
        return Err(err(
            at("size_gib"),
            format!(
                "must hold at least one block of {} KiB, got {} GiB",
                c.block_kib, c.size_gib
            ),
        ));
    }
    if blocks > weir_model::MAX_FLASH_CACHE_BLOCKS {
        return Err(err(
            at("block_kib"),
            format!(
                "{blocks} blocks of {} KiB is more than {} (use a larger block)",
                c.block_kib,
                weir_model::MAX_FLASH_CACHE_BLOCKS
            ),
        ));
    }
    if c.scan_cutoff_kib > 1 << 30 {
        return Err(err(
            at("scan_cutoff_kib"),
            format!(
                "must be at most 1 TiB (0: admit every read), got {} KiB",
                c.scan_cutoff_kib
            ),
        ));
    }
    Ok(())
}

// ---- error locations -------------------------------------------------------

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

type DeTable<'a> = toml::de::DeTable<'a>;
type DeValue<'a> = toml::de::DeValue<'a>;

fn element_label(v: &DeValue<'_>, index: usize) -> String {
    if let DeValue::Table(t) = v
        && let Some(n) = t.get("name")
        && let DeValue::String(s) = n.get_ref()
    {
        return s.to_string();
    }
    index.to_string()
}

/// The dotted path of the deepest key whose key or value span holds `offset`.
fn path_at(root: &DeTable<'_>, offset: usize) -> String {
    fn walk_value(v: &toml::Spanned<DeValue<'_>>, offset: usize, out: &mut String) {
        match v.get_ref() {
            DeValue::Table(t) => walk_table(t, offset, out),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if item.span().contains(&offset) || contains_deep(item, offset) {
                        out.push_str(&format!("[{}]", element_label(item.get_ref(), i)));
                        walk_value(item, offset, out);
                        return;
                    }
                }
            }
            _ => {}
        }
    }
    fn contains_deep(v: &toml::Spanned<DeValue<'_>>, offset: usize) -> bool {
        match v.get_ref() {
            DeValue::Table(t) => t.iter().any(|(k, v)| {
                k.span().contains(&offset) || v.span().contains(&offset) || contains_deep(v, offset)
            }),
            DeValue::Array(items) => items
                .iter()
                .any(|i| i.span().contains(&offset) || contains_deep(i, offset)),
            _ => false,
        }
    }
    fn walk_table(t: &DeTable<'_>, offset: usize, out: &mut String) {
        for (k, v) in t.iter() {
            if k.span().contains(&offset) || v.span().contains(&offset) || contains_deep(v, offset)
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k.get_ref());
                walk_value(v, offset, out);
                return;
            }
        }
    }
    let mut out = String::new();
    walk_table(root, offset, &mut out);
    out
}

/// The span of `path` (deepest existing prefix), and the path rendered with element names.
fn span_of(root: &DeTable<'_>, path: &[Seg]) -> (Option<Range<usize>>, String) {
    let mut rendered = String::new();
    let mut span = None;
    let mut cur: Option<&DeValue<'_>> = None;
    let mut table = Some(root);
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !rendered.is_empty() {
                    rendered.push('.');
                }
                rendered.push_str(k);
                let found = table.and_then(|t| t.get_key_value(k.as_str()));
                match found {
                    Some((ks, v)) => {
                        span = Some(ks.span());
                        cur = Some(v.get_ref());
                        table = match v.get_ref() {
                            DeValue::Table(t) => Some(t),
                            _ => None,
                        };
                    }
                    None => {
                        cur = None;
                        table = None;
                    }
                }
            }
            Seg::Index(i) => {
                let item = match cur {
                    Some(DeValue::Array(items)) => items.get(*i),
                    _ => None,
                };
                match item {
                    Some(item) => {
                        rendered.push_str(&format!("[{}]", element_label(item.get_ref(), *i)));
                        // Arrays of tables: point at the element's first key.
                        span = match item.get_ref() {
                            DeValue::Table(t) => t
                                .iter()
                                .map(|(k, _)| k.span())
                                .min_by_key(|s| s.start)
                                .or(Some(item.span())),
                            _ => Some(item.span()),
                        };
                        cur = Some(item.get_ref());
                        table = match item.get_ref() {
                            DeValue::Table(t) => Some(t),
                            _ => None,
                        };
                    }
                    None => {
                        rendered.push_str(&format!("[{i}]"));
                        cur = None;
                        table = None;
                    }
                }
            }
        }
    }
    (span, rendered)
}

pub(crate) fn render_path(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn locate_error(file: &str, text: &str, path: &[Seg], message: String) -> ScenarioError {
    let (span, rendered) = match toml::de::DeTable::parse(text) {
        Ok(root) => span_of(root.get_ref(), path),
        Err(_) => (None, render_path(path)),
    };
    let line_column = span.map(|s| line_col(text, s.start)).unwrap_or((1, 1));
    invalid_at(file, line_column, rendered, message)
}

/// An `Invalid` error; an empty `field` stands for the whole document.
fn invalid_at(
    file: &str,
    (line, column): (usize, usize),
    field: String,
    message: String,
) -> ScenarioError {
    ScenarioError::Invalid {
        file: file.to_string(),
        line,
        column,
        field: if field.is_empty() {
            "(document)".to_string()
        } else {
            field
        },
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> DeValue<'static> {
        DeValue::Table(
            DeTable::parse(
                "[datastore]\nname = \"ds\"\n[[vm]]\nname = \"a\"\nshares = 1000\n[[vm]]\nname = \"b\"\nshares = 1000\n",
            )
            .unwrap()
            .into_inner(),
        )
    }

    fn num(text: &'static str) -> toml::Spanned<DeValue<'static>> {
        DeValue::parse(text).unwrap()
    }

    fn int_at(v: &DeValue<'_>, path: &[&str]) -> Option<String> {
        let mut cur = v;
        for p in path {
            cur = match p.parse::<usize>() {
                Ok(i) => cur.get(i)?.get_ref(),
                Err(_) => cur.get(*p)?.get_ref(),
            };
        }
        Some(cur.as_integer()?.as_str().to_string())
    }

    #[test]
    fn set_path_addresses_named_elements_and_creates_tables() {
        let mut v = doc();
        set_path(&mut v, "vm.b.shares", num("2000")).unwrap();
        assert_eq!(int_at(&v, &["vm", "1", "shares"]).as_deref(), Some("2000"));
        assert_eq!(int_at(&v, &["vm", "0", "shares"]).as_deref(), Some("1000"));
        set_path(&mut v, "datastore.congestion.enabled", num("true")).unwrap();
        assert_eq!(
            v.get("datastore")
                .unwrap()
                .get_ref()
                .get("congestion")
                .unwrap()
                .get_ref()
                .get("enabled")
                .unwrap()
                .get_ref()
                .as_bool(),
            Some(true)
        );
        let e = set_path(&mut v, "vm.c.shares", num("1")).unwrap_err();
        assert!(
            e.contains("no entry named \"c\"") && e.contains("a, b"),
            "{e}"
        );
        assert!(set_path(&mut v, "datastore.name.x", num("1")).is_err());
        assert!(set_path(&mut v, "vm..shares", num("1")).is_err());
    }

    #[test]
    fn sweep_numbers_read_back_exactly() {
        for x in [64.0, -3.0, 0.5, 1e-7, 1e16, 9.5e15, 123.456, f64::INFINITY] {
            let text = toml_number(x);
            let v = DeValue::parse(&text).unwrap().into_inner();
            let back = match &v {
                DeValue::Integer(i) => i.as_str().parse::<f64>().unwrap(),
                DeValue::Float(f) => f.as_str().parse::<f64>().unwrap(),
                other => panic!("{x}: {other:?}"),
            };
            assert_eq!(back, x, "{text}");
            assert_eq!(
                matches!(v, DeValue::Integer(_)),
                x.fract() == 0.0 && x.abs() < 9e15,
                "{text}"
            );
        }
    }

    #[test]
    fn locations_and_paths() {
        let text = "[scenario]\nname = \"x\"\n\n[[vm]]\nname = \"a\"\nhost = \"h\"\n";
        assert_eq!(line_col(text, text.find("host").unwrap()), (6, 1));
        let root = toml::de::DeTable::parse(text).unwrap();
        assert_eq!(
            path_at(root.get_ref(), text.find("\"h\"").unwrap()),
            "vm[a].host"
        );
        let (span, rendered) = span_of(root.get_ref(), &[key("vm"), Seg::Index(0), key("host")]);
        assert_eq!(rendered, "vm[a].host");
        assert_eq!(line_col(text, span.unwrap().start).0, 6);
        // A missing key keeps the deepest existing location.
        let (span, rendered) = span_of(root.get_ref(), &[key("vm"), Seg::Index(0), key("volume")]);
        assert_eq!(rendered, "vm[a].volume");
        assert_eq!(line_col(text, span.unwrap().start).0, 5);
    }

    #[test]
    fn numbers_print_without_trailing_zeros() {
        assert_eq!(fmt_num(64.0), "64");
        assert_eq!(fmt_num(0.5), "0.5");
    }
}
