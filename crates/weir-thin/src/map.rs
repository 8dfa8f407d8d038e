//! A layer's grain map in memory: grain number → map entry, two levels (like
//! qcow2's L1/L2 tables) so an untouched 20 GiB clone costs a few KiB and a
//! lookup is two array indexings, no hashing.

/// Grains per second-level chunk (16 KiB of entries: 256 MiB of volume at
/// 64 KiB grains).
const CHUNK_GRAINS: u64 = 4096;

/// Map entry: the grain is not in this layer (read through to the parent).
pub const UNMAPPED: u32 = 0;
/// Map entry: the grain reads as zeroes here (trimmed or zeroed over a parent's
/// data); the walk down the chain stops.
pub const ZERO: u32 = u32::MAX;

/// What one map entry says about a grain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Unmapped,
    Zero,
    /// Stored in this layer's data file at `slot × grain_bytes`.
    Slot(u32),
}

impl Entry {
    pub fn from_raw(raw: u32) -> Entry {
        match raw {
            UNMAPPED => Entry::Unmapped,
            ZERO => Entry::Zero,
            n => Entry::Slot(n - 1),
        }
    }
    pub fn raw(self) -> u32 {
        match self {
            Entry::Unmapped => UNMAPPED,
            Entry::Zero => ZERO,
            Entry::Slot(s) => {
                assert!(s < ZERO - 1, "slot {s} out of range");
                s + 1
            }
        }
    }
}

#[derive(Default)]
pub struct GrainMap {
    chunks: Vec<Option<Box<[u32]>>>,
    grains: u64,
    /// Entries that are not `UNMAPPED`.
    mapped: u64,
    /// Entries that are slots (grains stored in this layer).
    stored: u64,
}

impl GrainMap {
    pub fn new(grains: u64) -> GrainMap {
        GrainMap {
            chunks: (0..grains.div_ceil(CHUNK_GRAINS)).map(|_| None).collect(),
            grains,
            mapped: 0,
            stored: 0,
        }
    }

    pub fn grains(&self) -> u64 {
        self.grains
    }
    pub fn mapped(&self) -> u64 {
        self.mapped
    }
    /// Grains stored in this layer (slot entries).
    pub fn stored(&self) -> u64 {
        self.stored
    }

    pub fn get(&self, grain: u64) -> Entry {
        if grain >= self.grains {
            return Entry::Unmapped;
        }
        match &self.chunks[(grain / CHUNK_GRAINS) as usize] {
            Some(c) => Entry::from_raw(c[(grain % CHUNK_GRAINS) as usize]),
            None => Entry::Unmapped,
        }
    }

    /// Sets an entry; returns the previous one.
    pub fn set(&mut self, grain: u64, entry: Entry) -> Entry {
        assert!(grain < self.grains, "grain {grain} beyond {}", self.grains);
        let chunk = &mut self.chunks[(grain / CHUNK_GRAINS) as usize];
        if chunk.is_none() {
            if entry == Entry::Unmapped {
                return Entry::Unmapped;
            }
            *chunk = Some(vec![UNMAPPED; CHUNK_GRAINS as usize].into_boxed_slice());
        }
        let cell = &mut chunk.as_mut().expect("chunk present")[(grain % CHUNK_GRAINS) as usize];
        let old = Entry::from_raw(*cell);
        *cell = entry.raw();
        match (old == Entry::Unmapped, entry == Entry::Unmapped) {
            (true, false) => self.mapped += 1,
            (false, true) => self.mapped -= 1,
            _ => {}
        }
        let is_slot = |e: Entry| matches!(e, Entry::Slot(_));
        self.stored = self.stored + is_slot(entry) as u64 - is_slot(old) as u64;
        old
    }

    /// Grows or shrinks the grain count; entries beyond a shrunk end are dropped
    /// and returned (so their slots can be freed).
    pub fn resize(&mut self, grains: u64) -> Vec<Entry> {
        let mut dropped = Vec::new();
        for g in grains..self.grains {
            let e = self.get(g);
            if e != Entry::Unmapped {
                dropped.push(e);
                self.set(g, Entry::Unmapped);
            }
        }
        self.chunks
            .resize_with(grains.div_ceil(CHUNK_GRAINS) as usize, || None);
        self.grains = grains;
        dropped
    }

    /// Every entry that is not `UNMAPPED`, in grain order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        self.chunks.iter().enumerate().flat_map(|(ci, c)| {
            c.iter().flat_map(move |c| {
                c.iter()
                    .enumerate()
                    .filter(|(_, e)| **e != UNMAPPED)
                    .map(move |(i, e)| (ci as u64 * CHUNK_GRAINS + i as u64, Entry::from_raw(*e)))
            })
        })
    }

    /// Memory the map holds, bytes (for metrics and the sizing note in docs).
    pub fn heap_bytes(&self) -> u64 {
        let chunks = self.chunks.iter().filter(|c| c.is_some()).count() as u64;
        self.chunks.len() as u64 * 16 + chunks * CHUNK_GRAINS * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_iter_and_counts() {
        let mut m = GrainMap::new(10_000);
        assert_eq!(m.get(5), Entry::Unmapped);
        assert_eq!(m.set(5, Entry::Slot(0)), Entry::Unmapped);
        assert_eq!(m.set(9_000, Entry::Zero), Entry::Unmapped);
        assert_eq!(m.set(5, Entry::Slot(7)), Entry::Slot(0));
        assert_eq!(m.mapped(), 2);
        assert_eq!(m.stored(), 1);
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            vec![(5, Entry::Slot(7)), (9_000, Entry::Zero)]
        );
        assert_eq!(m.set(5, Entry::Unmapped), Entry::Slot(7));
        assert_eq!(m.mapped(), 1);
        assert_eq!(m.get(20_000), Entry::Unmapped);
        let dropped = m.resize(100);
        assert_eq!(dropped, vec![Entry::Zero]);
        assert_eq!(m.mapped(), 0);
    }

    #[test]
    fn untouched_map_is_small() {
        // A 20 GiB clone at 64 KiB grains: 327,680 grains, no chunk allocated.
        let m = GrainMap::new(327_680);
        assert!(m.heap_bytes() < 2_000, "{}", m.heap_bytes());
    }
}
