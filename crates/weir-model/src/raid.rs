//! RAID layouts and the mapping of a logical request to per-drive requests.
//!
//! A layout is `spans` identical sub-arrays ("spans"; 1 except for RAID 50/60) of
//! `drives / spans` drives each. Logical space is cut into rows of
//! `data_elements × stripe_element_bytes`; consecutive rows go to consecutive spans.
//! Inside a span:
//! * RAID 0: element `j` of a row is on drive `j`;
//! * RAID 1/10: element `j` is on the mirror pair `(2j, 2j+1)`; reads alternate
//!   mirrors every `MIRROR_RUN_ROWS` rows (pure; balanced for random reads, while a
//!   sequential stream stays contiguous on one mirror for a while);
//! * RAID 5: left-symmetric rotating parity: row `r` has parity on drive
//!   `m−1−(r mod m)` and data element `j` on `(P+1+j) mod m`;
//! * RAID 6: P as RAID 5, Q on `(P+1) mod m`, data `j` on `(P+2+j) mod m`.
//!
//! Writes to parity RAID are planned per row: a full-row write computes parity from
//! the new data (no reads); a partial write uses read-modify-write (read old data and
//! old parity, write new data and parity) unless reconstruct-write (read the rest of
//! the row, write new data and parity) issues fewer drive I/Os.
//! A plan has two phases: all `reads`, then all `writes`.

use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::{DeviceIo, IoDir};

/// Controller-UI level description of a virtual disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaidSpec {
    /// 0, 1, 5, 6, 10, 50 or 60.
    pub level: u32,
    /// Total member drives.
    pub drives: u32,
    /// Per-drive strip ("stripe size" in PERC/MegaRAID UIs), bytes.
    pub stripe_element_bytes: u32,
    /// Spans for RAID 50/60 (ignored as 1 for other levels).
    #[serde(default = "one")]
    pub spans: u32,
}

fn one() -> u32 {
    1
}

impl RaidSpec {
    pub fn new(level: u32, drives: u32, stripe_element_bytes: u32) -> Self {
        Self {
            level,
            drives,
            stripe_element_bytes,
            spans: 1,
        }
    }
}

/// Rows read from one mirror before reads switch to the other.
pub const MIRROR_RUN_ROWS: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanKind {
    Stripe,
    Mirror,
    Parity(u32),
}

/// One request to one member drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriveIo {
    pub drive: u32,
    pub offset_bytes: u64,
    pub size_bytes: u32,
    pub dir: IoDir,
}

/// Where one logical byte's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataLocation {
    pub drive: u32,
    pub offset_bytes: u64,
}

/// The drive I/Os of one logical request: phase 1 `reads`, then phase 2 `writes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaidPlan {
    pub reads: Vec<DriveIo>,
    pub writes: Vec<DriveIo>,
}

impl RaidPlan {
    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
    }
    pub fn drive_ios(&self) -> usize {
        self.reads.len() + self.writes.len()
    }
}

/// Append, merging with an earlier request to the same drive that ends where this
/// one starts (a row boundary on the same drive is contiguous on the platter).
fn push_merged(v: &mut Vec<DriveIo>, io: DriveIo) {
    for prev in v.iter_mut().rev() {
        if prev.drive == io.drive
            && prev.dir == io.dir
            && prev.offset_bytes + prev.size_bytes as u64 == io.offset_bytes
            && (prev.size_bytes as u64 + io.size_bytes as u64) <= u32::MAX as u64
        {
            prev.size_bytes += io.size_bytes;
            return;
        }
    }
    v.push(io);
}

/// A validated layout.
#[derive(Clone, Debug)]
pub struct RaidLayout {
    spec: RaidSpec,
    kind: SpanKind,
    spans: u32,
    per_span: u32,
    data_elements: u32,
    element: u64,
    rows_per_span: u64,
}

