//! Glue to weir-model's specs. Placeholder until weir-model's `ArraySpec`/`LinkSpec`
//! land: a full-duplex FIFO link with the usual presets, and no disk arrays.

use crate::hw::BoxedComponent;
use std::collections::VecDeque;
use weir_model::{Completion, Component, DeviceIo, IoDir, Nanos};

pub(crate) fn link(spec: &toml::Value) -> Result<BoxedComponent, String> {
    let mbps = match spec.as_str() {
        Some("fc-4g") => 400.0,
        Some("fc-8g") => 800.0,
        Some("10gbe") => 1180.0,
        Some("1gbe") => 118.0,
        Some(other) => return Err(format!("unknown link preset {other:?} (fc-4g, fc-8g, 10gbe, 1gbe, none)")),
        None => return Err("link must be a preset name".into()),
    };
    Ok(Box::new(SimpleLink { ns_per_byte: 1e3 / mbps, dirs: [Lane::default(), Lane::default()], busy_ns: 0 }))
}

pub(crate) fn array(_spec: &toml::Table, _seed: u64, _needed_bytes: u64) -> Result<BoxedComponent, String> {
    Err("disk arrays need weir-model's ArraySpec (not merged yet); use `ideal = { … }`".into())
}

#[derive(Default)]
struct Lane {
    free_at: Nanos,
    pending: VecDeque<(Nanos, u64)>,
}

struct SimpleLink {
    ns_per_byte: f64,
    dirs: [Lane; 2],
    busy_ns: u128,
}

impl Component for SimpleLink {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        let lane = &mut self.dirs[(io.dir == IoDir::Write) as usize];
        let t = (io.size_bytes as f64 * self.ns_per_byte).round() as Nanos;
        let start = lane.free_at.max(now);
        lane.free_at = start + t;
        self.busy_ns += t as u128;
        lane.pending.push_back((start + t, token));
    }
    fn next_event_ns(&self) -> Option<Nanos> {
        self.dirs.iter().filter_map(|l| l.pending.front().map(|p| p.0)).min()
    }
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        loop {
            let next = self.dirs.iter().enumerate().filter_map(|(i, l)| l.pending.front().map(|p| (p.0, i))).min();
            match next {
                Some((t, i)) if t <= now => {
                    let (at_ns, token) = self.dirs[i].pending.pop_front().unwrap_or((t, 0));
                    done.push(Completion { token, at_ns });
                }
                _ => break,
            }
        }
    }
    fn busy_ns(&self) -> Nanos {
        (self.busy_ns / 2) as Nanos
    }
}
