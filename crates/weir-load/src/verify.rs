//! Verifiable data: write patterns and the shadow map of what was written.
//!
//! Granularity is the 512-byte sector. Each sector of each target keeps a write
//! generation (how many writes were issued to it); the bytes a write puts there are a
//! pure function of `(seed, target, sector, generation)` ([`fill_sector`]), so nothing
//! but the generation is stored (8 bytes per sector, in pages of 64 sectors: about 600 bytes per random
//! small write on a large volume, 1.6 % of the data for dense writes).
//!
//! Concurrency rules (the target may reorder anything in flight):
//! - a read is checked sector by sector, only where the sector's state was settled
//!   (no write in flight, content known) both when the read was issued and when it
//!   completed, with the same generation;
//! - two writes in flight to the same sector at once, or a write that failed, leave
//!   the sector's content unknown until the next write settles it;
//! - a never-written sector is expected to hold zeroes only when the caller says the
//!   target started zeroed; otherwise it is not checked.

use std::collections::HashMap;

pub const SECTOR_BYTES: u64 = 512;
const PAGE_SECTORS: u64 = 64;
const GEN_MASK: u64 = 0xffff_ffff;
const PENDING_SHIFT: u32 = 32;
const PENDING_ONE: u64 = 1 << PENDING_SHIFT;
const PENDING_MASK: u64 = 0xffff << PENDING_SHIFT;
const CONFLICT: u64 = 1 << 48;
const UNKNOWN: u64 = 1 << 49;
/// Snapshot marker: this sector of the read is not checked.
const NOT_CHECKED: u32 = u32::MAX;

/// What a mismatching sector held instead of the expected pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// All zeroes where a write had landed.
    Zeroes,
    /// Data where zeroes were expected (never written, target started zeroed).
    DataInsteadOfZeroes,
    /// An older (or newer) write of the same sector.
    Generation(u32),
    /// A pattern written for another sector (misdirected I/O).
    OtherSector { target: u32, sector: u64 },
    /// Bytes that match no pattern; `differing_bytes` of 512 differ from the expected.
    Corrupted { differing_bytes: u32 },
}

/// The first mismatches, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub target: u32,
    pub offset_bytes: u64,
    pub expected_generation: u32,
    pub found: Found,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "target {} offset {}: expected ",
            self.target, self.offset_bytes
        )?;
        if self.expected_generation == 0 {
            write!(f, "zeroes")?;
        } else {
            write!(f, "write #{}", self.expected_generation)?;
        }
        match &self.found {
            Found::Zeroes => write!(f, ", found zeroes"),
            Found::DataInsteadOfZeroes => write!(f, ", found data"),
            Found::Generation(g) => write!(f, ", found write #{g} of that sector (stale)"),
            Found::OtherSector { target, sector } => write!(
                f,
                ", found the data of target {target} offset {} (misdirected)",
                sector * SECTOR_BYTES
            ),
            Found::Corrupted { differing_bytes } => {
                write!(f, ", found {differing_bytes} of 512 bytes corrupted")
            }
        }
    }
}

/// Outcome of checking one read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadCheck {
    pub checked_sectors: u64,
    pub mismatched_sectors: u64,
    pub first_mismatch: Option<Mismatch>,
}

/// The sectors of one read and their expected generations at issue time.
#[derive(Clone, Debug)]
pub struct ReadTicket {
    pub first_sector: u64,
    expected: Vec<u32>,
}

impl ReadTicket {
    /// Whether any sector will be checked at all.
    pub fn checks_anything(&self) -> bool {
        self.expected.iter().any(|&g| g != NOT_CHECKED)
    }
}

/// Shadow map of every target's sectors.
#[derive(Debug)]
pub struct Shadow {
    seed: u64,
    target_zeroed: bool,
    targets: Vec<HashMap<u64, Box<[u64]>>>,
}

impl Shadow {
    pub fn new(seed: u64, targets: usize, target_zeroed: bool) -> Shadow {
        Shadow {
            seed,
            target_zeroed,
            targets: (0..targets).map(|_| HashMap::new()).collect(),
        }
    }

    fn state(&self, target: u32, sector: u64) -> u64 {
        self.targets[target as usize]
            .get(&(sector / PAGE_SECTORS))
            .map_or(0, |p| p[(sector % PAGE_SECTORS) as usize])
    }

