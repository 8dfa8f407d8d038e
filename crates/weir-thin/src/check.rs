//! `weir volume check`'s core: verifies a pool's thin layers against the
//! catalog's view of them. Opening a layer already verifies its own map (header,
//! no slot mapped twice, no slot beyond its data file); this adds the graph
//! (parents exist, no cycles, a parent never larger than what it serves is fine)
//! and the files (no layer without files it needs, orphan files reported).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::layer::Layer;
use crate::map::Entry;

/// A layer as the catalog knows it.
#[derive(Clone, Debug)]
pub struct LayerInfo {
    pub id: u64,
    pub parent: Option<u64>,
    pub grains: u64,
}

#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub layers: usize,
    /// Grains stored (slots mapped) over all layers.
    pub stored_grains: u64,
    /// Grains marked as zeroes over all layers.
    pub zero_grains: u64,
    /// Files of the directory no catalog layer owns (left by a crash between a
    /// metadata update and a file removal; removed at the next start).
    pub orphan_files: Vec<String>,
    /// Problems of the catalog as a whole.
    pub problems: Vec<String>,
    /// Problems of one layer (its id, what is wrong).
    pub layer_problems: Vec<(u64, String)>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.layer_problems.is_empty()
    }
}

pub fn check(dir: &Path, layers: &[LayerInfo], grain_bytes: u64) -> CheckReport {
    let mut report = CheckReport {
        layers: layers.len(),
        ..CheckReport::default()
    };
    let by_id: HashMap<u64, &LayerInfo> = layers.iter().map(|l| (l.id, l)).collect();
    if by_id.len() != layers.len() {
        report
            .problems
            .push("a layer id appears twice in the catalog".into());
    }
    for l in layers {
        if let Some(p) = check_chain(l, &by_id) {
            report.layer_problems.push((l.id, p));
        }
        match Layer::open(dir, l.id, l.grains, grain_bytes) {
            Ok(layer) => {
                if layer.dirty_entries() > 0 {
                    report.layer_problems.push((
                        l.id,
                        format!("its map has entries beyond its {} grains", l.grains),
                    ));
                }
                for (_, e) in layer.map().iter() {
                    match e {
                        Entry::Slot(_) => report.stored_grains += 1,
                        Entry::Zero => report.zero_grains += 1,
                        Entry::Unmapped => {}
                    }
                }
            }
            Err(e) => report.layer_problems.push((l.id, e.to_string())),
        }
    }
    report.orphan_files = orphans(dir, &by_id.keys().copied().collect());
    report
}

/// What is wrong with `l`'s chain of parents, if anything.
fn check_chain(l: &LayerInfo, by_id: &HashMap<u64, &LayerInfo>) -> Option<String> {
    let mut seen = HashSet::from([l.id]);
    let mut at = l.parent;
    while let Some(p) = at {
        if !seen.insert(p) {
            return Some(format!("its parent chain loops at {p}"));
        }
        match by_id.get(&p) {
            Some(pl) => at = pl.parent,
            None => return Some(format!("parent {p} is not in the catalog")),
        }
    }
    None
}

/// Layer files (`<id>.map`, `<id>.data`) of ids not in `known`.
pub fn orphans(dir: &Path, known: &HashSet<u64>) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            let Some((id, ext)) = name.split_once('.') else {
                return false;
            };
            matches!(ext, "map" | "data") && id.parse::<u64>().is_ok_and(|id| !known.contains(&id))
        })
        .collect();
    out.sort();
    out
}
