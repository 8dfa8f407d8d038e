//! The flash cache's decisions: hits, fills, admission, and — under every
//! interleaving proptest finds of concurrent reads, fills and writes — no read
//! ever returns data older than a write acknowledged before the read began.

use std::collections::HashMap;

use proptest::prelude::*;
use weir_model::{CachePolicy, FillId, FlashCache, FlashCacheSpec, ReadPlan, SlotRef};

const BS: u64 = 4096;

fn cache(capacity_blocks: u32, scan_bytes: u64) -> FlashCache {
    FlashCache::new(FlashCacheSpec {
        capacity_blocks,
        block_bytes: BS as u32,
        policy: CachePolicy::Slru,
        scan_bytes,
    })
}

/// A miss's whole fill, done at once.
fn fill_now(c: &mut FlashCache, fill: FillId) -> usize {
    let slots = c.fill_slots(fill);
    let n = slots.len();
    c.filled(fill, true);
    n
}

fn read(c: &mut FlashCache, v: u32, offset: u64, len: u64) -> ReadPlan {
    c.read(v, offset, len)
}

#[test]
fn a_miss_fills_and_the_next_read_hits() {
    let mut c = cache(16, 0);
    let v = c.add_volume(true);
    let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 0, 2 * BS) else {
        panic!("first read misses with a fill")
    };
    assert_eq!(fill_now(&mut c, f), 2);
    let ReadPlan::Hit { first_block, slots } = read(&mut c, v, BS, BS) else {
        panic!("hit")
    };
    assert_eq!((first_block, slots.len()), (1, 1));
    assert!(c.still_valid(v, &slots));
    let s = c.stats(v);
    assert_eq!((s.read_hits, s.read_misses, s.filled_blocks), (1, 1, 2));
}

#[test]
fn a_disabled_volume_bypasses_and_partial_blocks_do_not_fill() {
    let mut c = cache(16, 0);
    let off = c.add_volume(false);
    assert_eq!(read(&mut c, off, 0, BS), ReadPlan::Bypass);
    let v = c.add_volume(true);
    // 512 bytes inside block 0: nothing whole to fill.
    assert_eq!(read(&mut c, v, 512, 512), ReadPlan::Miss { fill: None });
    // 1.5 blocks from 2,048: only block 1 is whole.
    let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 2048, BS + 2048) else {
        panic!()
    };
    let slots = c.fill_slots(f);
    assert_eq!(slots.len(), 1);
    assert_eq!((slots[0].block, slots[0].offset_in_read), (1, 2048));
    c.filled(f, true);
}

#[test]
fn a_write_drops_blocks_and_cancels_fills_in_flight() {
    let mut c = cache(16, 0);
    let v = c.add_volume(true);
    let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 0, 4 * BS) else {
        panic!()
    };
    fill_now(&mut c, f);
    // A write of one byte in block 2 drops block 2 only.
    let w = c.write_begin(v, 2 * BS + 100, 1);
    assert!(matches!(
        read(&mut c, v, 2 * BS, BS),
        ReadPlan::Miss { fill: None }
    ));
    assert!(matches!(read(&mut c, v, 0, 2 * BS), ReadPlan::Hit { .. }));
    c.write_end(w);
    // A fill whose read began before a write is cancelled by it.
    let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 2 * BS, BS) else {
        panic!()
    };
    let w = c.write_begin(v, 2 * BS, BS);
    assert!(c.fill_slots(f).is_empty());
    c.filled(f, true);
    c.write_end(w);
    assert_eq!(c.stats(v).fills_cancelled, 1);
    // A write that lands between the slots' reservation and `filled`.
    let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 2 * BS, BS) else {
        panic!()
    };
    let slots = c.fill_slots(f);
    assert_eq!(slots.len(), 1);
    let w = c.write_begin(v, 2 * BS, 1);
    assert!(!c.slot_current(slots[0].slot));
    c.filled(f, true);
    c.write_end(w);
    assert!(matches!(read(&mut c, v, 2 * BS, BS), ReadPlan::Miss { .. }));
}

