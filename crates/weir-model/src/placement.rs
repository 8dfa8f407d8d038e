//! Extent placement on a flash tier in front of a disk tier: the decisions of a
//! hybrid pool, as a pure state machine (no data, no I/O, no clock, no threads).
//! The simulator's [`crate::HybridArray`] and `weir serve`'s tier layer drive the
//! same code, each with its own clock and devices.
//!
//! * **Extents** (`extent_bytes`, 1 MiB default) are keyed by a `u64` the driver
//!   chooses (the server packs a volume id and an extent index).
//! * **Heat**: each host read or write of an extent adds 1; heat halves every
//!   `half_life_ns`. An extent not on flash whose heat reaches `promote_heat` is
//!   queued for promotion (the queue holds at most `max_queue` extents).
//! * **Promotion** copies an extent disk → flash into a free slot. When flash is
//!   full, the least recently used resident extent is demoted first, and only if
//!   the candidate is clearly hotter ([`DISPLACE_FACTOR`] times the victim's heat
//!   plus `promote_heat`; an extent is then not even queued below that bar): a clean
//!   one is dropped (its slot is released once the driver has made the
//!   [`Record::Unmap`] durable), a dirty one is destaged first.
//! * **Writes** to a resident extent go to flash and make it dirty; a write that
//!   covers a whole extent not on flash *lands* on a free slot when there is one
//!   (new writes land on flash); any other write goes to disk.
//! * **Destage** copies a dirty extent flash → disk and marks it clean, for room
//!   (the demotion victim) or while more than `dirty_limit` extents are dirty.
//! * **Races**: a write to an extent being promoted waits ([`Route::Wait`]) until
//!   the promotion ends. Every host write or trim of an extent bumps its generation; a move
//!   whose generation changed since it started does not take effect (a promotion is
//!   dropped, a destage leaves the extent dirty, a landing goes to disk). A move
//!   never starts while host I/O that it could overtake is in flight on the extent
//!   (disk writes for a promotion, flash writes for a destage, any flash I/O for a
//!   demotion), so a copy never reads data older than an acknowledged write and a
//!   slot is never reused under an I/O still reading or writing it.
//! * **Records**: every change of what flash holds comes out as a [`Record`] in the
//!   order it happened ([`Placement::take_records`]); a driver that persists them
//!   can rebuild the placement with [`Placement::restore`]. A `Map` is emitted only
//!   once the extent's data is in its slot (the driver made it durable first).
//!
//! Events in (`read`, `write`, `*_done`, `next_move`), decisions out (routes,
//! [`Move`]s, records).

use std::collections::VecDeque;

use crate::Nanos;
use crate::block_cache::{BlockCache, CachePolicy, FastMap};

/// No slot.
pub const NO_SLOT: u32 = u32::MAX;

/// When flash is full, a candidate displaces the LRU resident extent only with
/// more than this many times its heat (plus `promote_heat`). A swap costs two
/// extent copies, and heat is a noisy estimate of an access rate: an extent
/// read at a steady rate r has mean heat r·τ (τ = half-life / ln 2) and a
/// standard deviation of √(r·τ/2), so two extents of equal rate swap on noise
/// unless the bar has a margin. With a fixed bar (`promote_heat` alone) a
/// 90/10 skew whose cold extents sat near the bar spent the flash tier's
/// migration on cold extents displacing each other (docs/PERFORMANCE.md,
/// "Hybrid pool": 1,954 demotions a minute, throughput falling back). The
/// same hysteresis idea as dm-cache's smq, which promotes only above the
/// hotness level of the cache's bottom.
pub const DISPLACE_FACTOR: f64 = 2.0;

/// What a placement needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementSpec {
    /// Flash slots (flash capacity / extent size).
    pub slots: u32,
    pub extent_bytes: u64,
    pub promote_heat: f64,
    pub half_life_ns: f64,
    /// Promotion candidates queued at most (older ones are dropped).
    pub max_queue: usize,
    /// Destage dirty extents while more than this many are dirty
    /// (`u32::MAX`: only to make room).
    pub dirty_limit: u32,
}

