//! Pool capacity: the file system's size and free space under each pool, what
//! the pool's files occupy on it, and what its volumes promise (provisioned
//! bytes). Volumes are sparse, so a pool can promise more than its disk holds
//! (overcommit); the admin API and `/metrics` show by how much, and a volume
//! created or grown past the free space is logged with a warning.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::VolumeStore;

/// One pool's space now (`GET /v1/pools/capacity`, `weir pool list`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolCapacity {
    pub name: String,
    /// "file", "thin", "rbd" (then the figures are the Ceph cluster's) or
    /// "upstream" (a gateway pool: its data is on the upstream server, so it has
    /// no capacity, free or allocated bytes here and is never overcommitted).
    pub format: String,
    pub volumes: usize,
    /// Size of the file system holding the pool.
    pub capacity_bytes: u64,
    /// Space on it an unprivileged writer may still use.
    pub free_bytes: u64,
    /// Disk space the pool's files occupy (allocated blocks).
    pub allocated_bytes: u64,
    /// Sum of its volumes' sizes.
    pub provisioned_bytes: u64,
    /// `provisioned / capacity` (above 1: more promised than the disk holds).
    pub overcommit_ratio: f64,
    /// Promised but not yet allocated bytes exceed the free space: writing every
    /// volume full would run out of disk (ENOSPC).
    pub overcommitted: bool,
}

/// Size and free space of the file system holding `path` (its nearest existing
/// ancestor).
fn file_system_bytes(path: &Path) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(path);
    let Ok(c_path) = std::ffi::CString::new(existing.as_os_str().as_bytes()) else {
        return (0, 0);
    };
    // SAFETY: statvfs fills the zeroed struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return (0, 0);
    }
    let unit = st.f_frsize as u64;
    (st.f_blocks as u64 * unit, st.f_bavail as u64 * unit)
}

/// Bytes allocated to the regular files under `dir` (recursively).
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => allocated_bytes(&e.path()),
            Ok(m) if m.is_file() => m.blocks() * 512,
            _ => 0,
        })
        .sum()
}

/// Every pool's space now, by name.
pub fn pools(store: &VolumeStore) -> Vec<PoolCapacity> {
    let volumes = store.list();
    let mut out: Vec<PoolCapacity> = store
        .pools()
        .iter()
        .map(|p| {
            let dir = store.pool_dir(&p.name);
            let rbd = p.backend == crate::config::PoolBackend::Rbd;
            let upstream = p.upstream.is_some();
            let ((capacity_bytes, free_bytes), allocated) = if upstream {
                // No data here: the exports' space is the upstream's business.
                ((0, 0), 0)
            } else if rbd {
                // The Ceph cluster's raw space (RADOS pools share its OSDs).
                let (size, free) = store.rbd_space(&p.name).unwrap_or((0, 0));
                ((size, free), size.saturating_sub(free))
            } else {
                (file_system_bytes(&dir), allocated_bytes(&dir))
            };
            let mine = volumes.iter().filter(|v| v.pool == p.name);
            let provisioned_bytes: u64 = mine.clone().map(|v| v.size_bytes).sum();
            PoolCapacity {
                name: p.name.clone(),
                format: if upstream {
                    "upstream".into()
                } else if rbd {
                    "rbd".into()
                } else {
                    format!("{:?}", p.format).to_ascii_lowercase()
                },
                volumes: mine.count(),
                capacity_bytes,
                free_bytes,
                allocated_bytes: allocated,
                provisioned_bytes,
                overcommit_ratio: if capacity_bytes == 0 {
                    0.0
                } else {
                    provisioned_bytes as f64 / capacity_bytes as f64
                },
                overcommitted: !upstream
                    && provisioned_bytes.saturating_sub(allocated) > free_bytes,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// A warning for the log when `pool` now promises more than its disk can still
/// hold (after a volume was created or grown), else `None`.
pub fn overcommit_warning(store: &VolumeStore, pool: &str) -> Option<String> {
    let p = pools(store).into_iter().find(|p| p.name == pool)?;
    p.overcommitted.then(|| {
        format!(
            "pool {pool:?} is overcommitted: its volumes total {} bytes, {} are allocated and only {} bytes are free on its file system (writing them full would fail with ENOSPC)",
            p.provisioned_bytes, p.allocated_bytes, p.free_bytes
        )
    })
}

/// `weir_pool_{capacity,free,allocated,provisioned}_bytes{pool}`; an upstream
/// pool has only `provisioned` (it holds no data, so no space of its own).
pub fn render_prometheus(store: &VolumeStore) -> String {
    let pools = pools(store);
    let mut out = String::new();
    type Get = fn(&PoolCapacity) -> u64;
    let rows: [(&str, &str, Get); 4] = [
        (
            "capacity_bytes",
            "Size of the file system holding the pool.",
            |p| p.capacity_bytes,
        ),
        (
            "free_bytes",
            "Free space on the file system holding the pool.",
            |p| p.free_bytes,
        ),
        (
            "allocated_bytes",
            "Disk space the pool's files occupy.",
            |p| p.allocated_bytes,
        ),
        (
            "provisioned_bytes",
            "Sum of the sizes of the pool's volumes.",
            |p| p.provisioned_bytes,
        ),
    ];
    for (name, help, get) in rows {
        let _ = writeln!(out, "# HELP weir_pool_{name} {help}");
        let _ = writeln!(out, "# TYPE weir_pool_{name} gauge");
        for p in &pools {
            if p.format == "upstream" && name != "provisioned_bytes" {
                continue;
            }
            let _ = writeln!(
                out,
                "weir_pool_{name}{{pool=\"{}\"}} {}",
                crate::metrics::escape(&p.name),
                get(p)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_system_figures_are_read_from_an_existing_ancestor() {
        let dir = weir_testkit::TempDir::new("capacity");
        let (size, free) = file_system_bytes(&dir.path().join("not/yet/made"));
        assert!(size > 0 && free <= size, "{size} {free}");
        std::fs::write(dir.path().join("f"), vec![1u8; 64 << 10]).unwrap();
        assert!(allocated_bytes(dir.path()) >= 64 << 10);
    }
}