#[test]
fn sequential_scans_are_not_admitted_but_hit() {
    let mut c = cache(64, 64 * 1024);
    let v = c.add_volume(true);
    // Random 4 KiB reads fill.
    let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 100 * BS, BS) else {
        panic!()
    };
    fill_now(&mut c, f);
    // A 64 KiB read is a scan by itself.
    assert_eq!(
        read(&mut c, v, 1000 * BS, 16 * BS),
        ReadPlan::Miss { fill: None }
    );
    // A run of 8 KiB reads turns into a scan once it reaches 64 KiB.
    let mut fills = 0;
    for i in 0..16 {
        if let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, 5000 * BS + i * 2 * BS, 2 * BS) {
            fill_now(&mut c, f);
            fills += 1;
        }
    }
    assert_eq!(fills, 7, "the 8th read makes the run 64 KiB");
    // The resident block still hits inside a scan.
    assert!(matches!(
        read(&mut c, v, 100 * BS, BS),
        ReadPlan::Hit { .. }
    ));
    assert_eq!(c.stats(v).scan_bypasses, 10);
}

/// `warm` (a simulation's starting state) makes whole blocks valid without
/// counting a read or a fill; a write drops them like any other; `since` gives
/// the counters of a measured part.
#[test]
fn warmed_blocks_hit_and_are_invalidated_like_filled_ones() {
    let mut c = cache(16, 0);
    let v = c.add_volume(true);
    let off = c.add_volume(false);
    // Blocks 1-9 (the partial blocks at either end are left out).
    c.warm(v, 512, 10 * BS);
    c.warm(off, 0, 4 * BS);
    assert_eq!(c.resident_blocks(), 9);
    let before = c.stats(v);
    assert_eq!(before, Default::default());
    for b in 1..10 {
        assert!(
            matches!(read(&mut c, v, b * BS, BS), ReadPlan::Hit { .. }),
            "{b}"
        );
    }
    assert!(matches!(read(&mut c, v, 0, BS), ReadPlan::Miss { .. }));
    let w = c.write_begin(v, 3 * BS, BS);
    c.write_end(w);
    assert!(matches!(read(&mut c, v, 3 * BS, BS), ReadPlan::Miss { .. }));
    let s = c.stats(v).since(&before);
    assert_eq!(
        (
            s.read_hits,
            s.read_misses,
            s.invalidated_blocks,
            s.filled_blocks
        ),
        (9, 2, 1, 0)
    );
    // Warming past the capacity evicts, as fills do (8 resident + 10).
    c.warm(v, 100 * BS, 10 * BS);
    assert_eq!(c.resident_blocks(), 16);
    assert_eq!(c.stats(v).evicted_blocks, 2);
}

#[test]
fn a_huge_trim_drops_the_volume_at_once() {
    let mut c = cache(16, 0);
    let v = c.add_volume(true);
    let other = c.add_volume(true);
    for vol in [v, other] {
        let ReadPlan::Miss { fill: Some(f) } = read(&mut c, vol, 0, BS) else {
            panic!()
        };
        fill_now(&mut c, f);
    }
    let w = c.write_begin(v, 1 << 40, 1 << 40);
    c.write_end(w);
    assert!(matches!(read(&mut c, v, 0, BS), ReadPlan::Miss { .. }));
    assert!(matches!(read(&mut c, other, 0, BS), ReadPlan::Hit { .. }));
}

