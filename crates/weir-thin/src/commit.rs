//! Merging a frozen layer *up* into its parent (qemu's "block-commit"), the
//! counterpart of [`crate::merge_into`] (which copies a parent *down* into its
//! child, qemu's "block-stream").
//!
//! Why both: removing a snapshot whose layer `P` has a single child `C` can keep
//! either layer. Merging down copies what `C` reads from `P` (everything `C`
//! does not hold, typically most of the volume) into `C`; merging up copies what
//! `C` holds (what changed since the snapshot) into `P`. Asynchronous replication
//! drops its previous snapshot after every cycle, under a layer that holds the
//! whole volume, so it merges up: the cost follows the data written in a cycle,
//! not the volume's size (docs/THIN.md, "Replication").
//!
//! Rules (the caller's, checked with its catalog): `C` is frozen and its parent
//! is `P`; nothing reads `P` except through `C` (no snapshot names `P`, `C` is
//! its only child, no volume has `P` as its top). Then changing `P`'s copy of a
//! grain `C` holds is invisible to every reader, and after this returns `P`
//! reads exactly as the chain `C → P` did, so the caller can point everything
//! that referenced `C` at `P` and drop `C`. Crash safety: `P` is committed
//! (data synced before its map) before this returns; until the caller's catalog
//! stops naming `C`, a crash leaves `C → P` reading as before (a half-merged `P`
//! is still hidden behind `C`), and merging again is idempotent.

use std::io;

use crate::cache::GrainCache;
use crate::layer::Layer;
use crate::map::Entry;

/// What [`commit_into`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Grains copied from the child (written over the parent's copy or into a
    /// new slot of the parent).
    pub copied: u64,
    /// Grains the child marks as zeroes, marked so (or unmapped) in the parent.
    pub zeroed: u64,
}

