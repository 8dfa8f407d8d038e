//! The backend layer chain: where a validated, QoS-released request meets
//! storage. A [`Backend`] is blocking (it runs on tokio's blocking pool);
//! layers wrap another backend, as nbdkit filters do, over a bottom backend
//! (this file's [`FileBackend`], `crate::thin`, `crate::upstream`). The order
//! of the stack and where it is built: `crate::stack`.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;

use weir_nbd::Extent;
use weir_nbd::consts::{STATE_HOLE, STATE_ZERO};

/// A READ or WRITE started with [`Backend::start_async`].
pub enum AsyncOp {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        data: WriteData,
        fua: bool,
    },
}

/// A WRITE's data, shared with its request: a backend may keep it until the op
/// completes and hand its bytes to a library that reads them meanwhile (librbd's
/// AIO write does, without a copy of ours: one 1 MiB memcpy was 14 % of the
/// server's CPU per 1 MiB write). Immutable: nothing changes the bytes while
/// anyone holds it.
#[derive(Clone)]
pub struct WriteData(std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>);

impl WriteData {
    pub fn new(owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>) -> WriteData {
        WriteData(owner)
    }

    pub fn bytes(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// Called once when an [`AsyncOp`] is done, inside the tokio runtime: the READ's
/// data (empty for a WRITE), the error, or `None`: perform it the blocking way
/// now (the backend could not finish it asynchronously, e.g. its connection
/// broke; the blocking call retries).
pub type AsyncDone = Box<dyn FnOnce(Option<io::Result<Vec<u8>>>) + Send>;

/// Whether a cache above a backend may keep what it reads from it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Nobody else writes this data while `generation` stays the same; a new
    /// generation means it may have changed meanwhile (drop what was kept).
    Exclusive { generation: u64 },
    /// Not now (another client may be writing it): read through, keep nothing.
    Unsure,
}

/// Storage operations on one volume. Offsets and lengths are already validated
/// against the volume size.
pub trait Backend: Send + Sync + 'static {
    /// Whether a cache above may keep this volume's data: a local file is the
    /// server's alone (the default); an upstream export only under its lease.
    /// Layers forward it.
    fn ownership(&self) -> Ownership {
        Ownership::Exclusive { generation: 0 }
    }
    /// [`Self::ownership`], for a caller that may block: where the answer is
    /// only unsure because nothing confirmed the lease lately (an idle volume),
    /// it is confirmed first with one round trip. Layers forward it.
    fn confirm_ownership(&self) -> Ownership {
        self.ownership()
    }
    /// Starts a READ or WRITE that another thread completes (an upstream NBD
    /// server's reply), with no blocking thread waiting for it; `Err(done)`: not
    /// possible here (use the blocking calls). Layers that must see every I/O do
    /// not forward it.
    fn start_async(&self, _op: AsyncOp, done: AsyncDone) -> Result<(), AsyncDone> {
        Err(done)
    }
    /// Fills `buf` from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// A write that is durable when it returns (NBD FUA): by default a write,
    /// then a flush; a backend that can do better (an upstream NBD server
    /// advertising FUA) overrides it.
    fn write_fua(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write(offset, data)?;
        self.flush()
    }
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Tries a read that never blocks (served from the page cache); `Ok(false)`:
    /// it would block, call [`Backend::read`] on a blocking thread instead.
    fn read_nowait(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<bool> {
        Ok(false)
    }
    /// Tries a write without a blocking-thread hand-off (`RWF_NOWAIT`, or a plain
    /// page-cache write where the file system lacks it); `Ok(false)`: use
    /// [`Backend::write`].
    fn write_nowait(&self, _offset: u64, _data: &[u8]) -> io::Result<bool> {
        Ok(false)
    }
    /// A descriptor the range can be sent from with `sendfile(2)` (zero copy),
    /// when every page of it is in the page cache now (so sending it does not
    /// wait for a disk); `None`: read it into memory.
    fn cached_source(&self, _offset: u64, _length: u64) -> Option<RawFd> {
        None
    }
    /// Discards a range (advisory: may do nothing).
    fn trim(&self, offset: u64, length: u64) -> io::Result<()>;
    /// Zeroes a range; `may_punch`: holes are allowed. `fast_only`: fail with
    /// `ErrorKind::Unsupported` rather than fall back to writing zeroes.
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> io::Result<()>;
    /// Allocation status from `offset`, covering at least one byte.
    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>>;
    /// Prefetch hint.
    fn cache(&self, offset: u64, length: u64) -> io::Result<()>;
}

/// Reads of one file that must not wait for a device. `preadv2(RWF_NOWAIT)`
/// where the file system takes the flag. Where it refuses it (`EOPNOTSUPP`:
/// tmpfs, as of Linux 6.18), a file in memory (tmpfs, ramfs) is read with a plain
/// `pread` — its pages are memory, with nothing to wait for but swap — and any
/// other file is never read inline, without a futile system call per read.
/// Without this every READ of a tmpfs volume took the blocking pool's hand-off:
/// twice the server CPU of nbdkit per 4 KiB read.
pub(crate) struct NowaitReads {
    mode: std::sync::atomic::AtomicU8,
}

const NOWAIT_FLAG: u8 = 0;
const NOWAIT_IN_MEMORY: u8 = 1;
const NOWAIT_NEVER: u8 = 2;

impl NowaitReads {
    pub(crate) fn new() -> NowaitReads {
        NowaitReads {
            mode: std::sync::atomic::AtomicU8::new(NOWAIT_FLAG),
        }
    }

