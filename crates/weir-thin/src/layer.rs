//! One layer of a thin volume: a grain map and a data file of grain-sized slots.
//!
//! On disk a layer is two files in its pool's thin directory:
//! - `<id>.data`: slot `s` holds one grain at byte `s × grain_bytes`;
//! - `<id>.map`: a 4 KiB header, then one little-endian `u32` per grain (0: not
//!   in this layer, `u32::MAX`: zeroes, else slot + 1). The file is sparse: an
//!   untouched range of grains costs nothing and reads as "not in this layer".
//!
//! Crash safety (NBD's contract: what a FLUSH acknowledged survives a crash;
//! nothing else is promised, but a crash never shows another volume's data or a
//! freed grain's): map changes are kept in memory and written only by
//! [`Layer::commit`], which syncs the data file *before* it writes the map
//! entries that point into it (qcow2's data-before-L2 order). A slot freed by an
//! overwrite with zeroes or a trim is reused only after the commit that stops the
//! on-disk map from pointing at it, and is punched (deallocated) first. So the
//! on-disk map only ever points at slots whose data was synced for that grain.
//! Slots are never shared between layers: a layer's data is its own; sharing is
//! the parent chain (a clone reads through to its parent's layer).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::map::{Entry, GrainMap};

const MAGIC: &[u8; 8] = b"WEIRTHN1";
const VERSION: u32 = 1;
/// Bytes before the first map entry.
pub const MAP_HEADER_BYTES: u64 = 4096;
/// Uncommitted map changes that make a write commit on its own (bounds the
/// memory of a client that never flushes: 64 Ki entries ≈ 1 MiB).
pub const AUTO_COMMIT_ENTRIES: usize = 65_536;
const STRIPES: usize = 64;

/// Grain-map changes and free slots not yet committed.
#[derive(Default)]
struct AllocState {
    /// Slots below this exist in the data file (or were handed out).
    next_slot: u32,
    /// Slots free to hand out (no committed map entry points at them).
    free: Vec<u32>,
    /// Grains whose entry changed since the last commit.
    dirty: Vec<u64>,
    /// Slots unmapped since the last commit: free after the next one.
    pending_free: Vec<u32>,
}

struct Files {
    map: File,
    data: File,
}

/// Counters of one layer (bytes moved to and from its data file).
#[derive(Default)]
pub struct LayerCounters {
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub commits: AtomicU64,
}