impl RaidLayout {
    pub fn new(spec: &RaidSpec, drive_capacity_bytes: u64) -> Result<Self, ModelError> {
        let bad = |reason: String| ModelError::InvalidRaid {
            level: spec.level,
            reason,
        };
        let e = spec.stripe_element_bytes;
        if e < 512 || !e.is_multiple_of(512) || e > (64 << 20) {
            return Err(bad(format!(
                "stripe_element_bytes = {e}: must be a multiple of 512 between 512 and 64 MiB"
            )));
        }
        if spec.drives > 4096 {
            return Err(bad(format!("{} drives: at most 4096", spec.drives)));
        }
        let n = spec.drives;
        let (kind, spans) = match spec.level {
            0 => {
                if n < 1 {
                    return Err(bad("needs at least 1 drive".into()));
                }
                (SpanKind::Stripe, 1)
            }
            1 => {
                if n != 2 {
                    return Err(bad(format!(
                        "needs exactly 2 drives (got {n}); use RAID 10 for more"
                    )));
                }
                (SpanKind::Mirror, 1)
            }
            10 => {
                if n < 4 || !n.is_multiple_of(2) {
                    return Err(bad(format!(
                        "needs an even number >= 4 of drives (got {n})"
                    )));
                }
                (SpanKind::Mirror, 1)
            }
            5 | 6 => {
                let p = if spec.level == 5 { 1 } else { 2 };
                if n < p + 2 {
                    return Err(bad(format!("needs at least {} drives (got {n})", p + 2)));
                }
                (SpanKind::Parity(p), 1)
            }
            50 | 60 => {
                let p = if spec.level == 50 { 1 } else { 2 };
                let s = spec.spans;
                if s < 2 {
                    return Err(bad(format!("needs spans >= 2 (got {s})")));
                }
                if !n.is_multiple_of(s) {
                    return Err(bad(format!(
                        "{n} drives do not divide into {s} equal spans"
                    )));
                }
                if n / s < p + 2 {
                    return Err(bad(format!(
                        "each span needs at least {} drives (got {})",
                        p + 2,
                        n / s
                    )));
                }
                (SpanKind::Parity(p), s)
            }
            other => {
                return Err(ModelError::InvalidRaid {
                    level: other,
                    reason: "supported levels are 0, 1, 5, 6, 10, 50, 60".into(),
                });
            }
        };
        let per_span = n / spans;
        let data_elements = match kind {
            SpanKind::Stripe => per_span,
            SpanKind::Mirror => per_span / 2,
            SpanKind::Parity(p) => per_span - p,
        };
        let rows_per_span = drive_capacity_bytes / e as u64;
        if rows_per_span == 0 {
            return Err(bad(format!(
                "drive capacity {drive_capacity_bytes} bytes is smaller than one stripe element"
            )));
        }
        Ok(Self {
            spec: spec.clone(),
            kind,
            spans,
            per_span,
            data_elements,
            element: e as u64,
            rows_per_span,
        })
    }

    pub fn spec(&self) -> &RaidSpec {
        &self.spec
    }

    pub fn drives(&self) -> u32 {
        self.spec.drives
    }

    /// Data bytes in one row (one full stripe of one span).
    pub fn row_bytes(&self) -> u64 {
        self.data_elements as u64 * self.element
    }

    /// Usable logical capacity.
    pub fn capacity_bytes(&self) -> u64 {
        self.rows_per_span * self.spans as u64 * self.row_bytes()
    }

    /// Parity drives per span (0 for RAID 0/1/10).
    pub fn parity_per_row(&self) -> u32 {
        match self.kind {
            SpanKind::Parity(p) => p,
            _ => 0,
        }
    }

    /// (span, row within span) of a global row.
    fn span_row(&self, global_row: u64) -> (u32, u64) {
        (
            (global_row % self.spans as u64) as u32,
            global_row / self.spans as u64,
        )
    }

    /// Local drive (within span) of data element `j` in span row `r`; mirrors give the
    /// primary.
    fn data_drive_local(&self, r: u64, j: u32) -> u32 {
        let m = self.per_span;
        match self.kind {
            SpanKind::Stripe => j,
            SpanKind::Mirror => 2 * j,
            SpanKind::Parity(p) => {
                let parity = m - 1 - (r % m as u64) as u32;
                (parity + p + j) % m
            }
        }
    }

    /// Parity drives (global index) of a global row: P then Q.
    pub fn parity_drives(&self, global_row: u64) -> [Option<u32>; 2] {
        let (span, r) = self.span_row(global_row);
        let base = span * self.per_span;
        let m = self.per_span;
        match self.kind {
            SpanKind::Parity(p) => {
                let pd = m - 1 - (r % m as u64) as u32;
                let q = if p == 2 {
                    Some(base + (pd + 1) % m)
                } else {
                    None
                };
                [Some(base + pd), q]
            }
            _ => [None, None],
        }
    }

    /// The primary data location of a logical byte (offsets wrap at capacity).
    pub fn locate(&self, logical_offset: u64) -> DataLocation {
        let l = logical_offset % self.capacity_bytes();
        let g = l / self.row_bytes();
        let w = l % self.row_bytes();
        let j = (w / self.element) as u32;
        let intra = w % self.element;
        let (span, r) = self.span_row(g);
        DataLocation {
            drive: span * self.per_span + self.data_drive_local(r, j),
            offset_bytes: r * self.element + intra,
        }
    }

    /// Global row of a logical byte.
    pub fn row_of(&self, logical_offset: u64) -> u64 {
        (logical_offset % self.capacity_bytes()) / self.row_bytes()
    }

    /// Fill `plan` (cleared first) with the drive I/Os of `io`.
    pub fn plan(&self, io: &DeviceIo, plan: &mut RaidPlan) {
        plan.clear();
        self.plan_append(io.offset_bytes, io.size_bytes, io.dir, plan);
    }

    /// Append the drive I/Os of one logical extent to `plan`.
    pub fn plan_append(&self, offset_bytes: u64, size_bytes: u32, dir: IoDir, plan: &mut RaidPlan) {
        let cap = self.capacity_bytes();
        let row_bytes = self.row_bytes();
        let mut l = offset_bytes % cap;
        let mut remaining = size_bytes as u64;
        while remaining > 0 {
            let g = l / row_bytes;
            let w0 = l % row_bytes;
            let len = remaining.min(row_bytes - w0).min(cap - l);
            match dir {
                IoDir::Read => self.plan_row_read(g, w0, w0 + len, plan),
                IoDir::Write => self.plan_row_write(g, w0, w0 + len, plan),
            }
            remaining -= len;
            l = (l + len) % cap;
        }
    }