    fn state_mut(&mut self, target: u32, sector: u64) -> &mut u64 {
        let page = self.targets[target as usize]
            .entry(sector / PAGE_SECTORS)
            .or_insert_with(|| vec![0u64; PAGE_SECTORS as usize].into_boxed_slice());
        &mut page[(sector % PAGE_SECTORS) as usize]
    }

    /// A write of `buf.len() / 512` sectors from `first_sector` is being issued: bumps
    /// each sector's generation and fills `buf` with the patterns to write.
    pub fn begin_write(&mut self, target: u32, first_sector: u64, buf: &mut [u8]) {
        let seed = self.seed;
        for (i, chunk) in buf.chunks_exact_mut(SECTOR_BYTES as usize).enumerate() {
            let sector = first_sector + i as u64;
            let s = self.state_mut(target, sector);
            let generation = ((*s & GEN_MASK) + 1) & GEN_MASK;
            let generation = if generation == 0 { 1 } else { generation };
            let mut next = (*s & !GEN_MASK) | generation;
            if next & PENDING_MASK != 0 {
                next |= CONFLICT;
            } else {
                next &= !UNKNOWN;
            }
            if next & PENDING_MASK != PENDING_MASK {
                next += PENDING_ONE;
            } else {
                next |= CONFLICT;
            }
            *s = next;
            fill_sector(seed, target, sector, generation as u32, chunk);
        }
    }

    /// The write issued with [`Shadow::begin_write`] finished (`ok`: without error).
    pub fn end_write(&mut self, target: u32, first_sector: u64, sectors: u64, ok: bool) {
        for sector in first_sector..first_sector + sectors {
            let s = self.state_mut(target, sector);
            let mut next = *s;
            if next & PENDING_MASK != 0 {
                next -= PENDING_ONE;
            }
            if !ok {
                next |= UNKNOWN;
            }
            if next & PENDING_MASK == 0 && next & CONFLICT != 0 {
                next = (next & !CONFLICT) | UNKNOWN;
            }
            *s = next;
        }
    }

    /// Runs of settled written sectors of `target` (content known, no write in
    /// flight), in ascending order, each at most `max_run` sectors, `budget` sectors
    /// in all.
    pub fn settled_ranges(&self, target: u32, max_run: u64, budget: u64) -> Vec<(u64, u64)> {
        let map = &self.targets[target as usize];
        let mut pages: Vec<u64> = map.keys().copied().collect();
        pages.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut left = budget;
        for p in pages {
            for (i, &s) in map[&p].iter().enumerate() {
                if left == 0 {
                    return out;
                }
                let settled = s & GEN_MASK != 0 && s & (PENDING_MASK | UNKNOWN) == 0;
                if !settled {
                    continue;
                }
                let sector = p * PAGE_SECTORS + i as u64;
                match out.last_mut() {
                    Some((first, n)) if *first + *n == sector && *n < max_run.max(1) => *n += 1,
                    _ => out.push((sector, 1)),
                }
                left -= 1;
            }
        }
        out
    }

    /// A read is being issued: remembers what each sector should hold.
    pub fn begin_read(&self, target: u32, first_sector: u64, sectors: u64) -> ReadTicket {
        let expected = (first_sector..first_sector + sectors)
            .map(|sector| {
                let s = self.state(target, sector);
                let generation = (s & GEN_MASK) as u32;
                if s & (PENDING_MASK | UNKNOWN) != 0 || (generation == 0 && !self.target_zeroed) {
                    NOT_CHECKED
                } else {
                    generation
                }
            })
            .collect();
        ReadTicket {
            first_sector,
            expected,
        }
    }

