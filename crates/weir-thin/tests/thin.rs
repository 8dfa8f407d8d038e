//! Thin volumes against a byte-array model: reads, copy-up, zeroes, trims,
//! snapshots, clones, merge/flatten and reopen after a crash (files as the last
//! commit left them, plus whatever writes reached the data files since).

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use weir_thin::check::{LayerInfo, check};
use weir_thin::{Chain, GrainCache, Layer, ThinVolume, merge_into};

const GRAIN: u64 = 4096;

fn layer(dir: &Path, id: u64, size: u64) -> Arc<Layer> {
    Arc::new(Layer::open(dir, id, size.div_ceil(GRAIN), GRAIN).unwrap())
}

fn volume(layers: Vec<Arc<Layer>>, size: u64) -> ThinVolume {
    ThinVolume::new(Chain { layers }, size, true, None)
}

fn read_all(v: &ThinVolume) -> Vec<u8> {
    let mut buf = vec![0u8; v.size() as usize];
    v.read(0, &mut buf).unwrap();
    buf
}

#[test]
fn copy_up_keeps_the_parents_bytes_and_snapshots_stay_put() {
    let dir = tempfile::tempdir().unwrap();
    let size = 10 * GRAIN;
    let base = layer(dir.path(), 1, size);
    let v = volume(vec![base.clone()], size);
    let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    v.write(0, &pattern, false).unwrap();
    // Snapshot: layer 1 frozen, layer 2 on top.
    let frozen = v.freeze_top(layer(dir.path(), 2, size)).unwrap();
    assert_eq!(frozen.id, 1);
    assert!(frozen.is_frozen());
    // A 100-byte write in the middle of grain 3 copies the grain up.
    v.write(3 * GRAIN + 50, &[0xAA; 100], false).unwrap();
    let mut expect = pattern.clone();
    expect[(3 * GRAIN + 50) as usize..(3 * GRAIN + 150) as usize].fill(0xAA);
    assert_eq!(read_all(&v), expect);
    // The snapshot's view is unchanged; a clone of it reads it and writes apart.
    let snap = ThinVolume::new(
        Chain {
            layers: vec![frozen.clone()],
        },
        size,
        false,
        None,
    );
    assert_eq!(read_all(&snap), pattern);
    assert!(
        snap.write(0, &[1], false).is_err(),
        "a snapshot is read-only"
    );
    let clone = volume(vec![layer(dir.path(), 3, size), frozen.clone()], size);
    clone.write_zeroes(GRAIN, 2 * GRAIN, false).unwrap();
    let mut cexp = pattern.clone();
    cexp[GRAIN as usize..3 * GRAIN as usize].fill(0);
    assert_eq!(read_all(&clone), cexp);
    assert_eq!(read_all(&v), expect, "a clone's writes stay in the clone");
    // Block status: the clone's zeroed grains read as holes.
    let ext = clone.block_status(0, size, 100).unwrap();
    let lens: Vec<(u64, bool)> = ext.iter().map(|e| (e.length, e.allocated)).collect();
    assert_eq!(
        lens,
        vec![(GRAIN, true), (2 * GRAIN, false), (7 * GRAIN, true)]
    );
}

#[test]
fn committed_state_survives_reopen_and_uncommitted_allocations_are_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let size = 8 * GRAIN;
    {
        let v = volume(vec![layer(dir.path(), 1, size)], size);
        v.write(0, &vec![7u8; 2 * GRAIN as usize], false).unwrap();
        v.flush().unwrap();
        // Not flushed: a new grain (its map entry never reaches the disk).
        v.write(5 * GRAIN, &vec![9u8; GRAIN as usize], false)
            .unwrap();
    }
    let l = layer(dir.path(), 1, size);
    let v = volume(vec![l.clone()], size);
    let got = read_all(&v);
    assert!(got[..2 * GRAIN as usize].iter().all(|b| *b == 7));
    assert!(
        got[2 * GRAIN as usize..].iter().all(|b| *b == 0),
        "an unflushed grain is gone"
    );
    // The orphaned slot is reused instead of growing the file.
    v.write(6 * GRAIN, &vec![3u8; GRAIN as usize], false)
        .unwrap();
    v.flush().unwrap();
    let data_len = std::fs::metadata(dir.path().join("1.data")).unwrap().len();
    assert_eq!(data_len, 3 * GRAIN, "slots 0, 1 and the reused 2");
    let r = check(
        dir.path(),
        &[LayerInfo {
            id: 1,
            parent: None,
            grains: 8,
        }],
        GRAIN,
    );
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.stored_grains, 3);
}