    /// Calls `f(j, a, b)` for each data element `j` touched by `[w0, w1)` of a row,
    /// with the touched range `[a, b)` inside the element.
    fn for_each_piece(&self, w0: u64, w1: u64, mut f: impl FnMut(u32, u64, u64)) {
        let e = self.element;
        let mut w = w0;
        while w < w1 {
            let j = (w / e) as u32;
            let a = w % e;
            let b = (w1 - j as u64 * e).min(e);
            f(j, a, b);
            w = j as u64 * e + b;
        }
    }

    fn plan_row_read(&self, g: u64, w0: u64, w1: u64, plan: &mut RaidPlan) {
        let (span, r) = self.span_row(g);
        let base = span * self.per_span;
        let e = self.element;
        self.for_each_piece(w0, w1, |j, a, b| {
            let mut d = self.data_drive_local(r, j);
            if self.kind == SpanKind::Mirror && (r / MIRROR_RUN_ROWS) % 2 == 1 {
                d += 1;
            }
            push_merged(
                &mut plan.reads,
                DriveIo {
                    drive: base + d,
                    offset_bytes: r * e + a,
                    size_bytes: (b - a) as u32,
                    dir: IoDir::Read,
                },
            );
        });
    }

    fn plan_row_write(&self, g: u64, w0: u64, w1: u64, plan: &mut RaidPlan) {
        let (span, r) = self.span_row(g);
        let base = span * self.per_span;
        let e = self.element;
        let io = |drive: u32, a: u64, b: u64, dir: IoDir| DriveIo {
            drive: base + drive,
            offset_bytes: r * e + a,
            size_bytes: (b - a) as u32,
            dir,
        };
        match self.kind {
            SpanKind::Stripe => self.for_each_piece(w0, w1, |j, a, b| {
                push_merged(&mut plan.writes, io(j, a, b, IoDir::Write));
            }),
            SpanKind::Mirror => self.for_each_piece(w0, w1, |j, a, b| {
                push_merged(&mut plan.writes, io(2 * j, a, b, IoDir::Write));
                push_merged(&mut plan.writes, io(2 * j + 1, a, b, IoDir::Write));
            }),
            SpanKind::Parity(p) => {
                let m = self.per_span;
                let pd = m - 1 - (r % m as u64) as u32;
                let parity = [pd, (pd + 1) % m];
                let parity = &parity[..p as usize];
                if w0 == 0 && w1 == self.row_bytes() {
                    // Full-stripe write: parity from the new data, no reads.
                    for j in 0..self.data_elements {
                        push_merged(
                            &mut plan.writes,
                            io(self.data_drive_local(r, j), 0, e, IoDir::Write),
                        );
                    }
                    for &q in parity {
                        push_merged(&mut plan.writes, io(q, 0, e, IoDir::Write));
                    }
                    return;
                }
                // Parity range: hull of the touched ranges inside their elements.
                let (mut pa, mut pb, mut touched, mut covering) = (e, 0, 0u32, 0u32);
                self.for_each_piece(w0, w1, |_, a, b| {
                    pa = pa.min(a);
                    pb = pb.max(b);
                });
                self.for_each_piece(w0, w1, |_, a, b| {
                    touched += 1;
                    if a <= pa && b >= pb {
                        covering += 1;
                    }
                });
                let rmw_ios = 2 * (touched + p);
                let reconstruct_ios = (self.data_elements - covering) + touched + p;
                if reconstruct_ios < rmw_ios {
                    // Reconstruct-write: read what is not being overwritten in the
                    // parity range, then write new data and parity.
                    let covered_mask_hit = |j: u32| -> bool {
                        let mut hit = false;
                        self.for_each_piece(w0, w1, |jj, a, b| {
                            if jj == j && a <= pa && b >= pb {
                                hit = true;
                            }
                        });
                        hit
                    };
                    for j in 0..self.data_elements {
                        if !covered_mask_hit(j) {
                            push_merged(
                                &mut plan.reads,
                                io(self.data_drive_local(r, j), pa, pb, IoDir::Read),
                            );
                        }
                    }
                } else {
                    self.for_each_piece(w0, w1, |j, a, b| {
                        push_merged(
                            &mut plan.reads,
                            io(self.data_drive_local(r, j), a, b, IoDir::Read),
                        );
                    });
                    for &q in parity {
                        push_merged(&mut plan.reads, io(q, pa, pb, IoDir::Read));
                    }
                }
                self.for_each_piece(w0, w1, |j, a, b| {
                    push_merged(
                        &mut plan.writes,
                        io(self.data_drive_local(r, j), a, b, IoDir::Write),
                    );
                });
                for &q in parity {
                    push_merged(&mut plan.writes, io(q, pa, pb, IoDir::Write));
                }
            }
        }
    }
}