    /// Checks a completed read's data against the ticket.
    pub fn check_read(&self, target: u32, ticket: &ReadTicket, data: &[u8]) -> ReadCheck {
        let mut check = ReadCheck::default();
        let mut expected_buf = [0u8; SECTOR_BYTES as usize];
        for (i, chunk) in data.chunks_exact(SECTOR_BYTES as usize).enumerate() {
            let Some(&generation) = ticket.expected.get(i) else {
                break;
            };
            if generation == NOT_CHECKED {
                continue;
            }
            let sector = ticket.first_sector + i as u64;
            let s = self.state(target, sector);
            if s & (PENDING_MASK | UNKNOWN) != 0 || (s & GEN_MASK) as u32 != generation {
                continue; // written while the read was in flight
            }
            check.checked_sectors += 1;
            let ok = if generation == 0 {
                chunk.iter().all(|&b| b == 0)
            } else {
                fill_sector(self.seed, target, sector, generation, &mut expected_buf);
                chunk == expected_buf
            };
            if !ok {
                check.mismatched_sectors += 1;
                if check.first_mismatch.is_none() {
                    check.first_mismatch = Some(Mismatch {
                        target,
                        offset_bytes: sector * SECTOR_BYTES,
                        expected_generation: generation,
                        found: self.diagnose(target, sector, generation, chunk, &expected_buf),
                    });
                }
            }
        }
        check
    }