/// Where a host I/O of one extent goes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Flash {
        slot: u32,
    },
    Disk,
    /// A whole-extent write lands on this free slot: write it there, make it
    /// durable, then call [`Placement::land_done`] with `seq`.
    Land {
        slot: u32,
        seq: u32,
    },
    /// The extent is being promoted: retry once a move has ended (a write must
    /// not race the copy, and cancelling the copy could starve a hot extent
    /// that is written often; dm-cache defers such writes the same way).
    Wait,
}

/// A migration the driver should perform, then report with the matching `*_done`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Move {
    /// Copy `key` disk → flash `slot`; then [`Placement::promote_done`].
    Promote { key: u64, slot: u32, seq: u32 },
    /// Copy `key` flash `slot` → disk; then [`Placement::destage_done`].
    Destage { key: u64, slot: u32, seq: u32 },
    /// `slot` was emptied (its `Unmap` record is out): make the records durable,
    /// then [`Placement::released`].
    Release { slot: u32 },
}

/// A change of what flash holds, in the order it happened.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// `key`'s data is in `slot` (flash holds the current copy).
    Map { key: u64, slot: u32, dirty: bool },
    /// `key` is no longer on flash (the disk copy is current).
    Unmap { key: u64, slot: u32 },
    /// Flash's copy of `key` is newer than the disk's.
    Dirty { key: u64 },
    /// The disk copy of `key` equals flash's.
    Clean { key: u64 },
}

/// Counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementStats {
    pub promotions: u64,
    pub demotions: u64,
    pub destages: u64,
    pub landings: u64,
    /// Moves that did not take effect (a write raced them, or the copy failed).
    pub moves_cancelled: u64,
    pub resident: u64,
    pub dirty: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Moving {
    Idle,
    Queued,
    Promoting,
    Destaging,
    Landing,
}

#[derive(Copy, Clone, Debug)]
struct Ext {
    heat: f64,
    heat_at: Nanos,
    /// Resident slot, or NO_SLOT (a promotion's or landing's slot is in `Moving`'s
    /// reservation, `SlotState::Reserved`, until it is done).
    slot: u32,
    dirty: bool,
    seq: u32,
    flash_reads: u32,
    flash_writes: u32,
    disk_writes: u32,
    moving: Moving,
}

impl Ext {
    fn new(now: Nanos) -> Ext {
        Ext {
            heat: 0.0,
            heat_at: now,
            slot: NO_SLOT,
            dirty: false,
            seq: 0,
            flash_reads: 0,
            flash_writes: 0,
            disk_writes: 0,
            moving: Moving::Idle,
        }
    }
    fn idle(&self) -> bool {
        self.slot == NO_SLOT
            && self.moving == Moving::Idle
            && self.flash_reads + self.flash_writes + self.disk_writes == 0
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Being filled for `key` (promotion or landing).
    Reserved(u64),
    Resident(u64),
    /// Emptied; free once its `Unmap` is durable.
    Releasing,
}

/// The placement state machine.
#[derive(Clone, Debug)]
pub struct Placement {
    spec: PlacementSpec,
    extents: FastMap<u64, Ext>,
    slots: Vec<SlotState>,
    free: Vec<u32>,
    /// Recency of resident extents (the demotion victim is its LRU end).
    lru: BlockCache,
    queue: VecDeque<u64>,
    /// Extents that turned dirty (stale entries are skipped).
    dirty_queue: VecDeque<u64>,
    dirty: u32,
    /// A promotion waits for its victim's destage (cleared when a move ends).
    blocked: bool,
    /// Extents of a dropped volume whose move was in flight: released by
    /// [`Placement::next_move`] once it ends (their slots were held until a
    /// restart, and destages retried forever, before session 30).
    doomed: Vec<u64>,
    records: Vec<Record>,
    stats: PlacementStats,
}

impl Placement {
    pub fn new(spec: PlacementSpec) -> Placement {
        assert!(spec.slots < NO_SLOT, "too many slots");
        assert!(spec.half_life_ns > 0.0 && spec.promote_heat > 0.0);
        Placement {
            lru: BlockCache::new(spec.slots.max(1), CachePolicy::Lru),
            slots: vec![SlotState::Free; spec.slots as usize],
            free: (0..spec.slots).rev().collect(),
            extents: FastMap::default(),
            queue: VecDeque::new(),
            dirty_queue: VecDeque::new(),
            dirty: 0,
            blocked: false,
            doomed: Vec::new(),
            records: Vec::new(),
            stats: PlacementStats::default(),
            spec,
        }
    }