pub struct Layer {
    pub id: u64,
    grain_bytes: u64,
    dir: PathBuf,
    files: OnceLock<Files>,
    create: Mutex<()>,
    /// Read-only from now on (a snapshot's layer, or a parent): its grains never
    /// change, so the read cache may keep them.
    frozen: AtomicBool,
    map: RwLock<GrainMap>,
    state: Mutex<AllocState>,
    commit_lock: Mutex<()>,
    stripes: Vec<Mutex<()>>,
    pub counters: LayerCounters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn map_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}.map"))
}
pub fn data_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}.data"))
}

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Layer {
    /// Opens layer `id` of `grains` grains in `dir` (files absent: an empty layer,
    /// created at its first allocation).
    pub fn open(dir: &Path, id: u64, grains: u64, grain_bytes: u64) -> io::Result<Layer> {
        assert!(grain_bytes.is_power_of_two() && grain_bytes >= 4096);
        let layer = Layer {
            id,
            grain_bytes,
            dir: dir.to_path_buf(),
            files: OnceLock::new(),
            create: Mutex::new(()),
            frozen: AtomicBool::new(false),
            map: RwLock::new(GrainMap::new(grains)),
            state: Mutex::new(AllocState::default()),
            commit_lock: Mutex::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            counters: LayerCounters::default(),
        };
        let map_file = match OpenOptions::new()
            .read(true)
            .write(true)
            .open(map_path(dir, id))
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(layer),
            Err(e) => return Err(e),
        };
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(data_path(dir, id))?;
        layer.load(&map_file, &data)?;
        let _ = layer.files.set(Files {
            map: map_file,
            data,
        });
        Ok(layer)
    }

    fn load(&self, map_file: &File, data: &File) -> io::Result<()> {
        let len = map_file.metadata()?.len();
        if len < MAP_HEADER_BYTES {
            let data_bytes = data.metadata()?.len();
            if data_bytes > 0 {
                // A map reaches its header's length, durably, before the first
                // data write (`files`): shorter, beside data, it was damaged.
                return Err(corrupt(format!(
                    "layer {}: its grain map {} is {len} bytes, shorter than its header, but its \
                     data file holds {data_bytes} bytes: the map was truncated or replaced, and \
                     the data it placed cannot be found. Restore the map; if the server stopped \
                     before this layer's first FLUSH under a version before session 30, nothing \
                     in it was acknowledged and truncating {} to 0 bytes starts it empty",
                    self.id,
                    map_path(&self.dir, self.id).display(),
                    data_path(&self.dir, self.id).display(),
                )));
            }
            // Created but never written: empty.
            durable_header(map_file, &self.dir, self.id, self.grain_bytes)?;
            return Ok(());
        }
        check_header(map_file, self.id, self.grain_bytes)?;
        let data_slots = data.metadata()?.len().div_ceil(self.grain_bytes);
        let entries = read_entries(map_file, len)?;
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let mut st = lock(&self.state);
        let mut used = vec![false; data_slots as usize];
        for (grain, raw) in entries {
            let e = Entry::from_raw(raw);
            if let Entry::Slot(s) = e {
                let used_s = used.get_mut(s as usize).ok_or_else(|| {
                    corrupt(format!(
                        "layer {}: grain {grain} points at slot {s} beyond the data file ({data_slots} slots)",
                        self.id
                    ))
                })?;
                if *used_s {
                    return Err(corrupt(format!(
                        "layer {}: slot {s} mapped twice (grain {grain})",
                        self.id
                    )));
                }
                *used_s = true;
            }
            if grain >= map.grains() {
                // Beyond the volume's size (a shrink not committed): drop it.
                st.dirty.push(grain);
                if let Entry::Slot(s) = e {
                    st.pending_free.push(s);
                }
                continue;
            }
            map.set(grain, e);
        }
        st.next_slot = data_slots as u32;
        st.free = (0..data_slots as u32)
            .filter(|s| !used[*s as usize])
            .rev()
            .collect();
        Ok(())
    }

    pub fn grain_bytes(&self) -> u64 {
        self.grain_bytes
    }

    /// Whether the layer's two files are open (a new layer opens them at its
    /// first allocation).
    pub fn has_files(&self) -> bool {
        self.files.get().is_some()
    }

    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    pub fn map(&self) -> RwLockReadGuard<'_, GrainMap> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }
    fn map_mut(&self) -> RwLockWriteGuard<'_, GrainMap> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock that serialises first writes (allocation, copy-up) of a grain.
    pub fn stripe(&self, grain: u64) -> MutexGuard<'_, ()> {
        lock(&self.stripes[(grain % STRIPES as u64) as usize])
    }

    fn files(&self) -> io::Result<&Files> {
        if let Some(f) = self.files.get() {
            return Ok(f);
        }
        let _g = lock(&self.create);
        if let Some(f) = self.files.get() {
            return Ok(f);
        }
        let open = |p: PathBuf| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(p)
        };
        let data = open(data_path(&self.dir, self.id))?;
        let map = open(map_path(&self.dir, self.id))?;
        durable_header(&map, &self.dir, self.id, self.grain_bytes)?;
        let _ = self.files.set(Files { map, data });
        Ok(self.files.get().expect("just set"))
    }

    /// Reads `buf.len()` bytes at `offset` within slot `slot`.
    pub fn read_slot(&self, slot: u32, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.grain_bytes);
        let f = &self.files()?.data;
        let at = slot as u64 * self.grain_bytes + offset;
        let mut done = 0;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], at + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.counters
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// [`Self::read_slot`] only if the page cache holds all of it now
    /// (`RWF_NOWAIT`); `Ok(false)`: it would block (nothing is counted).
    pub fn read_slot_nowait(&self, slot: u32, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        let Some(files) = self.files.get() else {
            return Ok(false);
        };
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let at = slot as u64 * self.grain_bytes + offset;
        // SAFETY: one iovec over `buf`, which outlives the call; the fd is ours.
        let n = unsafe {
            libc::preadv2(
                files.data.as_raw_fd(),
                &iov,
                1,
                at as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 || n as usize != buf.len() {
            return Ok(false);
        }
        self.counters
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    pub fn write_slot(&self, slot: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        debug_assert!(offset + data.len() as u64 <= self.grain_bytes);
        let f = &self.files()?.data;
        f.write_all_at(data, slot as u64 * self.grain_bytes + offset)?;
        self.counters
            .written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A slot no committed map entry points at.
    pub fn allocate(&self) -> io::Result<u32> {
        let mut st = lock(&self.state);
        if let Some(s) = st.free.pop() {
            return Ok(s);
        }
        if st.next_slot >= u32::MAX - 2 {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "layer full"));
        }
        st.next_slot += 1;
        Ok(st.next_slot - 1)
    }

    /// Returns a slot that was allocated but never mapped (a failed write).
    pub fn release(&self, slot: u32) {
        lock(&self.state).free.push(slot);
    }

    /// Sets a grain's entry (its data, for a slot, already written). Returns true
    /// when enough changes wait that the caller should commit.
    pub fn set_entry(&self, grain: u64, entry: Entry) -> bool {
        let old = self.map_mut().set(grain, entry);
        let mut st = lock(&self.state);
        st.dirty.push(grain);
        if let Entry::Slot(s) = old
            && old != entry
        {
            st.pending_free.push(s);
        }
        st.dirty.len() >= AUTO_COMMIT_ENTRIES
    }

    /// Grows or shrinks the layer's grain count (slots of dropped grains are freed
    /// at the next commit).
    pub fn resize(&self, grains: u64) {
        let mut map = self.map_mut();
        let old = map.grains();
        let dropped = map.resize(grains);
        let mut st = lock(&self.state);
        st.dirty.extend(grains..old);
        st.pending_free
            .extend(dropped.into_iter().filter_map(|e| match e {
                Entry::Slot(s) => Some(s),
                _ => None,
            }));
    }

    /// Makes every write completed so far and the map that points at it durable.
    pub fn commit(&self) -> io::Result<()> {
        let _c = lock(&self.commit_lock);
        let (dirty, pending) = {
            let map = self.map();
            let mut st = lock(&self.state);
            let mut grains = std::mem::take(&mut st.dirty);
            grains.sort_unstable();
            grains.dedup();
            let dirty: Vec<(u64, u32)> =
                grains.into_iter().map(|g| (g, map.get(g).raw())).collect();
            (dirty, std::mem::take(&mut st.pending_free))
        };
        if self.files.get().is_none() && dirty.iter().all(|(_, e)| *e == 0) {
            return Ok(()); // never written, nothing marked: nothing to store
        }
        let mut r = self
            .files()
            .and_then(|files| self.write_commit(files, &dirty, &pending));
        if let (Err(e), Some(files)) = (&r, self.files.get())
            && e.raw_os_error() == Some(libc::ENOSPC)
            && !pending.is_empty()
        {
            // A full file system, and this commit frees slots (trims, zeroes):
            // punched now, the space they give back lets the map be written, so a
            // pool filled to the last block recovers by TRIM (a guest's fstrim).
            // Safe before the commit: they are not reused until it succeeds, and
            // the grains the on-disk map may still point at them for were trimmed
            // or zeroed, which may read as zeroes.
            for &s in &pending {
                self.punch(files, s);
            }
            r = self.write_commit(files, &dirty, &pending);
        }
        if r.is_err() {
            // Nothing is lost: the changes go back to wait for the next commit.
            let mut st = lock(&self.state);
            st.dirty.extend(dirty.iter().map(|(g, _)| *g));
            st.pending_free.extend(pending);
            return r;
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        let files = self.files.get().expect("committed");
        for &s in &pending {
            self.punch(files, s);
        }
        lock(&self.state).free.extend(pending);
        Ok(())
    }

    fn write_commit(&self, files: &Files, dirty: &[(u64, u32)], pending: &[u32]) -> io::Result<()> {
        files.data.sync_data()?;
        if !dirty.is_empty() {
            write_entries(&files.map, dirty)?;
            files.map.sync_data()?;
        }
        debug_assert!(
            pending
                .iter()
                .all(|s| !dirty.iter().any(|(_, e)| *e == s + 1))
        );
        Ok(())
    }

    /// Deallocates a free slot's blocks (space goes back to the file system, and
    /// a slot handed out again reads zeroes until written).
    fn punch(&self, files: &Files, slot: u32) {
        // SAFETY: fallocate on a descriptor we own; no memory is passed.
        let r = unsafe {
            libc::fallocate(
                files.data.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (slot as u64 * self.grain_bytes) as libc::off_t,
                self.grain_bytes as libc::off_t,
            )
        };
        // Not fatal (a file system without hole punching keeps the blocks): the
        // slot is unreferenced either way and is rewritten whole before it is
        // mapped again.
        let _ = r;
    }

    /// Uncommitted map changes.
    pub fn dirty_entries(&self) -> usize {
        lock(&self.state).dirty.len()
    }

    /// Bytes of grains stored in this layer.
    pub fn stored_bytes(&self) -> u64 {
        self.map().stored() * self.grain_bytes
    }

    /// Removes the layer's files (the caller has dropped every reference).
    pub fn remove_files(dir: &Path, id: u64) -> io::Result<()> {
        for p in [map_path(dir, id), data_path(dir, id)] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The header, the map at its header's length and its directory entry, all
/// on disk before the layer's first data write: from then on a map shorter than
/// its header beside a non-empty data file is damage, not a crash ([`Layer::load`]).
fn durable_header(f: &File, dir: &Path, id: u64, grain_bytes: u64) -> io::Result<()> {
    write_header(f, id, grain_bytes)?;
    if f.metadata()?.len() < MAP_HEADER_BYTES {
        f.set_len(MAP_HEADER_BYTES)?;
    }
    f.sync_data()?;
    File::open(dir)?.sync_all()
}

fn write_header(f: &File, id: u64, grain_bytes: u64) -> io::Result<()> {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(grain_bytes as u32).to_le_bytes());
    h[16..24].copy_from_slice(&id.to_le_bytes());
    f.write_all_at(&h, 0)
}

fn check_header(f: &File, id: u64, grain_bytes: u64) -> io::Result<()> {
    let mut h = [0u8; 32];
    f.read_exact_at(&mut h, 0)?;
    if &h[..8] != MAGIC {
        return Err(corrupt(format!("layer {id}: not a Weir grain map")));
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    let grain = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")) as u64;
    let file_id = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    if version != VERSION || grain != grain_bytes || file_id != id {
        return Err(corrupt(format!(
            "layer {id}: map header says version {version}, grain {grain} B, layer {file_id} \
             (expected {VERSION}, {grain_bytes} B, {id})"
        )));
    }
    Ok(())
}

/// `lseek(SEEK_DATA / SEEK_HOLE)`; `None` past the last data.
fn seek(f: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek on a descriptor we own; all other I/O here is positional.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Every non-zero entry of a map file, skipping holes.
fn read_entries(f: &File, len: u64) -> io::Result<Vec<(u64, u32)>> {
    let mut out = Vec::new();
    let mut pos = MAP_HEADER_BYTES;
    let mut buf = vec![0u8; 1 << 20];
    while pos < len {
        let Some(start) = seek(f, pos, libc::SEEK_DATA)? else {
            break;
        };
        let start = start.max(MAP_HEADER_BYTES) & !3;
        let end = seek(f, start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len()) & !3;
            if n == 0 {
                break;
            }
            f.read_exact_at(&mut buf[..n], at)?;
            for (i, c) in buf[..n].chunks_exact(4).enumerate() {
                let raw = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                if raw != 0 {
                    out.push(((at - MAP_HEADER_BYTES) / 4 + i as u64, raw));
                }
            }
            at += n as u64;
        }
        pos = end.max(start + 4);
    }
    Ok(out)
}

/// Writes sorted `(grain, raw)` entries, one `pwrite` per run of consecutive grains.
fn write_entries(f: &File, dirty: &[(u64, u32)]) -> io::Result<()> {
    let mut run: Vec<u8> = Vec::new();
    let mut run_start = 0;
    let mut prev: Option<u64> = None;
    for &(g, raw) in dirty {
        if prev.is_some_and(|p| p + 1 != g) {
            f.write_all_at(&run, MAP_HEADER_BYTES + run_start * 4)?;
            run.clear();
        }
        if run.is_empty() {
            run_start = g;
        }
        run.extend_from_slice(&raw.to_le_bytes());
        prev = Some(g);
    }
    if !run.is_empty() {
        f.write_all_at(&run, MAP_HEADER_BYTES + run_start * 4)?;
    }
    Ok(())
}