    /// Reads `buf` at `offset` only if all of it is in memory now. Short reads
    /// (part not cached, or end of file) and EAGAIN give `false`: redo the whole
    /// read the blocking way (reads are idempotent).
    pub(crate) fn read(&self, file: &File, buf: &mut [u8], offset: u64) -> bool {
        use std::sync::atomic::Ordering;
        match self.mode.load(Ordering::Relaxed) {
            NOWAIT_FLAG => match preadv2(file, buf, offset, libc::RWF_NOWAIT) {
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    let mode = if in_memory(file) {
                        NOWAIT_IN_MEMORY
                    } else {
                        NOWAIT_NEVER
                    };
                    self.mode.store(mode, Ordering::Relaxed);
                    self.read(file, buf, offset)
                }
                r => r.is_ok_and(|n| n == buf.len()),
            },
            NOWAIT_IN_MEMORY => preadv2(file, buf, offset, 0).is_ok_and(|n| n == buf.len()),
            _ => false,
        }
    }
}

fn preadv2(file: &File, buf: &mut [u8], offset: u64, flags: libc::c_int) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over `buf`, which outlives the call; the descriptor is
    // the caller's open file.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset as libc::off_t, flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// ramfs's `f_type` (linux/magic.h; not in the libc crate).
const RAMFS_MAGIC: libc::__fsword_t = 0x858458f6;

/// Whether `file` lives on a memory file system (tmpfs, ramfs): its reads never
/// wait for a device.
fn in_memory(file: &File) -> bool {
    // SAFETY: fstatfs fills the zeroed struct it is given; the descriptor is ours.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    r == 0 && matches!(st.f_type, libc::TMPFS_MAGIC | RAMFS_MAGIC)
}

/// A volume as a sparse file, with positional I/O (many requests in flight on
/// one shared descriptor), so FLUSH on any connection covers every connection's
/// writes (what `NBD_FLAG_CAN_MULTI_CONN` promises).
pub struct FileBackend {
    file: File,
    /// A second descriptor on the same file opened `O_DIRECT` (pool option
    /// `direct_io`): aligned READ/WRITE go through it, bypassing the page cache.
    direct: Option<File>,
    /// Cleared when the file system refuses `RWF_NOWAIT` buffered writes (ext4
    /// today): small writes then go to the page cache inline with plain `pwrite`.
    nowait_writes: std::sync::atomic::AtomicBool,
    nowait_reads: NowaitReads,
    /// Cleared when the kernel lacks `cachestat(2)` (before Linux 6.5): no zero copy.
    cachestat: std::sync::atomic::AtomicBool,
}

/// `cachestat(2)`: the same number on every Linux architecture (the unified
/// numbering of new system calls); not in the libc crate for every target yet.
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// The page-cache page size.
fn page_bytes() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    })
}