    /// A placement holding what `records` (in order) say flash holds. `Err`: the
    /// records contradict each other (a slot mapped twice, a slot out of range).
    pub fn restore(
        spec: PlacementSpec,
        records: impl IntoIterator<Item = Record>,
    ) -> Result<Placement, String> {
        let mut p = Placement::new(spec);
        for r in records {
            p.replay(r)?;
        }
        p.free = (0..p.spec.slots)
            .rev()
            .filter(|&s| p.slots[s as usize] == SlotState::Free)
            .collect();
        Ok(p)
    }

    fn replay(&mut self, r: Record) -> Result<(), String> {
        match r {
            Record::Map { key, slot, dirty } => {
                let state = self.slots.get(slot as usize).copied();
                if state != Some(SlotState::Free) || self.slot_of(key).is_some() {
                    return Err(format!("map of extent {key:#x} to slot {slot}: {state:?}"));
                }
                self.slots[slot as usize] = SlotState::Resident(key);
                self.lru.insert(key as u128);
                let x = self.extents.entry(key).or_insert(Ext::new(0));
                x.slot = slot;
                x.dirty = false;
                if dirty {
                    self.set_dirty(key, false);
                }
            }
            Record::Unmap { key, slot } => {
                if self.slot_of(key) != Some(slot) {
                    return Err(format!("unmap of extent {key:#x} from slot {slot}"));
                }
                self.set_clean(key, false);
                self.unmap(key);
                self.slots[slot as usize] = SlotState::Free;
            }
            Record::Dirty { key } if self.slot_of(key).is_some() => self.set_dirty(key, false),
            Record::Clean { key } if self.slot_of(key).is_some() => self.set_clean(key, false),
            Record::Dirty { key } | Record::Clean { key } => {
                return Err(format!("dirty/clean of extent {key:#x} not on flash"));
            }
        }
        Ok(())
    }

    pub fn spec(&self) -> &PlacementSpec {
        &self.spec
    }

    pub fn stats(&self) -> PlacementStats {
        PlacementStats {
            resident: self.lru.len() as u64,
            dirty: self.dirty as u64,
            ..self.stats
        }
    }

    /// The slot holding `key` now (not one being filled).
    pub fn slot_of(&self, key: u64) -> Option<u32> {
        self.extents
            .get(&key)
            .map(|x| x.slot)
            .filter(|&s| s != NO_SLOT)
    }

    pub fn is_dirty(&self, key: u64) -> bool {
        self.extents.get(&key).is_some_and(|x| x.dirty)
    }

