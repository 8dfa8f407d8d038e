//! The backend layer chain: where a validated, QoS-released request meets
//! storage. A [`Backend`] is blocking (it runs on tokio's blocking pool);
//! layers wrap another backend, as nbdkit filters do (an emulated-device layer
//! that completes I/Os no earlier than a `weir_model::Component` says, caches, …),
//! and the file backend sits at the bottom.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use weir_nbd::Extent;
use weir_nbd::consts::{STATE_HOLE, STATE_ZERO};

/// Storage operations on one volume. Offsets and lengths are already validated
/// against the volume size.
pub trait Backend: Send + Sync + 'static {
    /// Fills `buf` from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
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

/// A volume as a sparse file, with positional I/O (many requests in flight on
/// one shared descriptor), so FLUSH on any connection covers every connection's
/// writes (what `NBD_FLAG_CAN_MULTI_CONN` promises).
pub struct FileBackend {
    file: File,
}

/// Most extents one BLOCK_STATUS reply carries.
const MAX_EXTENTS: usize = 1024;

impl FileBackend {
    pub fn new(file: File) -> FileBackend {
        FileBackend { file }
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
        self.file.write_all_at(data, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
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
        std::fs::remove_file(path).unwrap();
    }
}
