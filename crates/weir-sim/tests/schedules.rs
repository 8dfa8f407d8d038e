//! Scenarios run what they say: a `[[model]]`'s schedule is the whole model's, not
//! each `[[vm]]` entry's. For every shipped scenario and every case with desktops,
//! the limits the scenario states (power-on and clone-creation slots, the login
//! interval over all the desktops of the model) are read from the file — the
//! `[[model]]` table with the case's overrides, deserialised as the simulator does —
//! and the figures the run measures across all the model's VMs (`*_peak_concurrent`,
//! `logins_started`, `login_window_s`) must match them.
//!
//! To stay fast, each case runs only its desktops (the `[[vm]]`s of other workloads
//! are left out: they do not take part in the schedule) and only until each phase
//! has run for a while (power-on and creation 30 s, logins 60 s).

use toml::{Table, Value};
use weir_report::CaseReport;
use weir_sim::{Scenario, builtin_scenarios};
use weir_workload::{ModelSpec, VdiSpec};

/// What one case of a scenario states about one VDI model.
#[derive(Debug)]
struct Stated {
    model: String,
    spec: VdiSpec,
    /// Copies of the model: every `[[vm]]` running it, `count` times each.
    copies: u32,
}

impl Stated {
    fn desktops(&self) -> u32 {
        self.spec.desktops * self.copies
    }
}

fn array<'a>(doc: &'a Table, key: &str) -> Vec<&'a Table> {
    doc.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_table).collect())
        .unwrap_or_default()
}

fn named(t: &Table) -> &str {
    t.get("name").and_then(Value::as_str).unwrap_or("")
}