/// A grain map cut shorter than its header beside a data file that holds
/// slots is refused (session 30: read as an empty layer, the volume served its
/// snapshot's older bytes and the next write reused the lost data's slot); a
/// layer written but never flushed before a crash opens empty, as before.
#[test]
fn a_truncated_map_is_refused_and_an_unflushed_layer_opens_empty() {
    let dir = tempfile::tempdir().unwrap();
    let size = 4 * GRAIN;
    {
        let v = volume(vec![layer(dir.path(), 1, size)], size);
        v.write(0, &vec![0x22; GRAIN as usize], false).unwrap();
        v.flush().unwrap();
    }
    let map = dir.path().join("1.map");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&map)
        .unwrap()
        .set_len(100)
        .unwrap();
    let e = Layer::open(dir.path(), 1, 4, GRAIN).err().expect("opened");
    assert!(e.to_string().contains("truncated or replaced"), "{e}");
    // Written, never flushed, then a crash: nothing acknowledged, empty.
    {
        let v = volume(vec![layer(dir.path(), 2, size)], size);
        v.write(0, &vec![0x33; GRAIN as usize], false).unwrap();
    }
    assert!(std::fs::metadata(dir.path().join("2.data")).unwrap().len() > 0);
    let v = volume(vec![layer(dir.path(), 2, size)], size);
    assert!(read_all(&v).iter().all(|b| *b == 0));
}

#[test]
fn merge_and_flatten_preserve_what_a_clone_reads() {
    let dir = tempfile::tempdir().unwrap();
    let size = 6 * GRAIN;
    let v = volume(vec![layer(dir.path(), 1, size)], size);
    v.write(0, &vec![1u8; size as usize], false).unwrap();
    let l1 = v.freeze_top(layer(dir.path(), 2, size)).unwrap();
    v.write(GRAIN, &vec![2u8; GRAIN as usize], false).unwrap();
    v.trim(2 * GRAIN, GRAIN, false).unwrap();
    let l2 = v.freeze_top(layer(dir.path(), 3, size)).unwrap();
    let clone = volume(
        vec![layer(dir.path(), 4, size), l2.clone(), l1.clone()],
        size,
    );
    clone.write(4 * GRAIN, &[5u8; 10], false).unwrap();
    let before = read_all(&clone);
    // Flatten: everything it reads from below is copied into its own top.
    let top = clone.chain().top().clone();
    for below in [&l2, &l1] {
        merge_into(&top, below).unwrap();
    }
    clone.set_chain(Chain {
        layers: vec![top.clone()],
    });
    assert_eq!(read_all(&clone), before);
    // Merge snapshot l2 into the volume's top, then drop it from the chain.
    let vbefore = read_all(&v);
    let vtop = v.chain().top().clone();
    merge_into(&vtop, &l2).unwrap();
    v.set_chain(Chain {
        layers: vec![vtop, l1.clone()],
    });
    assert_eq!(read_all(&v), vbefore);
}

#[test]
fn a_boot_storm_reads_each_shared_grain_once() {
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * GRAIN;
    let image = volume(vec![layer(dir.path(), 1, size)], size);
    image.write(0, &vec![0x5A; size as usize], false).unwrap();
    let golden = image.freeze_top(layer(dir.path(), 2, size)).unwrap();
    let cache = Arc::new(GrainCache::new(size, GRAIN));
    let clones: Vec<Arc<ThinVolume>> = (0..16)
        .map(|i| {
            Arc::new(ThinVolume::new(
                Chain {
                    layers: vec![layer(dir.path(), 10 + i, size), golden.clone()],
                },
                size,
                true,
                Some(cache.clone()),
            ))
        })
        .collect();
    let before = golden
        .counters
        .read_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    std::thread::scope(|s| {
        for c in &clones {
            s.spawn(move || {
                let mut buf = vec![0u8; 512];
                for g in 0..64 {
                    c.read(g * GRAIN + 512, &mut buf).unwrap();
                    assert!(buf.iter().all(|b| *b == 0x5A));
                }
            });
        }
    });
    let read = golden
        .counters
        .read_bytes
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    // Each golden grain is read whole once (its second partial miss fills the
    // cache), plus the 512-byte parts first misses read directly (one a grain;
    // a few more when first misses race).
    assert!(
        read >= size + 64 * 512 && read <= size + 4 * 64 * 512,
        "{read} bytes for a {size}-byte image"
    );
    let st = cache.stats();
    assert_eq!(st.resident, 64);
    assert!(st.hits + st.merged >= 13 * 64, "{st:?}");
}

#[derive(Clone, Debug)]
enum Op {
    Write { off: u64, len: u64, byte: u8 },
    Zeroes { off: u64, len: u64 },
    Trim { off: u64, len: u64 },
    Flush,
    Snapshot,
    Crash,
}

const SIZE: u64 = 16 * GRAIN;

fn op() -> impl Strategy<Value = Op> {
    let range = (0..SIZE).prop_flat_map(|off| (Just(off), 1..=(SIZE - off).min(3 * GRAIN)));
    prop_oneof![
        4 => (range.clone(), any::<u8>()).prop_map(|((off, len), byte)| Op::Write { off, len, byte }),
        1 => range.clone().prop_map(|(off, len)| Op::Zeroes { off, len }),
        1 => range.prop_map(|(off, len)| Op::Trim { off, len }),
        1 => Just(Op::Flush),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Crash),
    ]
}