    /// Every extent on flash: `(key, slot, dirty)` (the records of a compacted log).
    pub fn resident(&self) -> Vec<(u64, u32, bool)> {
        let mut v: Vec<_> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(s, st)| match st {
                SlotState::Resident(k) => Some((*k, s as u32, self.is_dirty(*k))),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Records of flash changes since the last call, oldest first.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// Whether records are waiting (the driver persists them before it relies on them).
    pub fn has_records(&self) -> bool {
        !self.records.is_empty()
    }

    fn heat_up(&mut self, now: Nanos, key: u64) -> &mut Ext {
        let hl = self.spec.half_life_ns;
        let x = self.extents.entry(key).or_insert(Ext::new(now));
        let dt = now.saturating_sub(x.heat_at) as f64;
        if dt > 0.0 {
            x.heat *= (-dt / hl).exp2();
        }
        x.heat_at = now;
        x.heat += 1.0;
        x
    }

    /// The heat an extent needs to be promoted now: `promote_heat` while a slot
    /// is free, else enough to displace the LRU resident extent.
    fn promote_bar(&self, now: Nanos) -> f64 {
        let promote = self.spec.promote_heat;
        if !self.free.is_empty() {
            return promote;
        }
        match self.lru.peek_victim() {
            Some(v) => self.displace_bar(&self.extents[&(v as u64)], now),
            None => promote,
        }
    }

    /// The heat a candidate needs to displace `victim` ([`DISPLACE_FACTOR`]).
    fn displace_bar(&self, victim: &Ext, now: Nanos) -> f64 {
        DISPLACE_FACTOR * self.heat_at(victim, now) + self.spec.promote_heat
    }

    /// Bumps `key`'s heat and queues it for promotion when it turned hot.
    fn touch(&mut self, now: Nanos, key: u64) {
        let promote = self.promote_bar(now);
        let x = self.heat_up(now, key);
        let queue = x.slot == NO_SLOT && x.moving == Moving::Idle && x.heat >= promote;
        if queue {
            x.moving = Moving::Queued;
            self.queue.push_back(key);
            if self.queue.len() > self.spec.max_queue {
                let old = self.queue.pop_front().expect("queue is not empty");
                self.unqueue(old);
            }
        } else if x.slot != NO_SLOT {
            self.lru.touch(key as u128);
        }
    }

    fn unqueue(&mut self, key: u64) {
        if let Some(x) = self.extents.get_mut(&key)
            && x.moving == Moving::Queued
        {
            x.moving = Moving::Idle;
        }
        self.forget_if_idle(key);
    }

    /// Drops an extent's entry once it holds nothing worth keeping (cold, off
    /// flash, no I/O): bounds the map by the extents recently touched.
    fn forget_if_idle(&mut self, key: u64) {
        if self
            .extents
            .get(&key)
            .is_some_and(|x| x.idle() && x.heat < 0.5)
        {
            self.extents.remove(&key);
        }
    }

    /// A host read of `key`: where it reads. Report it with [`Placement::read_done`].
    pub fn read(&mut self, now: Nanos, key: u64) -> Route {
        self.touch(now, key);
        let x = self.extents.get_mut(&key).expect("touched");
        if x.slot == NO_SLOT {
            return Route::Disk;
        }
        x.flash_reads += 1;
        Route::Flash { slot: x.slot }
    }

    pub fn read_done(&mut self, key: u64, route: Route) {
        if let Route::Flash { .. } = route {
            let x = self.extents.get_mut(&key).expect("a flash read's extent");
            x.flash_reads -= 1;
        }
        self.forget_if_idle(key);
    }

    /// A host write (or trim, or zeroing) of `key`; `whole`: it covers the whole
    /// extent. Report it with [`Placement::write_done`] (a `Land` with `land_done`;
    /// a `Wait` with nothing: call `write` again once a move has ended).
    pub fn write(&mut self, now: Nanos, key: u64, whole: bool) -> Route {
        self.touch(now, key);
        let x = self.extents.get_mut(&key).expect("touched");
        if x.moving == Moving::Promoting {
            return Route::Wait;
        }
        x.seq = x.seq.wrapping_add(1);
        if x.slot != NO_SLOT {
            x.flash_writes += 1;
            let slot = x.slot;
            if !x.dirty {
                self.set_dirty(key, true);
            }
            return Route::Flash { slot };
        }
        let can_land = matches!(x.moving, Moving::Idle | Moving::Queued) && x.disk_writes == 0;
        if whole
            && can_land
            && let Some(slot) = self.free.pop()
        {
            x.moving = Moving::Landing;
            let seq = x.seq;
            self.reserve(slot, key);
            return Route::Land { slot, seq };
        }
        x.disk_writes += 1;
        Route::Disk
    }

    pub fn write_done(&mut self, key: u64, route: Route) {
        let x = self.extents.get_mut(&key).expect("a write's extent");
        match route {
            Route::Flash { .. } => x.flash_writes -= 1,
            Route::Disk => x.disk_writes -= 1,
            Route::Land { .. } | Route::Wait => panic!("no write_done for {route:?}"),
        }
        self.forget_if_idle(key);
    }

    /// A landing's data is in its slot (`ok`) and durable. `true`: the extent is
    /// on flash now (dirty); `false`: the landing did not take effect (a write
    /// raced it, or it failed) — write the data to disk instead.
    pub fn land_done(&mut self, key: u64, slot: u32, seq: u32, ok: bool) -> bool {
        let x = self.extents.get_mut(&key).expect("a landing's extent");
        assert_eq!(x.moving, Moving::Landing);
        assert_eq!(self.slots[slot as usize], SlotState::Reserved(key));
        x.moving = Moving::Idle;
        if !ok || x.seq != seq {
            self.stats.moves_cancelled += 1;
            self.slots[slot as usize] = SlotState::Free;
            self.free.push(slot);
            return false;
        }
        self.stats.landings += 1;
        self.map(key, slot, true);
        true
    }

    fn reserve(&mut self, slot: u32, key: u64) {
        assert_eq!(self.slots[slot as usize], SlotState::Free, "slot {slot}");
        self.slots[slot as usize] = SlotState::Reserved(key);
    }

    /// `key` now lives in its reserved `slot`.
    fn map(&mut self, key: u64, slot: u32, dirty: bool) {
        assert_eq!(self.slots[slot as usize], SlotState::Reserved(key));
        self.slots[slot as usize] = SlotState::Resident(key);
        self.lru.insert(key as u128);
        let x = self.extents.get_mut(&key).expect("a mapped extent");
        x.slot = slot;
        self.records.push(Record::Map { key, slot, dirty });
        if dirty {
            self.set_dirty(key, false);
        }
    }

    fn unmap(&mut self, key: u64) -> u32 {
        let x = self.extents.get_mut(&key).expect("an unmapped extent");
        let slot = std::mem::replace(&mut x.slot, NO_SLOT);
        assert!(!x.dirty, "a dirty extent is never dropped from flash");
        self.lru.remove(key as u128);
        slot
    }

    fn set_dirty(&mut self, key: u64, record: bool) {
        let x = self.extents.get_mut(&key).expect("a resident extent");
        if x.dirty {
            return;
        }
        x.dirty = true;
        self.dirty += 1;
        self.dirty_queue.push_back(key);
        if record {
            self.records.push(Record::Dirty { key });
        }
    }

    fn set_clean(&mut self, key: u64, record: bool) {
        let x = self.extents.get_mut(&key).expect("a resident extent");
        if !x.dirty {
            return;
        }
        x.dirty = false;
        self.dirty -= 1;
        if record {
            self.records.push(Record::Clean { key });
        }
    }

    /// Whether [`Placement::next_move`] may have something to do now.
    pub fn wants_move(&self) -> bool {
        (!self.queue.is_empty() && !self.blocked)
            || self.dirty > self.spec.dirty_limit
            || !self.doomed.is_empty()
    }

    /// The next migration to perform, if any. The driver bounds how many it runs
    /// at once; each ends with its `*_done` (or `released`).
    pub fn next_move(&mut self, now: Nanos) -> Option<Move> {
        if let Some(m) = self.release_doomed() {
            return Some(m);
        }
        if self.dirty > self.spec.dirty_limit
            && let Some(m) = self.start_destage()
        {
            return Some(m);
        }
        if self.blocked {
            return None;
        }
        while let Some(key) = self.queue.pop_front() {
            match self.try_promote(now, key) {
                Next::Skip => self.unqueue(key),
                Next::Wait => {
                    self.queue.push_front(key);
                    self.blocked = true;
                    return None;
                }
                Next::Go(m, requeue) => {
                    if requeue {
                        self.queue.push_front(key);
                    }
                    return Some(m);
                }
            }
        }
        None
    }

    fn try_promote(&mut self, now: Nanos, key: u64) -> Next {
        let Some(x) = self.extents.get(&key).copied() else {
            return Next::Skip;
        };
        if x.moving != Moving::Queued || x.slot != NO_SLOT || x.disk_writes > 0 {
            return Next::Skip;
        }
        let Some(slot) = self.free.pop() else {
            return self.make_room(now, key);
        };
        self.reserve(slot, key);
        let x = self.extents.get_mut(&key).expect("queued extent");
        x.moving = Moving::Promoting;
        Next::Go(
            Move::Promote {
                key,
                slot,
                seq: x.seq,
            },
            false,
        )
    }

    /// Flash is full: demote the LRU extent if `candidate` is clearly hotter
    /// ([`DISPLACE_FACTOR`]; destaging the victim first if dirty).
    fn make_room(&mut self, now: Nanos, candidate: u64) -> Next {
        let Some(victim) = self.lru.peek_victim().map(|v| v as u64) else {
            // Every slot is being filled or released: wait for one.
            return Next::Wait;
        };
        let vx = self.extents[&victim];
        if victim == candidate
            || self.displace_bar(&vx, now) > self.heat_at(&self.extents[&candidate], now)
        {
            return Next::Skip;
        }
        if vx.moving != Moving::Idle || vx.flash_reads + vx.flash_writes > 0 {
            return Next::Wait;
        }
        if vx.dirty {
            return match self.destage(victim) {
                Some(m) => Next::Go(m, true),
                None => Next::Wait,
            };
        }
        let slot = self.unmap(victim);
        self.slots[slot as usize] = SlotState::Releasing;
        self.records.push(Record::Unmap { key: victim, slot });
        self.stats.demotions += 1;
        self.forget_if_idle(victim);
        Next::Go(Move::Release { slot }, true)
    }

    fn heat_at(&self, x: &Ext, now: Nanos) -> f64 {
        let dt = now.saturating_sub(x.heat_at) as f64;
        x.heat * (-dt / self.spec.half_life_ns).exp2()
    }

    /// The oldest dirty extent that may be destaged now.
    fn start_destage(&mut self) -> Option<Move> {
        for _ in 0..self.dirty_queue.len() {
            let key = self.dirty_queue.pop_front()?;
            let Some(x) = self.extents.get(&key) else {
                continue;
            };
            if !x.dirty || x.slot == NO_SLOT {
                continue;
            }
            if let Some(m) = self.destage(key) {
                return Some(m);
            }
            self.dirty_queue.push_back(key);
        }
        None
    }

    fn destage(&mut self, key: u64) -> Option<Move> {
        let x = self.extents.get_mut(&key).expect("a resident extent");
        debug_assert!(x.dirty && x.slot != NO_SLOT);
        if x.moving != Moving::Idle || x.flash_writes > 0 {
            return None;
        }
        x.moving = Moving::Destaging;
        Some(Move::Destage {
            key,
            slot: x.slot,
            seq: x.seq,
        })
    }

    /// A promotion's copy is in its slot (`ok`) and durable. `true`: the extent
    /// is on flash now; `false`: it did not take effect (a write raced it).
    pub fn promote_done(&mut self, key: u64, slot: u32, seq: u32, ok: bool) -> bool {
        self.blocked = false;
        let x = self.extents.get_mut(&key).expect("a promoted extent");
        assert_eq!(x.moving, Moving::Promoting);
        x.moving = Moving::Idle;
        if !ok || x.seq != seq {
            self.stats.moves_cancelled += 1;
            self.slots[slot as usize] = SlotState::Free;
            self.free.push(slot);
            if ok {
                // A write raced the copy: try again (after the queue's others).
                x.moving = Moving::Queued;
                self.queue.push_back(key);
            }
            self.forget_if_idle(key);
            return false;
        }
        self.stats.promotions += 1;
        self.map(key, slot, false);
        true
    }

    /// A destage's copy is on disk (`ok`) and durable. `true`: the extent is clean.
    pub fn destage_done(&mut self, key: u64, seq: u32, ok: bool) -> bool {
        self.blocked = false;
        let x = self.extents.get_mut(&key).expect("a destaged extent");
        assert_eq!(x.moving, Moving::Destaging);
        x.moving = Moving::Idle;
        if !ok || x.seq != seq {
            self.stats.moves_cancelled += 1;
            if x.dirty {
                self.dirty_queue.push_back(key);
            }
            return false;
        }
        self.stats.destages += 1;
        self.set_clean(key, true);
        true
    }

    /// A released slot's `Unmap` is durable: the slot may be reused.
    pub fn released(&mut self, slot: u32) {
        assert_eq!(self.slots[slot as usize], SlotState::Releasing);
        self.slots[slot as usize] = SlotState::Free;
        self.free.push(slot);
        self.blocked = false;
    }

    /// Drops every extent whose key `belongs` (a deleted volume's): their slots
    /// come back as `Release` moves; dirty data is discarded. Extents with a move
    /// in flight are dropped when it ends (their keys are gone: no one reads them),
    /// by [`Placement::next_move`]; queued promotions are forgotten.
    pub fn drop_where(&mut self, belongs: impl Fn(u64) -> bool) -> Vec<Move> {
        let mut keys: Vec<(u64, Moving)> = self
            .extents
            .iter()
            .filter(|(k, _)| belongs(**k))
            .map(|(k, x)| (*k, x.moving))
            .collect();
        keys.sort_unstable_by_key(|(k, _)| *k);
        let mut out = Vec::new();
        for (key, moving) in keys {
            match moving {
                Moving::Idle => out.extend(self.drop_extent(key)),
                Moving::Queued => self.unqueue(key),
                _ => self.doomed.push(key),
            }
        }
        out
    }

    /// Releases `key`'s slot (`Release`) and forgets it; one without a slot is
    /// left to [`Placement::forget_if_idle`] (its I/O may still be counted).
    fn drop_extent(&mut self, key: u64) -> Option<Move> {
        if self.extents.get(&key)?.slot == NO_SLOT {
            return None;
        }
        self.set_clean(key, false);
        let slot = self.unmap(key);
        self.slots[slot as usize] = SlotState::Releasing;
        self.records.push(Record::Unmap { key, slot });
        self.extents.remove(&key);
        Some(Move::Release { slot })
    }

    /// The first dropped extent whose move has ended: its release (extents
    /// left without a slot are forgotten on the way).
    fn release_doomed(&mut self) -> Option<Move> {
        while let Some(i) = (0..self.doomed.len()).find(|&i| {
            self.extents
                .get(&self.doomed[i])
                .is_none_or(|x| matches!(x.moving, Moving::Idle | Moving::Queued))
        }) {
            let key = self.doomed.swap_remove(i);
            self.unqueue(key);
            if let Some(m) = self.drop_extent(key) {
                return Some(m);
            }
        }
        None
    }

    /// Checks the invariants (tests; O(slots + extents)).
    pub fn check(&self) {
        let mut owners = FastMap::<u64, u32>::default();
        let mut resident = 0;
        for (s, st) in self.slots.iter().enumerate() {
            match *st {
                SlotState::Resident(k) | SlotState::Reserved(k) => {
                    assert!(
                        owners.insert(k, s as u32).is_none(),
                        "extent {k} in two slots"
                    );
                    if let SlotState::Resident(_) = st {
                        resident += 1;
                        assert_eq!(self.extents[&k].slot, s as u32);
                    }
                }
                SlotState::Free => assert!(self.free.contains(&(s as u32))),
                SlotState::Releasing => {}
            }
        }
        assert_eq!(self.lru.len() as usize, resident);
        assert!(resident <= self.spec.slots as usize);
        let dirty = self.extents.values().filter(|x| x.dirty).count();
        assert_eq!(dirty, self.dirty as usize);
        for x in self.extents.values() {
            assert!(!x.dirty || x.slot != NO_SLOT, "dirty extent off flash");
        }
        let mut f = self.free.clone();
        f.sort_unstable();
        f.dedup();
        assert_eq!(f.len(), self.free.len(), "a slot free twice");
    }
}

enum Next {
    /// Not a candidate (any more): drop it from the queue.
    Skip,
    /// Blocked until a move ends.
    Wait,
    /// Perform this; `true`: the candidate stays at the queue's head.
    Go(Move, bool),
}