#[test]
fn eviction_reuses_slots_and_a_hit_read_meanwhile_is_refused() {
    // LRU: under SLRU the hit would protect block 0 from the next two fills.
    let mut c = FlashCache::new(FlashCacheSpec {
        capacity_blocks: 2,
        block_bytes: BS as u32,
        policy: CachePolicy::Lru,
        scan_bytes: 0,
    });
    let v = c.add_volume(true);
    for b in 0..2 {
        let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, b * BS, BS) else {
            panic!()
        };
        fill_now(&mut c, f);
    }
    let ReadPlan::Hit { slots, .. } = read(&mut c, v, 0, BS) else {
        panic!()
    };
    // Two more blocks evict both while the hit's data is being read.
    for b in 2..4 {
        let ReadPlan::Miss { fill: Some(f) } = read(&mut c, v, b * BS, BS) else {
            panic!()
        };
        fill_now(&mut c, f);
    }
    assert!(!c.still_valid(v, &slots));
    let s = c.stats(v);
    assert_eq!((s.evicted_blocks, s.hits_lost), (2, 1));
    assert_eq!(c.resident_blocks(), 2);
}

// ---- the stale-data property ----

/// A block's content: which block, which write.
type Data = (u64, u64);

enum Actor {
    Read {
        first: u64,
        n: u64,
        /// Per block: the newest write acknowledged when the read began.
        floor: Vec<u64>,
        step: ReadStep,
    },
    Write {
        first: u64,
        n: u64,
        id: Option<weir_model::WriteId>,
        applied: Option<u64>,
    },
}

enum ReadStep {
    Start,
    PeekRead(Vec<SlotRef>),
    PeekConfirm(Vec<SlotRef>, Vec<Data>),
    /// Ask the cache for a plan.
    Plan,
    HitRead(Vec<SlotRef>),
    HitCheck(Vec<SlotRef>, Vec<Data>),
    Lower(Option<FillId>),
    /// The backing store's data is in; slots not asked for yet.
    Reserve(FillId, Vec<Data>),
    Fill(FillId, Vec<Data>, Vec<weir_model::FillSlot>),
}

struct World {
    cache: FlashCache,
    vol: u32,
    store: HashMap<u64, u64>,
    acked: HashMap<u64, u64>,
    flash: HashMap<u32, Data>,
    version: u64,
    reads_checked: u64,
}

impl World {
    fn check(&mut self, first: u64, floor: &[u64], data: &[Data]) {
        for (i, (&(block, version), &min)) in data.iter().zip(floor).enumerate() {
            assert_eq!(block, first + i as u64, "another block's data");
            assert!(
                version >= min,
                "block {block}: version {version} read, {min} was acknowledged before the read"
            );
        }
        self.reads_checked += 1;
    }

    fn lower(&self, first: u64, n: u64) -> Vec<Data> {
        (first..first + n)
            .map(|b| (b, self.store.get(&b).copied().unwrap_or(0)))
            .collect()
    }