fn number(v: &Value) -> f64 {
    v.as_float()
        .or_else(|| v.as_integer().map(|i| i as f64))
        .unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The case's `set` table (empty for the base case).
fn case_set(case: Option<&Table>) -> Table {
    case.and_then(|c| c.get("set"))
        .and_then(Value::as_table)
        .cloned()
        .unwrap_or_default()
}

/// The VDI models of `doc` as the case states them: each `[[model]]` of kind
/// "vdi" with the case's `model.<name>.<field>` overrides, and its copies.
fn stated(doc: &Table, set: &Table) -> Vec<Stated> {
    let mut out = Vec::new();
    for m in array(doc, "model") {
        if m.get("kind").and_then(Value::as_str) != Some("vdi") {
            continue;
        }
        let name = named(m).to_string();
        let mut m = m.clone();
        let prefix = format!("model.{name}.");
        for (k, v) in set {
            if let Some(field) = k.strip_prefix(&prefix) {
                assert!(!field.contains('.'), "nested model override {k}");
                m.insert(field.to_string(), v.clone());
            }
        }
        let Ok(ModelSpec::Vdi(spec)) = Value::Table(m).try_into::<ModelSpec>() else {
            panic!("model {name} does not deserialise as a VDI model");
        };
        let copies = array(doc, "vm")
            .into_iter()
            .filter(|v| v.get("workload").and_then(Value::as_str) == Some(name.as_str()))
            .map(|v| {
                let key = format!("vm.{}.count", named(v));
                set.get(&key)
                    .or_else(|| v.get("count"))
                    .map_or(1, |c| number(c) as u32)
            })
            .sum();
        out.push(Stated {
            model: name,
            spec: *spec,
            copies,
        });
    }
    out
}

/// The case's simulated length (warm-up + duration), s.
fn case_length_s(doc: &Table, set: &Table) -> f64 {
    let s = doc
        .get("scenario")
        .and_then(Value::as_table)
        .expect("[scenario]");
    let field = |f: &str| {
        set.get(&format!("scenario.{f}"))
            .or_else(|| s.get(f))
            .map_or(0.0, number)
    };
    field("warmup_s") + field("duration_s")
}

/// When each phase the case schedules starts, if inside the run, and how long the
/// shortened run must go on after it.
fn phases(st: &Stated, length_s: f64) -> Vec<(&'static str, f64, f64)> {
    let s = &st.spec;
    let mut out = Vec::new();
    if let Some(c) = s.create_at_s.filter(|&c| c < length_s) {
        out.push(("create", c, 30.0));
    } else if let Some(p) = s.power_on_at_s.filter(|&p| p < length_s) {
        out.push(("power-on", p, 30.0));
    }
    if s.login.is_some()
        && !s.working_at_start
        && s.create_at_s.is_none()
        && s.login_at_s < length_s
    {
        out.push(("login", s.login_at_s, 60.0));
    }
    out
}

fn metric(c: &CaseReport, source: &str, name: &str) -> Option<f64> {
    c.model_metrics
        .iter()
        .find(|m| m.source == source && m.name == name && m.window.is_empty())
        .map(|m| m.value)
}

/// `doc` reduced to its desktops and to the one case `index` (its compares dropped,
/// its overrides of other VMs dropped), run until `end_s` with no warm-up.
fn shortened(doc: &Table, index: Option<usize>, end_s: f64) -> String {
    let mut doc = doc.clone();
    let vdi: Vec<String> = array(&doc, "model")
        .into_iter()
        .filter(|m| m.get("kind").and_then(Value::as_str) == Some("vdi"))
        .map(|m| named(m).to_string())
        .collect();
    let mut dropped = Vec::new();
    if let Some(Value::Array(vms)) = doc.get_mut("vm") {
        vms.retain(|v| {
            let t = v.as_table().expect("[[vm]]");
            let keep = t
                .get("workload")
                .and_then(Value::as_str)
                .is_some_and(|w| vdi.iter().any(|n| n == w));
            if !keep {
                dropped.push(named(t).to_string());
            }
            keep
        });
    }
    let mut case = match (index, doc.remove("case")) {
        (Some(i), Some(Value::Array(mut cases))) => cases.swap_remove(i),
        _ => Value::Table(Table::from_iter([(
            "name".to_string(),
            Value::from("base"),
        )])),
    };
    let case_t = case.as_table_mut().expect("[[case]]");
    case_t.remove("compare");
    let mut set = case_set(Some(case_t));
    set.retain(|k, _| !dropped.iter().any(|d| k.starts_with(&format!("vm.{d}."))));
    set.insert("scenario.warmup_s".into(), Value::from(0));
    set.insert("scenario.duration_s".into(), Value::from(end_s));
    case_t.insert("set".into(), Value::Table(set));
    doc.insert("case".into(), Value::Array(vec![case]));
    toml::to_string(&doc).expect("serialise")
}

#[test]
fn every_scenario_runs_the_schedule_it_states_across_the_whole_model() {
    let mut checked = Vec::new();
    for (name, text) in builtin_scenarios() {
        let doc: Table = text.parse().expect("shipped scenario parses");
        let cases = array(&doc, "case");
        let indices: Vec<Option<usize>> = if cases.is_empty() {
            vec![None]
        } else {
            (0..cases.len()).map(Some).collect()
        };
        // Cases that state the same schedule (same models, same copies, same
        // length) measure the same thing: each is run once.
        let mut seen: Vec<String> = Vec::new();
        for index in indices {
            let set = case_set(index.map(|i| cases[i]));
            let case_name = index.map_or("base", |i| named(cases[i]));
            let models = stated(&doc, &set);
            let length = case_length_s(&doc, &set);
            let key = format!("{models:?} {length}");
            if models.is_empty() || seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let end = models
                .iter()
                .flat_map(|m| phases(m, length))
                .map(|(_, at, run)| (at + run).min(length))
                .fold(0.0f64, f64::max);
            if end == 0.0 {
                continue;
            }
            let text = shortened(&doc, index, end);
            let s = Scenario::from_toml_str(&format!("{name}[{case_name}]"), &text)
                .unwrap_or_else(|e| panic!("{e}"));
            let report = s.run(None, &mut |_| {});
            let c = &report.cases[0];
            for m in &models {
                let what = format!("{name} [{case_name}] model {}", m.model);
                let s = &m.spec;
                for (phase, at, _) in phases(m, length) {
                    match phase {
                        "create" | "power-on" => {
                            let (metric_name, slots) = if phase == "create" {
                                ("create_peak_concurrent", s.max_concurrent_create)
                            } else {
                                ("power_on_peak_concurrent", s.max_concurrent_power_on)
                            };
                            let peak = metric(c, &m.model, metric_name)
                                .unwrap_or_else(|| panic!("{what}: no {metric_name}"));
                            let stated = slots.min(m.desktops()) as f64;
                            assert_eq!(
                                peak,
                                stated,
                                "{what}: {phase} runs {peak} at once; the scenario states {slots} for {} desktops",
                                m.desktops()
                            );
                            checked.push(format!("{what}: {phase} {peak} at once"));
                        }
                        _ => {
                            let started = metric(c, &m.model, "logins_started")
                                .unwrap_or_else(|| panic!("{what}: no logins_started"));
                            let window = metric(c, &m.model, "login_window_s")
                                .unwrap_or_else(|| panic!("{what}: no login_window_s"));
                            // One login every `login_interval_s` over all the
                            // model's desktops, from `login_at_s` to the run's end.
                            let due = (((end - at) / s.login_interval_s).ceil() as u32)
                                .min(m.desktops()) as f64;
                            assert!(
                                (started - due).abs() <= 1.0,
                                "{what}: {started} logins started in {:.0} s; the scenario states one every {} s over {} desktops ({due})",
                                end - at,
                                s.login_interval_s,
                                m.desktops()
                            );
                            let expected = (started - 1.0) * s.login_interval_s;
                            assert!(
                                (window - expected).abs() < 0.01,
                                "{what}: {started} logins over {window:.3} s; stated {expected:.3} s"
                            );
                            let full = (m.desktops() - 1) as f64 * s.login_interval_s;
                            checked.push(format!(
                                "{what}: {started} logins over {window:.1} s (all {} over {full:.0} s)",
                                m.desktops()
                            ));
                        }
                    }
                }
            }
        }
    }
    for line in &checked {
        println!("{line}");
    }
    // The shipped desktops: vdi-week's creation, power-on and three logins, the
    // two mixed workloads' storm and Login VSI logins.
    for expected in [
        "vdi-week [sun-creation] model acme: create 8 at once",
        "vdi-week [mon-power-on/8.1-clone-aware] model acme: power-on 128 at once",
        "mixed-workload [qos-on] model desktops: power-on 128 at once",
        "mixed-workload-cache [host-cache] model desktops: power-on 128 at once",
    ] {
        assert!(
            checked.iter().any(|c| c == expected),
            "not checked: {expected}"
        );
    }
    assert!(
        checked.iter().filter(|c| c.contains("logins over")).count() >= 5,
        "{checked:#?}"
    );
}
