//! RAID mapping: placement invariants (proptest) and parity write costs.

use std::collections::HashSet;

use proptest::prelude::*;
use weir_model::{DeviceIo, IoDir, RaidLayout, RaidPlan, RaidSpec};

const DRIVE_CAP: u64 = 1 << 30;
const KIB: u32 = 1024;

fn try_layout(
    level: u32,
    drives: u32,
    element: u32,
    spans: u32,
) -> Result<RaidLayout, weir_model::ModelError> {
    let spec = RaidSpec {
        level,
        drives,
        stripe_element_bytes: element,
        spans,
    };
    RaidLayout::new(&spec, DRIVE_CAP)
}

fn layout(level: u32, drives: u32, element: u32, spans: u32) -> RaidLayout {
    try_layout(level, drives, element, spans).unwrap()
}

fn plan(l: &RaidLayout, offset: u64, size: u32, dir: IoDir) -> RaidPlan {
    let mut p = RaidPlan::default();
    l.plan(
        &DeviceIo {
            offset_bytes: offset,
            size_bytes: size,
            dir,
        },
        &mut p,
    );
    p
}

#[test]
fn small_write_costs() {
    // (level, spans, offset, drive reads, drive writes): one 8 KiB write on 24
    // drives with 64 KiB elements.
    for (level, spans, offset, reads, writes) in [
        (5, 1, 3 * 64 * 1024 + 8192, 2, 2), // read-modify-write: 4 I/Os
        (6, 1, 8192, 3, 3),                 // two parities: 6 I/Os
        (10, 1, 8192, 0, 2),                // both mirrors
        (0, 1, 8192, 0, 1),
        (50, 3, 8192, 2, 2), // RAID 5 inside one span
        (60, 2, 8192, 3, 3), // RAID 6 inside one span
    ] {
        let p = plan(
            &layout(level, 24, 64 * KIB, spans),
            offset,
            8 * KIB,
            IoDir::Write,
        );
        assert_eq!(
            (p.reads.len(), p.writes.len()),
            (reads, writes),
            "RAID {level} small write"
        );
        assert_eq!(p.drive_ios(), reads + writes, "RAID {level}");
        if level == 10 {
            assert_ne!(p.writes[0].drive, p.writes[1].drive, "two mirrors");
        }
    }
}

#[test]
fn full_stripe_writes_issue_no_reads() {
    for (level, spans, parity) in [(5, 1, 1), (6, 1, 2), (50, 2, 1), (60, 2, 2)] {
        let l = layout(level, 12, 64 * KIB, spans);
        let row = l.row_bytes();
        let p = plan(&l, 5 * row, row as u32, IoDir::Write);
        assert!(p.reads.is_empty(), "RAID {level}");
        assert_eq!(p.writes.len() as u32, 12 / spans, "RAID {level}");
        let written: u64 = p.writes.iter().map(|w| w.size_bytes as u64).sum();
        assert_eq!(written, row + parity * 64 * 1024);
    }
}

#[test]
fn three_drive_raid5_prefers_reconstruct_write() {
    // Reading the one other data strip (1) + writing data and parity (2) = 3 < 4.
    let l = layout(5, 3, 64 * KIB, 1);
    let p = plan(&l, 0, 64 * KIB, IoDir::Write);
    assert_eq!((p.reads.len(), p.writes.len()), (1, 2));
}

#[test]
fn raid5_parity_rotates_left_symmetric() {
    let l = layout(5, 4, 64 * KIB, 1);
    let parity: Vec<u32> = (0..4).map(|r| l.parity_drives(r)[0].unwrap()).collect();
    assert_eq!(parity, vec![3, 2, 1, 0]);
    // Left-symmetric: the first data strip of a row follows its parity drive.
    let row = l.row_bytes();
    assert_eq!(l.locate(row).drive, 3); // row 1: parity 2, data starts on 3
    assert_eq!(l.locate(2 * row).drive, 2); // row 2: parity 1
}

#[test]
fn mirrors_split_reads_and_raid0_reads_split_per_element() {
    let r10 = layout(10, 4, 64 * KIB, 1);
    let row = r10.row_bytes();
    let a = plan(&r10, 0, 4 * KIB, IoDir::Read);
    let b = plan(
        &r10,
        weir_model::MIRROR_RUN_ROWS * row,
        4 * KIB,
        IoDir::Read,
    );
    assert_eq!(a.reads.len(), 1);
    assert_ne!(a.reads[0].drive, b.reads[0].drive, "mirrors alternate");
    let r0 = layout(0, 8, 64 * KIB, 1);
    let p = plan(&r0, 32 * 1024, 256 * KIB, IoDir::Read);
    assert_eq!(p.reads.len(), 5);
    assert_eq!(p.reads.iter().map(|r| r.size_bytes).sum::<u32>(), 256 * KIB);
}