    fn diagnose(
        &self,
        target: u32,
        sector: u64,
        generation: u32,
        got: &[u8],
        expected: &[u8],
    ) -> Found {
        if generation == 0 {
            return Found::DataInsteadOfZeroes;
        }
        if got.iter().all(|&b| b == 0) {
            return Found::Zeroes;
        }
        let word =
            |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let (w0, w1) = (word(0), word(1));
        let (t, g) = ((w1 >> 32) as u32, w1 as u32);
        let mut probe = [0u8; SECTOR_BYTES as usize];
        if (w0, t) != (sector, target) && (t as usize) < self.targets.len() && g != 0 {
            fill_sector(self.seed, t, w0, g, &mut probe);
            if probe[..] == got[..] {
                return Found::OtherSector {
                    target: t,
                    sector: w0,
                };
            }
        }
        if (w0, t) == (sector, target) && g != generation && g != 0 {
            fill_sector(self.seed, target, sector, g, &mut probe);
            if probe[..] == got[..] {
                return Found::Generation(g);
            }
        }
        Found::Corrupted {
            differing_bytes: got.iter().zip(expected).filter(|(a, b)| a != b).count() as u32,
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 512 bytes write `generation` puts in `sector` of `target`: the sector number
/// and `(target << 32) | generation` in clear (little endian, for diagnosis), then 496
/// pseudo-random bytes keyed by all four inputs.
pub fn fill_sector(seed: u64, target: u32, sector: u64, generation: u32, out: &mut [u8]) {
    let tag = ((target as u64) << 32) | generation as u64;
    let mut key = splitmix64(seed ^ splitmix64(sector ^ splitmix64(tag)));
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        let v = match i {
            0 => sector,
            1 => tag,
            _ => {
                key = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
                splitmix64(key)
            }
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(sh: &mut Shadow, sector: u64, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n * 512];
        sh.begin_write(0, sector, &mut buf);
        buf
    }

    #[test]
    fn written_data_reads_back_and_stale_or_corrupt_data_is_caught() {
        let mut sh = Shadow::new(7, 1, false);
        let first = write(&mut sh, 10, 4);
        sh.end_write(0, 10, 4, true);
        let t = sh.begin_read(0, 10, 4);
        assert_eq!(sh.check_read(0, &t, &first).checked_sectors, 4);
        assert_eq!(sh.check_read(0, &t, &first).mismatched_sectors, 0);

        let second = write(&mut sh, 10, 4);
        sh.end_write(0, 10, 4, true);
        assert_ne!(first, second, "a new generation writes new bytes");
        let t = sh.begin_read(0, 10, 4);
        let c = sh.check_read(0, &t, &first);
        assert_eq!(c.mismatched_sectors, 4);
        assert_eq!(
            c.first_mismatch.as_ref().unwrap().found,
            Found::Generation(1)
        );

        let mut flipped = second.clone();
        flipped[700] ^= 0x10;
        let c = sh.check_read(0, &t, &flipped);
        assert_eq!(c.mismatched_sectors, 1);
        let m = c.first_mismatch.unwrap();
        assert_eq!(m.offset_bytes, 11 * 512);
        assert_eq!(m.found, Found::Corrupted { differing_bytes: 1 });
        assert!(m.to_string().contains("1 of 512 bytes corrupted"), "{m}");

        let c = sh.check_read(0, &t, &vec![0u8; 2048]);
        assert_eq!(c.first_mismatch.unwrap().found, Found::Zeroes);

        // Data of sector 11 returned for sector 10 (misdirected).
        let mut shifted = second.clone();
        shifted.copy_within(512..1024, 0);
        let c = sh.check_read(0, &t, &shifted);
        assert_eq!(
            c.first_mismatch.unwrap().found,
            Found::OtherSector {
                target: 0,
                sector: 11
            }
        );
    }

    #[test]
    fn unknown_blocks_are_checked_only_on_zeroed_targets() {
        let sh = Shadow::new(1, 1, false);
        let t = sh.begin_read(0, 0, 2);
        assert!(!t.checks_anything());
        assert_eq!(sh.check_read(0, &t, &[9u8; 1024]).checked_sectors, 0);
        let sh = Shadow::new(1, 1, true);
        let t = sh.begin_read(0, 0, 2);
        assert_eq!(sh.check_read(0, &t, &[0u8; 1024]).mismatched_sectors, 0);
        let c = sh.check_read(0, &t, &[9u8; 1024]);
        assert_eq!(c.mismatched_sectors, 2);
        assert_eq!(c.first_mismatch.unwrap().found, Found::DataInsteadOfZeroes);
    }

    #[test]
    fn in_flight_overlaps_are_not_judged() {
        let mut sh = Shadow::new(3, 2, true);
        // Read issued while a write is in flight: not checked.
        let w = write(&mut sh, 0, 1);
        let t = sh.begin_read(0, 0, 1);
        assert!(!t.checks_anything());
        sh.end_write(0, 0, 1, true);
        // Write issued while a read is in flight: the read is not judged.
        let t = sh.begin_read(0, 0, 1);
        let _ = write(&mut sh, 0, 1);
        assert_eq!(sh.check_read(0, &t, &w).checked_sectors, 0);
        sh.end_write(0, 0, 1, true);
        // Two overlapping writes: content unknown until the next settled write.
        let _ = write(&mut sh, 0, 1);
        let _ = write(&mut sh, 0, 1);
        sh.end_write(0, 0, 1, true);
        sh.end_write(0, 0, 1, true);
        assert!(!sh.begin_read(0, 0, 1).checks_anything());
        let w = write(&mut sh, 0, 1);
        sh.end_write(0, 0, 1, true);
        let t = sh.begin_read(0, 0, 1);
        assert_eq!(sh.check_read(0, &t, &w).checked_sectors, 1);
        // A failed write: unknown.
        let _ = write(&mut sh, 0, 1);
        sh.end_write(0, 0, 1, false);
        assert!(!sh.begin_read(0, 0, 1).checks_anything());
        // Targets are independent.
        let t = sh.begin_read(1, 0, 1);
        assert_eq!(sh.check_read(1, &t, &[0u8; 512]).checked_sectors, 1);
    }

    #[test]
    fn settled_ranges_merge_runs_and_respect_limits() {
        let mut sh = Shadow::new(1, 1, false);
        let _ = write(&mut sh, 10, 6); // 10..16
        sh.end_write(0, 10, 6, true);
        let _ = write(&mut sh, 70, 2); // 70..72
        sh.end_write(0, 70, 2, true);
        let _ = write(&mut sh, 100, 1); // in flight: not settled
        assert_eq!(sh.settled_ranges(0, 100, 100), vec![(10, 6), (70, 2)]);
        assert_eq!(
            sh.settled_ranges(0, 4, 100),
            vec![(10, 4), (14, 2), (70, 2)]
        );
        assert_eq!(sh.settled_ranges(0, 100, 7), vec![(10, 6), (70, 1)]);
        // A run across a page boundary stays one run.
        let _ = write(&mut sh, 60, 8);
        sh.end_write(0, 60, 8, true);
        assert_eq!(sh.settled_ranges(0, 100, 100)[1], (60, 8));
    }

    #[test]
    fn patterns_depend_on_every_input() {
        let mut base = [0u8; 512];
        fill_sector(1, 0, 5, 1, &mut base);
        for (seed, target, sector, generation) in
            [(2, 0, 5, 1), (1, 1, 5, 1), (1, 0, 6, 1), (1, 0, 5, 2)]
        {
            let mut other = [0u8; 512];
            fill_sector(seed, target, sector, generation, &mut other);
            assert_ne!(base[16..], other[16..]);
        }
    }
}