/// A snapshot: its frozen layer, the layers below it, its bytes.
type Snapshot = (Arc<Layer>, Vec<Arc<Layer>>, Vec<u8>);

/// The model: the volume's bytes, and per grain every state it had since the
/// last flush (what a crash may leave).
struct Model {
    bytes: Vec<u8>,
    since_flush: Vec<Vec<Vec<u8>>>,
    snapshots: Vec<Snapshot>,
}

impl Model {
    fn grain(&self, g: u64) -> Vec<u8> {
        self.bytes[(g * GRAIN) as usize..((g + 1) * GRAIN) as usize].to_vec()
    }
    fn apply(&mut self, off: u64, len: u64, f: impl Fn(&mut [u8])) {
        f(&mut self.bytes[off as usize..(off + len) as usize]);
        for g in off / GRAIN..(off + len).div_ceil(GRAIN) {
            let now = self.grain(g);
            self.since_flush[g as usize].push(now);
        }
    }
    fn flushed(&mut self) {
        for g in 0..SIZE / GRAIN {
            self.since_flush[g as usize] = vec![self.grain(g)];
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn thin_volume_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut next_id = 1;
        let mut layers = vec![layer(dir.path(), next_id, SIZE)];
        let mut v = volume(layers.clone(), SIZE);
        let mut m = Model {
            bytes: vec![0; SIZE as usize],
            since_flush: vec![vec![vec![0; GRAIN as usize]]; (SIZE / GRAIN) as usize],
            snapshots: Vec::new(),
        };
        for op in ops {
            match op {
                Op::Write { off, len, byte } => {
                    // Odd bytes try the inline path (owned grains only) first.
                    let data = vec![byte; len as usize];
                    if byte % 2 == 0 || !v.write_owned(off, &data).unwrap() {
                        v.write(off, &data, false).unwrap();
                    }
                    m.apply(off, len, |b| b.fill(byte));
                }
                Op::Zeroes { off, len } => {
                    v.write_zeroes(off, len, false).unwrap();
                    m.apply(off, len, |b| b.fill(0));
                }
                Op::Trim { off, len } => {
                    v.trim(off, len, false).unwrap();
                    let (a, b) = (off.div_ceil(GRAIN) * GRAIN, (off + len) / GRAIN * GRAIN);
                    if b > a {
                        m.apply(a, b - a, |x| x.fill(0));
                    }
                }
                Op::Flush => {
                    v.flush().unwrap();
                    m.flushed();
                }
                Op::Snapshot => {
                    next_id += 1;
                    let frozen = v.freeze_top(layer(dir.path(), next_id, SIZE)).unwrap();
                    layers = v.chain().layers.clone();
                    let below = layers[1..].to_vec();
                    m.snapshots.push((frozen, below, m.bytes.clone()));
                    m.flushed();
                }
                Op::Crash => {
                    drop(v);
                    let ids: Vec<u64> = layers.iter().map(|l| l.id).collect();
                    layers = ids.iter().map(|id| layer(dir.path(), *id, SIZE)).collect();
                    v = volume(layers.clone(), SIZE);
                    // Snapshot layers were committed when frozen: reopened ones match.
                    let got = read_all(&v);
                    for g in 0..SIZE / GRAIN {
                        let part = &got[(g * GRAIN) as usize..((g + 1) * GRAIN) as usize];
                        prop_assert!(
                            m.since_flush[g as usize].iter().any(|s| s == part),
                            "grain {} after a crash is no state it had since the last flush", g
                        );
                    }
                    m.bytes = got;
                    m.flushed();
                    for s in &mut m.snapshots {
                        let reopened: Vec<Arc<Layer>> = std::iter::once(&s.0)
                            .chain(s.1.iter())
                            .map(|l| layers.iter().find(|x| x.id == l.id).cloned()
                                .unwrap_or_else(|| layer(dir.path(), l.id, SIZE)))
                            .collect();
                        s.0 = reopened[0].clone();
                        s.1 = reopened[1..].to_vec();
                    }
                }
            }
            prop_assert_eq!(read_all(&v), m.bytes.clone());
            let mut inline = vec![0u8; SIZE as usize];
            if v.read_nowait(0, &mut inline).unwrap() {
                prop_assert_eq!(&inline, &m.bytes);
            }
        }
        for (top, below, bytes) in &m.snapshots {
            let chain: Vec<Arc<Layer>> = std::iter::once(top.clone()).chain(below.iter().cloned()).collect();
            let snap = ThinVolume::new(Chain { layers: chain }, SIZE, false, None);
            prop_assert_eq!(&read_all(&snap), bytes);
        }
        v.flush().unwrap();
        let infos: Vec<LayerInfo> = layers.iter().enumerate().map(|(i, l)| LayerInfo {
            id: l.id,
            parent: layers.get(i + 1).map(|p| p.id),
            grains: SIZE / GRAIN,
        }).collect();
        let r = check(dir.path(), &infos, GRAIN);
        prop_assert!(r.ok(), "{r:?}");
    }
}