#[test]
fn invalid_layouts_are_rejected_with_reasons() {
    let bad = |level, drives, element, spans| {
        try_layout(level, drives, element, spans)
            .unwrap_err()
            .to_string()
    };
    assert!(bad(5, 2, 65536, 1).contains("at least 3"));
    assert!(bad(6, 3, 65536, 1).contains("at least 4"));
    assert!(bad(10, 5, 65536, 1).contains("even"));
    assert!(bad(1, 3, 65536, 1).contains("exactly 2"));
    assert!(bad(50, 12, 65536, 5).contains("spans"));
    assert!(bad(60, 6, 65536, 2).contains("at least 4"));
    assert!(bad(5, 8, 1000, 1).contains("multiple of 512"));
    assert!(bad(7, 8, 65536, 1).contains("supported levels"));
    assert!(bad(0, 0, 65536, 1).contains("at least 1"));
}

fn any_layout() -> impl Strategy<Value = RaidLayout> {
    (
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(5),
            Just(6),
            Just(10),
            Just(50),
            Just(60)
        ],
        1u32..=8,
        prop_oneof![Just(4 * KIB), Just(64 * KIB), Just(512 * KIB)],
    )
        .prop_filter_map("valid layout", |(level, k, element)| {
            let (drives, spans) = match level {
                0 => (k, 1),
                1 => (2, 1),
                5 => (k + 2, 1),
                6 => (k + 3, 1),
                10 => (2 * k + 2, 1),
                50 => (3 * (k % 3 + 2), k % 3 + 2),
                _ => (4 * (k % 3 + 2), k % 3 + 2),
            };
            try_layout(level, drives, element, spans).ok()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every logical strip maps to exactly one data location, never on a parity drive
    /// of its own row.
    #[test]
    fn every_logical_byte_has_one_home(l in any_layout(), first_row in 0u64..1000) {
        let e = l.spec().stripe_element_bytes as u64;
        let rows = 2 * l.drives() as u64 + 2;
        let start = first_row * l.row_bytes();
        let mut seen = HashSet::new();
        for k in 0..(rows * l.row_bytes() / e) {
            for intra in [0, e / 2, e - 1] {
                let off = start + k * e + intra;
                let loc = l.locate(off);
                prop_assert!(loc.drive < l.drives());
                prop_assert_eq!(loc.offset_bytes % e, intra);
                prop_assert!(seen.insert(loc), "two logical bytes share {:?}", loc);
                for p in l.parity_drives(l.row_of(off)).into_iter().flatten() {
                    prop_assert_ne!(p, loc.drive);
                }
            }
        }
    }

    /// A read plan covers exactly the requested bytes, each piece where `locate` says
    /// (or on its mirror).
    #[test]
    fn read_plans_cover_the_request(l in any_layout(), offset in 0u64..(1 << 28), size in 1u32..(4 << 20)) {
        let p = plan(&l, offset, size, IoDir::Read);
        prop_assert!(p.writes.is_empty());
        let total: u64 = p.reads.iter().map(|r| r.size_bytes as u64).sum();
        prop_assert_eq!(total, size as u64);
        let loc = l.locate(offset);
        let found = p.reads.iter().any(|r| {
            (r.drive == loc.drive || r.drive == loc.drive + 1) && r.offset_bytes == loc.offset_bytes
        });
        prop_assert!(found, "first byte not read from its home");
    }

    /// Writes put every data byte on its home drive (and mirror), parity RAID adds
    /// parity writes covering what it reads, and never reads more I/Os than it writes
    /// plus the data strips of a row.
    #[test]
    fn write_plans_are_consistent(l in any_layout(), offset in 0u64..(1 << 28), size in 1u32..(2 << 20)) {
        let p = plan(&l, offset, size, IoDir::Write);
        let written: u64 = p.writes.iter().map(|w| w.size_bytes as u64).sum();
        let level = l.spec().level;
        match level {
            0 => { prop_assert_eq!(written, size as u64); prop_assert!(p.reads.is_empty()); }
            1 | 10 => { prop_assert_eq!(written, 2 * size as u64); prop_assert!(p.reads.is_empty()); }
            _ => prop_assert!(written > size as u64),
        }
        let loc = l.locate(offset);
        let home = p.writes.iter().any(|w| w.drive == loc.drive && w.offset_bytes <= loc.offset_bytes);
        prop_assert!(home, "first byte not written to its home");
        for r in &p.reads {
            prop_assert!(r.dir == IoDir::Read && r.drive < l.drives());
        }
    }
}