/// Copies every grain `child` holds or zero-marks into `parent` (which takes
/// `child`'s grain count), then commits `parent`. `parent_is_base`: `parent` has
/// no parent of its own, so a zeroed grain becomes unmapped (a hole) rather
/// than a zero marker. `cache`: the pool's read cache, whose copies of the
/// parent's rewritten slots are dropped.
pub fn commit_into(
    parent: &Layer,
    child: &Layer,
    parent_is_base: bool,
    cache: Option<&GrainCache>,
) -> io::Result<CommitStats> {
    let grain_bytes = parent.grain_bytes();
    assert_eq!(child.grain_bytes(), grain_bytes, "layers of one pool");
    let grains = child.map().grains();
    if parent.map().grains() != grains {
        parent.resize(grains);
    }
    let entries: Vec<(u64, Entry)> = child.map().iter().collect();
    let mut buf = vec![0u8; grain_bytes as usize];
    let mut stats = CommitStats::default();
    for (g, e) in entries {
        let _first_write = parent.stripe(g);
        let current = parent.map().get(g);
        let commit = match e {
            Entry::Unmapped => continue,
            Entry::Zero => {
                let target = if parent_is_base {
                    Entry::Unmapped
                } else {
                    Entry::Zero
                };
                if current == target {
                    continue;
                }
                stats.zeroed += 1;
                parent.set_entry(g, target)
            }
            Entry::Slot(s) => {
                child.read_slot(s, 0, &mut buf)?;
                stats.copied += 1;
                if let Entry::Slot(ps) = current {
                    // In place: only readers through `child` reach this grain,
                    // and they read the child's copy. Synced by the commit below.
                    parent.write_slot(ps, 0, &buf)?;
                    if let Some(c) = cache {
                        c.invalidate(parent.id, ps);
                    }
                    false
                } else {
                    let slot = parent.allocate()?;
                    if let Err(err) = parent.write_slot(slot, 0, &buf) {
                        parent.release(slot);
                        return Err(err);
                    }
                    if let Some(c) = cache {
                        // A reused slot may still be cached with its old grain.
                        c.invalidate(parent.id, slot);
                    }
                    parent.set_entry(g, Entry::Slot(slot))
                }
            }
        };
        if commit {
            parent.commit()?;
        }
    }
    parent.commit()?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::{Chain, ThinVolume};

    const GRAIN: u64 = 4096;

    fn layer(dir: &Path, id: u64, size: u64) -> Arc<Layer> {
        Arc::new(Layer::open(dir, id, size.div_ceil(GRAIN), GRAIN).unwrap())
    }

    fn view(layers: Vec<Arc<Layer>>, size: u64, cache: Option<Arc<GrainCache>>) -> ThinVolume {
        ThinVolume::new(Chain { layers }, size, false, cache)
    }

    fn read_all(v: &ThinVolume) -> Vec<u8> {
        let mut buf = vec![0u8; v.size() as usize];
        v.read(0, &mut buf).unwrap();
        buf
    }

    /// A base P (every grain written), a frozen child C (overwrites, a zeroed
    /// grain, a trimmed one, a grain P lacks) and a writable top T over C.
    #[test]
    fn committing_up_keeps_every_view_and_the_cache_honest() {
        let dir = tempfile::tempdir().unwrap();
        let size = 8 * GRAIN;
        let cache = Arc::new(GrainCache::new(64 * GRAIN, GRAIN));
        let p = layer(dir.path(), 1, size);
        let v = ThinVolume::new(
            Chain {
                layers: vec![p.clone()],
            },
            size,
            true,
            Some(cache.clone()),
        );
        v.write(0, &vec![1u8; 6 * GRAIN as usize], false).unwrap();
        let frozen_p = v.freeze_top(layer(dir.path(), 2, size)).unwrap();
        assert_eq!(frozen_p.id, 1);
        // Cache P's grains through a view of it (what a snapshot export does).
        let p_view = view(vec![p.clone()], size, Some(cache.clone()));
        let p_before = read_all(&p_view);
        v.write(GRAIN, &vec![2u8; GRAIN as usize], false).unwrap();
        v.write(7 * GRAIN, &[3u8; 100], false).unwrap();
        v.write_zeroes(2 * GRAIN, GRAIN, false).unwrap();
        v.trim(3 * GRAIN, GRAIN, false).unwrap();
        let c = v.freeze_top(layer(dir.path(), 3, size)).unwrap();
        v.write(4 * GRAIN, &[4u8; 10], false).unwrap();
        let t = v.chain().top().clone();
        let c_view = view(vec![c.clone(), p.clone()], size, Some(cache.clone()));
        let (c_before, v_before) = (read_all(&c_view), read_all(&v));
        assert_ne!(c_before, p_before);

        let stats = commit_into(&p, &c, true, Some(&cache)).unwrap();
        assert_eq!(
            stats,
            CommitStats {
                copied: 2,
                zeroed: 2
            }
        );
        // Through C nothing changed, and P alone now reads as C did.
        assert_eq!(read_all(&c_view), c_before);
        assert_eq!(
            read_all(&view(vec![p.clone()], size, Some(cache.clone()))),
            c_before
        );
        // The volume, re-chained over P without C, reads the same.
        v.set_chain(Chain {
            layers: vec![t, p.clone()],
        });
        assert_eq!(read_all(&v), v_before);
        // Idempotent, and durable: P reopened from its files reads the same.
        commit_into(&p, &c, true, Some(&cache)).unwrap();
        let reopened = layer(dir.path(), 1, size);
        assert_eq!(read_all(&view(vec![reopened], size, None)), c_before);
    }

    #[test]
    fn a_grown_child_grows_its_parent_and_zeroes_stay_markers_over_a_grandparent() {
        let dir = tempfile::tempdir().unwrap();
        let (small, big) = (4 * GRAIN, 6 * GRAIN);
        let g = layer(dir.path(), 1, small);
        let gv = ThinVolume::new(
            Chain {
                layers: vec![g.clone()],
            },
            small,
            true,
            None,
        );
        gv.write(0, &vec![9u8; small as usize], false).unwrap();
        gv.freeze_top(layer(dir.path(), 2, small)).unwrap();
        let p = gv.chain().top().clone();
        gv.write(0, &vec![8u8; GRAIN as usize], false).unwrap();
        gv.freeze_top(layer(dir.path(), 3, small)).unwrap();
        let c = gv.chain().top().clone();
        gv.resize(big);
        gv.write_zeroes(GRAIN, GRAIN, false).unwrap();
        gv.write(5 * GRAIN, &vec![7u8; GRAIN as usize], false)
            .unwrap();
        gv.freeze_top(layer(dir.path(), 4, big)).unwrap();
        let before = read_all(&view(vec![c.clone(), p.clone(), g.clone()], big, None));
        commit_into(&p, &c, false, None).unwrap();
        assert_eq!(p.map().grains(), 6);
        assert_eq!(p.map().get(1), Entry::Zero, "a marker over the grandparent");
        assert_eq!(read_all(&view(vec![p, g], big, None)), before);
    }
}