/// Offset, length and buffer alignment `O_DIRECT` needs here.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// A zeroed heap buffer aligned for `O_DIRECT`.
struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> io::Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), DIRECT_IO_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "aligned buffer"));
        }
        Ok(AlignedBuf { ptr, layout })
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

fn is_aligned(offset: u64, len: usize) -> bool {
    len > 0 && offset.is_multiple_of(DIRECT_IO_ALIGN as u64) && len.is_multiple_of(DIRECT_IO_ALIGN)
}

/// Most extents one BLOCK_STATUS reply carries.
const MAX_EXTENTS: usize = 1024;

impl FileBackend {
    pub fn new(file: File) -> FileBackend {
        FileBackend {
            file,
            direct: None,
            nowait_writes: std::sync::atomic::AtomicBool::new(true),
            nowait_reads: NowaitReads::new(),
            cachestat: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// With an `O_DIRECT` descriptor of the same file for aligned requests.
    pub fn with_direct(file: File, direct: File) -> FileBackend {
        FileBackend {
            file,
            direct: Some(direct),
            nowait_writes: std::sync::atomic::AtomicBool::new(true),
            nowait_reads: NowaitReads::new(),
            cachestat: std::sync::atomic::AtomicBool::new(true),
        }
    }

    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }
    pub fn file(&self) -> &File {
        &self.file
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, length: u64) -> io::Result<()> {
        // SAFETY: plain syscall on a descriptor we own; no memory is passed.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                length as libc::off_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor we own. SEEK_DATA/SEEK_HOLE move the shared
        // file offset, which no other operation here uses (all I/O is positional).
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
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

    fn write_zero_bytes(&self, offset: u64, length: u64) -> io::Result<()> {
        let zeroes = vec![0u8; length.min(1 << 20) as usize];
        let mut done = 0;
        while done < length {
            let n = (length - done).min(zeroes.len() as u64) as usize;
            self.file.write_all_at(&zeroes[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Backend for FileBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if let Some(direct) = &self.direct
            && is_aligned(offset, buf.len())
        {
            let mut bounce = AlignedBuf::new(buf.len())?;
            let b = bounce.as_mut_slice();
            let mut done = 0;
            while done < b.len() {
                match direct.read_at(&mut b[done..], offset + done as u64) {
                    Ok(0) => break, // past the end: zeroes (the buffer is zeroed)
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            buf.copy_from_slice(b);
            return Ok(());
        }
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    // Past the end of the file (cannot happen for a sized volume): zeroes.
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some(direct) = &self.direct
            && is_aligned(offset, data.len())
        {
            let mut bounce = AlignedBuf::new(data.len())?;
            bounce.as_mut_slice().copy_from_slice(data);
            return direct.write_all_at(bounce.as_mut_slice(), offset);
        }
        self.file.write_all_at(data, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        if self.direct.is_some() || buf.is_empty() {
            return Ok(false);
        }
        Ok(self.nowait_reads.read(&self.file, buf, offset))
    }

    fn write_nowait(&self, offset: u64, data: &[u8]) -> io::Result<bool> {
        use std::sync::atomic::Ordering;
        if self.direct.is_some() || data.is_empty() {
            return Ok(false);
        }
        if !self.nowait_writes.load(Ordering::Relaxed) {
            // A buffered write is a page-cache copy; it blocks only under dirty-page
            // throttling, which the caller accepts for small writes.
            return self.file.write_all_at(data, offset).map(|()| true);
        }
        let iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: one iovec over `data` (only read by the kernel); fd is ours.
        let n = unsafe {
            libc::pwritev2(
                self.file.as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
            self.nowait_writes.store(false, Ordering::Relaxed);
            return self.file.write_all_at(data, offset).map(|()| true);
        }
        // A short write is completed (rewriting the same bytes is harmless) by the
        // blocking path.
        Ok(n >= 0 && n as usize == data.len())
    }

    fn cached_source(&self, offset: u64, length: u64) -> Option<RawFd> {
        use std::sync::atomic::Ordering;
        if self.direct.is_some() || length == 0 || !self.cachestat.load(Ordering::Relaxed) {
            return None;
        }
        let range = CachestatRange {
            off: offset,
            len: length,
        };
        let mut stat = Cachestat::default();
        // SAFETY: cachestat(fd, range, stat, flags) reads `range` and writes `stat`,
        // both live #[repr(C)] values of the kernel's layout; fd is ours.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                self.file.as_raw_fd(),
                &range as *const CachestatRange,
                &mut stat as *mut Cachestat,
                0u32,
            )
        };
        if r != 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                self.cachestat.store(false, Ordering::Relaxed);
            }
            return None;
        }
        let page = page_bytes();
        let pages = (offset + length).div_ceil(page) - offset / page;
        (stat.nr_cache >= pages).then(|| self.file.as_raw_fd())
    }

    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            length,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()), // advisory
            r => r,
        }
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> io::Result<()> {
        if length == 0 {
            return Ok(());
        }
        if may_punch
            && self
                .fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    length,
                )
                .is_ok()
        {
            return Ok(());
        }
        if self
            .fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                length,
            )
            .is_ok()
        {
            return Ok(());
        }
        if fast_only {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        self.write_zero_bytes(offset, length)
    }

    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let end = offset + length;
        let mut extents = Vec::new();
        let mut pos = offset;
        let push = |extents: &mut Vec<Extent>, from: u64, to: u64, flags: u32| {
            let mut from = from;
            while from < to {
                let n = (to - from).min(u32::MAX as u64 & !4095);
                extents.push(Extent {
                    length: n as u32,
                    flags,
                });
                from += n;
            }
        };
        while pos < end && extents.len() < MAX_EXTENTS {
            let data = match self.seek(pos, libc::SEEK_DATA) {
                Ok(d) => d,
                // File system without SEEK_DATA: report everything allocated (status 0 is always safe).
                Err(_) if extents.is_empty() => {
                    push(&mut extents, pos, end, 0);
                    break;
                }
                Err(e) => return Err(e),
            };
            match data {
                None => {
                    push(&mut extents, pos, end, STATE_HOLE | STATE_ZERO);
                    break;
                }
                Some(d) if d > pos => {
                    push(&mut extents, pos, d.min(end), STATE_HOLE | STATE_ZERO);
                    pos = d.min(end);
                }
                Some(_) => {
                    let hole = self.seek(pos, libc::SEEK_HOLE)?.unwrap_or(end);
                    let to = hole.min(end).max(pos + 1);
                    push(&mut extents, pos, to, 0);
                    pos = to;
                }
            }
        }
        Ok(extents)
    }

    fn cache(&self, offset: u64, length: u64) -> io::Result<()> {
        // SAFETY: advisory syscall on a descriptor we own.
        let r = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                length as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(size: u64) -> (std::path::PathBuf, FileBackend) {
        let path = std::env::temp_dir().join(format!(
            "weir-backend-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(size).unwrap();
        (path, FileBackend::new(f))
    }

    #[test]
    fn cached_source_only_for_ranges_wholly_in_the_page_cache() {
        let (path, b) = temp_file(1 << 20);
        b.write(0, &[3u8; 256 << 10]).unwrap();
        b.flush().unwrap();
        // SAFETY: advisory calls on a descriptor we own: drop the pages
        // (and no read-ahead, so that exactly the pages read are cached).
        unsafe {
            libc::posix_fadvise(b.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            libc::posix_fadvise(b.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
        if b.cached_source(0, 4096).is_none() {
            let mut buf = vec![0u8; 128 << 10];
            b.read(0, &mut buf).unwrap();
            assert_eq!(b.cached_source(4096, 64 << 10), Some(b.file.as_raw_fd()));
            assert_eq!(b.cached_source(0, 128 << 10), Some(b.file.as_raw_fd()));
            assert_eq!(
                b.cached_source((128 << 10) - 1, 2),
                None,
                "second page not read"
            );
        } else {
            // A kernel without cachestat(2) (or pages that stayed) would say so here.
            println!("page cache not dropped or cachestat(2) missing: nothing to check");
        }
        assert_eq!(b.cached_source(0, 0), None);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn write_read_punch_and_block_status() {
        let (path, b) = temp_file(1 << 20);
        b.write(65536, &[7u8; 65536]).unwrap();
        let mut buf = vec![1u8; 10];
        b.read(65536 + 5, &mut buf).unwrap();
        assert_eq!(buf, vec![7u8; 10]);
        b.read(0, &mut buf).unwrap();
        assert_eq!(buf, vec![0u8; 10], "unwritten areas read as zero");
        let ext = b.block_status(0, 1 << 20).unwrap();
        let total: u64 = ext.iter().map(|e| e.length as u64).sum();
        assert_eq!(total, 1 << 20);
        // tmpfs/ext4/xfs all report the written range as data.
        let data: Vec<_> = ext.iter().filter(|e| e.flags == 0).collect();
        assert!(!data.is_empty());
        b.write_zeroes(65536, 4096, true, false).unwrap();
        b.read(65536, &mut buf).unwrap();
        assert_eq!(buf, vec![0u8; 10]);
        b.write_zeroes(65536 + 4096, 4096, false, false).unwrap();
        b.read(65536 + 4096, &mut buf).unwrap();
        assert_eq!(buf, vec![0u8; 10]);
        b.trim(0, 4096).unwrap();
        b.flush().unwrap();
        b.cache(0, 4096).unwrap();
        // Non-blocking paths: when they succeed, they did the I/O.
        if b.write_nowait(8192, b"nowait").unwrap() {
            let mut back = [0u8; 6];
            b.read(8192, &mut back).unwrap();
            assert_eq!(&back, b"nowait");
        }
        let mut back = [0u8; 6];
        if b.read_nowait(65536, &mut back).unwrap() {
            assert_eq!(back, [0u8; 6]);
        }
        std::fs::remove_file(path).unwrap();
    }

    /// A volume on tmpfs, whose kernel refuses `RWF_NOWAIT` reads, is still read
    /// inline (before, every READ of a tmpfs volume took the blocking pool).
    #[test]
    fn a_volume_in_memory_is_read_without_the_blocking_pool() {
        let dir = std::path::Path::new("/dev/shm");
        let path = dir.join(format!("weir-backend-shm-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path);
        let Ok(file) = file.map(FileBackend::new) else {
            println!("skipped: no /dev/shm to make a file in");
            return;
        };
        if !in_memory(&file.file) {
            println!("skipped: /dev/shm is not tmpfs here");
            std::fs::remove_file(path).unwrap();
            return;
        }
        file.file.set_len(1 << 20).unwrap();
        file.write(4096, &[9u8; 8192]).unwrap();
        let mut back = vec![0u8; 8192];
        for _ in 0..2 {
            assert!(file.read_nowait(4096, &mut back).unwrap());
            assert_eq!(back, vec![9u8; 8192]);
        }
        // A hole reads as zeroes, inline too.
        assert!(file.read_nowait(1 << 19, &mut back).unwrap());
        assert_eq!(back, vec![0u8; 8192]);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn direct_io_serves_aligned_requests_and_falls_back_for_unaligned_ones() {
        use std::os::unix::fs::OpenOptionsExt;
        let (path, plain) = temp_file(1 << 20);
        let direct = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                println!("skipped: O_DIRECT not supported on the temp dir: {e}");
                std::fs::remove_file(path).unwrap();
                return;
            }
        };
        let b = FileBackend::with_direct(plain.file.try_clone().unwrap(), direct);
        assert!(b.is_direct());
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        b.write(4096, &data).unwrap(); // aligned: O_DIRECT
        b.write(100, b"unaligned").unwrap(); // buffered
        let mut back = vec![0u8; 8192];
        b.read(4096, &mut back).unwrap();
        assert_eq!(back, data);
        let mut small = vec![0u8; 9];
        b.read(100, &mut small).unwrap();
        assert_eq!(&small, b"unaligned");
        // Both paths see each other's data (the kernel keeps them coherent).
        let mut page = vec![0u8; 4096];
        b.read(0, &mut page).unwrap();
        assert_eq!(&page[100..109], b"unaligned");
        b.flush().unwrap();
        std::fs::remove_file(path).unwrap();
    }
}