    /// Advances an actor one step; true when it is finished.
    fn step(&mut self, a: &mut Actor) -> bool {
        match a {
            Actor::Write {
                first,
                n,
                id,
                applied,
            } => match (id.is_some(), applied.is_some()) {
                (false, _) => {
                    *id = Some(self.cache.write_begin(self.vol, *first * BS, *n * BS));
                    false
                }
                (true, false) => {
                    self.version += 1;
                    for b in *first..*first + *n {
                        self.store.insert(b, self.version);
                    }
                    *applied = Some(self.version);
                    false
                }
                (true, true) => {
                    self.cache.write_end(id.take().unwrap());
                    for b in *first..*first + *n {
                        let v = self.acked.entry(b).or_default();
                        *v = (*v).max(applied.unwrap());
                    }
                    true
                }
            },
            Actor::Read {
                first,
                n,
                floor,
                step,
            } => {
                let (first, n) = (*first, *n);
                let next = match std::mem::replace(step, ReadStep::Start) {
                    ReadStep::Start => {
                        *floor = (first..first + n)
                            .map(|b| self.acked.get(&b).copied().unwrap_or(0))
                            .collect();
                        // Half the reads try the page-cache path first (peek,
                        // read the slots, confirm), as the server's does.
                        if (first + n) % 2 == 0
                            && let Some((_, slots)) =
                                self.cache.peek_hit(self.vol, first * BS, n * BS)
                        {
                            *step = ReadStep::PeekRead(slots);
                            return false;
                        }
                        ReadStep::Plan
                    }
                    ReadStep::PeekRead(slots) => {
                        let data = slots
                            .iter()
                            .map(|s| self.flash.get(&s.slot).copied().unwrap_or((u64::MAX, 0)))
                            .collect();
                        ReadStep::PeekConfirm(slots, data)
                    }
                    ReadStep::PeekConfirm(slots, data) => {
                        if self.cache.confirm_hit(self.vol, first * BS, n * BS, &slots) {
                            let floor = floor.clone();
                            self.check(first, &floor, &data);
                            return true;
                        }
                        ReadStep::Plan
                    }
                    ReadStep::Plan => match self.cache.read(self.vol, first * BS, n * BS) {
                        ReadPlan::Hit { slots, .. } => ReadStep::HitRead(slots),
                        ReadPlan::Miss { fill } => ReadStep::Lower(fill),
                        ReadPlan::Bypass => unreachable!(),
                    },
                    ReadStep::HitRead(slots) => {
                        let data = slots
                            .iter()
                            .map(|s| self.flash.get(&s.slot).copied().unwrap_or((u64::MAX, 0)))
                            .collect();
                        ReadStep::HitCheck(slots, data)
                    }
                    ReadStep::HitCheck(slots, data) => {
                        if self.cache.still_valid(self.vol, &slots) {
                            let floor = floor.clone();
                            self.check(first, &floor, &data);
                            return true;
                        }
                        ReadStep::Lower(None)
                    }
                    ReadStep::Lower(fill) => {
                        let data = self.lower(first, n);
                        let floor = floor.clone();
                        self.check(first, &floor, &data);
                        match fill {
                            None => return true,
                            Some(f) => ReadStep::Reserve(f, data),
                        }
                    }
                    ReadStep::Reserve(f, data) => {
                        let slots = self.cache.fill_slots(f);
                        ReadStep::Fill(f, data, slots)
                    }
                    ReadStep::Fill(f, data, mut slots) => match slots.pop() {
                        // One slot written per step (check and write under its lock).
                        Some(s) => {
                            if self.cache.slot_current(s.slot) {
                                let i = (s.offset_in_read / BS) as usize;
                                self.flash.insert(s.slot.slot, data[i]);
                            }
                            ReadStep::Fill(f, data, slots)
                        }
                        None => {
                            self.cache.filled(f, true);
                            return true;
                        }
                    },
                };
                *step = next;
                false
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn no_read_returns_data_older_than_an_acknowledged_write(
        capacity in 1u32..12,
        ops in prop::collection::vec((0u8..10, 0u64..16, 1u64..4, any::<u8>()), 1..200),
    ) {
        let mut cache = cache(capacity, 0);
        let vol = cache.add_volume(true);
        let mut w = World {
            cache,
            vol,
            store: HashMap::new(),
            acked: HashMap::new(),
            flash: HashMap::new(),
            version: 0,
            reads_checked: 0,
        };
        let mut actors: Vec<Actor> = Vec::new();
        for (kind, first, n, pick) in ops {
            match kind {
                0..=2 => actors.push(Actor::Read {
                    first,
                    n,
                    floor: vec![],
                    step: ReadStep::Start,
                }),
                3 => actors.push(Actor::Write { first, n, id: None, applied: None }),
                _ if !actors.is_empty() => {
                    let i = pick as usize % actors.len();
                    let mut a = actors.swap_remove(i);
                    if !w.step(&mut a) {
                        actors.push(a);
                    }
                }
                _ => {}
            }
        }
        while let Some(mut a) = actors.pop() {
            while !w.step(&mut a) {}
        }
        prop_assert_eq!(w.cache.in_flight(), (0, 0));
        prop_assert!(w.cache.resident_blocks() <= capacity);
    }
}
