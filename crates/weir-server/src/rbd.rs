//! The RBD backend: a pool with `backend = "rbd"` keeps each volume as an RBD
//! image (of the volume's name) in a RADOS pool of a Ceph cluster, through
//! librbd's asynchronous API (docs/RBD.md).
//!
//! librbd and librados are loaded at run time (`dlopen` of `librbd.so.1` and
//! `librados.so.2`, the sonames of every Ceph release since 0.94), with the few
//! functions used here declared by hand from Ceph 16's `rbd/librbd.h` and
//! `rados/librados.h`: building Weir needs no Ceph, and a server without an RBD
//! pool never loads them. A pool with `backend = "rbd"` on a machine without
//! them fails at start with a message naming the package.
//!
//! One cluster connection (`rados_t`) and one I/O context per pool, shared by
//! its volumes; one open image handle per volume. READ and WRITE started by the
//! session ([`Backend::start_async`]) are `rbd_aio_read`/`rbd_aio_write` whose
//! completion callback completes the request (inside the tokio runtime's
//! context): no thread waits for the cluster. The blocking calls (FLUSH, TRIM, WRITE_ZEROES, FUA writes,
//! and READ/WRITE outside the runtime) are the same AIO calls waited for with
//! `rbd_aio_wait_for_complete`. BLOCK_STATUS is `rbd_diff_iterate2` from the
//! image's creation (parent data included): ranges it does not report read as
//! zeroes and are reported as holes.
//!
//! Durability: librbd's cache is turned off (`rbd_cache = false`, whatever the
//! Ceph configuration says; see `RbdCluster::connect`), so a WRITE is
//! acknowledged once the OSDs have it, and a FLUSH (`rbd_aio_flush`) is cheap.

use std::ffi::{CString, c_char, c_int, c_void};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use weir_nbd::Extent;
use weir_nbd::consts::{STATE_HOLE, STATE_ZERO};

use crate::backend::{AsyncDone, AsyncOp, Backend, WriteData};

type RadosT = *mut c_void;
type IoctxT = *mut c_void;
type ImageT = *mut c_void;
type CompletionT = *mut c_void;
type CallbackT = Option<unsafe extern "C" fn(CompletionT, *mut c_void)>;
type DiffCb = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// The shared libraries, in the order they are loaded.
pub const LIBRADOS: &str = "librados.so.2";
pub const LIBRBD: &str = "librbd.so.1";

/// Default `rbd_client` (a Ceph client name, `client.` implied).
pub const DEFAULT_CLIENT: &str = "admin";
/// Default `rbd_connect_timeout_s`.
pub const DEFAULT_CONNECT_TIMEOUT_S: u32 = 30;
/// Most `rbd_connect_timeout_s`.
pub const MAX_CONNECT_TIMEOUT_S: u32 = 3600;

/// Most extents one BLOCK_STATUS reply carries (as the file backend).
const MAX_EXTENTS: usize = 1024;
/// Most ranges collected from one `rbd_diff_iterate2` before giving up and
/// reporting the range allocated (always correct, only less precise).
const MAX_DIFF_RANGES: usize = 16384;
/// Longest range one BLOCK_STATUS looks at (a reply covers at least one byte).
const MAX_STATUS_RANGE: u64 = 1 << 30;

/// The functions of librados and librbd Weir calls (Ceph 16 signatures).
struct Lib {
    rados_create2: unsafe extern "C" fn(*mut RadosT, *const c_char, *const c_char, u64) -> c_int,
    rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    rados_shutdown: unsafe extern "C" fn(RadosT),
    rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    rados_cluster_stat: unsafe extern "C" fn(RadosT, *mut ClusterStat) -> c_int,
    /// `rados_set_pool_full_try` (Ceph 16; `rados_set_osdmap_full_try` before).
    rados_set_pool_full_try: unsafe extern "C" fn(IoctxT),
    rbd_create: unsafe extern "C" fn(IoctxT, *const c_char, u64, *mut c_int) -> c_int,
    rbd_remove: unsafe extern "C" fn(IoctxT, *const c_char) -> c_int,
    rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_open_read_only:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    rbd_snap_create: unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    rbd_snap_protect: unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    rbd_snap_unprotect: unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    rbd_snap_remove: unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    rbd_snap_rollback: unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    rbd_flatten: unsafe extern "C" fn(ImageT) -> c_int,
    rbd_lock_get_owners:
        unsafe extern "C" fn(ImageT, *mut c_int, *mut *mut c_char, *mut usize) -> c_int,
    rbd_lock_get_owners_cleanup: unsafe extern "C" fn(*mut *mut c_char, usize),
    rbd_lock_break: unsafe extern "C" fn(ImageT, c_int, *const c_char) -> c_int,
    rbd_is_exclusive_lock_owner: unsafe extern "C" fn(ImageT, *mut c_int) -> c_int,
    rbd_image_options_create: unsafe extern "C" fn(*mut *mut c_void),
    rbd_image_options_destroy: unsafe extern "C" fn(*mut c_void),
    rbd_clone3: unsafe extern "C" fn(
        IoctxT,
        *const c_char,
        *const c_char,
        IoctxT,
        *const c_char,
        *mut c_void,
    ) -> c_int,
    rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    rbd_get_features: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    rbd_update_features: unsafe extern "C" fn(ImageT, u64, u8) -> c_int,
    rbd_resize: unsafe extern "C" fn(ImageT, u64) -> c_int,
    rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, CallbackT, *mut CompletionT) -> c_int,
    rbd_aio_wait_for_complete: unsafe extern "C" fn(CompletionT) -> c_int,
    rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    rbd_aio_release: unsafe extern "C" fn(CompletionT),
    rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    rbd_aio_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
    rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    rbd_aio_write_zeroes:
        unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int,
    rbd_diff_iterate2:
        unsafe extern "C" fn(ImageT, *const c_char, u64, u64, u8, u8, DiffCb, *mut c_void) -> c_int,
    _libs: (libloading::Library, libloading::Library),
}

/// `rados_cluster_stat_t`.
#[repr(C)]
#[derive(Default)]
struct ClusterStat {
    kb: u64,
    kb_used: u64,
    kb_avail: u64,
    num_objects: u64,
}

impl Lib {
    fn load() -> Result<Lib, String> {
        // SAFETY: loading librados/librbd runs their initialisers, which have no
        // preconditions; each symbol is declared with its C signature above.
        unsafe {
            let rados = libloading::Library::new(LIBRADOS).map_err(|e| e.to_string())?;
            let rbd = libloading::Library::new(LIBRBD).map_err(|e| e.to_string())?;
            macro_rules! sym {
                ($lib:expr, $name:ident) => {
                    *$lib
                        .get(concat!(stringify!($name), "\0").as_bytes())
                        .map_err(|e| format!("{}: {e}", stringify!($name)))?
                };
            }
            Ok(Lib {
                rados_create2: sym!(rados, rados_create2),
                rados_conf_read_file: sym!(rados, rados_conf_read_file),
                rados_conf_set: sym!(rados, rados_conf_set),
                rados_connect: sym!(rados, rados_connect),
                rados_shutdown: sym!(rados, rados_shutdown),
                rados_ioctx_create: sym!(rados, rados_ioctx_create),
                rados_ioctx_destroy: sym!(rados, rados_ioctx_destroy),
                rados_cluster_stat: sym!(rados, rados_cluster_stat),
                rados_set_pool_full_try: match rados.get(b"rados_set_pool_full_try\0") {
                    Ok(f) => *f,
                    Err(_) => sym!(rados, rados_set_osdmap_full_try),
                },
                rbd_create: sym!(rbd, rbd_create),
                rbd_remove: sym!(rbd, rbd_remove),
                rbd_open: sym!(rbd, rbd_open),
                rbd_open_read_only: sym!(rbd, rbd_open_read_only),
                rbd_close: sym!(rbd, rbd_close),
                rbd_snap_create: sym!(rbd, rbd_snap_create),
                rbd_snap_protect: sym!(rbd, rbd_snap_protect),
                rbd_snap_unprotect: sym!(rbd, rbd_snap_unprotect),
                rbd_snap_remove: sym!(rbd, rbd_snap_remove),
                rbd_snap_rollback: sym!(rbd, rbd_snap_rollback),
                rbd_flatten: sym!(rbd, rbd_flatten),
                rbd_lock_get_owners: sym!(rbd, rbd_lock_get_owners),
                rbd_lock_get_owners_cleanup: sym!(rbd, rbd_lock_get_owners_cleanup),
                rbd_lock_break: sym!(rbd, rbd_lock_break),
                rbd_is_exclusive_lock_owner: sym!(rbd, rbd_is_exclusive_lock_owner),
                rbd_image_options_create: sym!(rbd, rbd_image_options_create),
                rbd_image_options_destroy: sym!(rbd, rbd_image_options_destroy),
                rbd_clone3: sym!(rbd, rbd_clone3),
                rbd_get_size: sym!(rbd, rbd_get_size),
                rbd_get_features: sym!(rbd, rbd_get_features),
                rbd_update_features: sym!(rbd, rbd_update_features),
                rbd_resize: sym!(rbd, rbd_resize),
                rbd_aio_create_completion: sym!(rbd, rbd_aio_create_completion),
                rbd_aio_wait_for_complete: sym!(rbd, rbd_aio_wait_for_complete),
                rbd_aio_get_return_value: sym!(rbd, rbd_aio_get_return_value),
                rbd_aio_release: sym!(rbd, rbd_aio_release),
                rbd_aio_read: sym!(rbd, rbd_aio_read),
                rbd_aio_write: sym!(rbd, rbd_aio_write),
                rbd_aio_flush: sym!(rbd, rbd_aio_flush),
                rbd_aio_discard: sym!(rbd, rbd_aio_discard),
                rbd_aio_write_zeroes: sym!(rbd, rbd_aio_write_zeroes),
                rbd_diff_iterate2: sym!(rbd, rbd_diff_iterate2),
                _libs: (rados, rbd),
            })
        }
    }
}

/// librados and librbd, loaded once; the error says what is missing.
fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(Lib::load).as_ref().map_err(|e| {
        format!(
            "backend = \"rbd\" needs Ceph's client libraries {LIBRBD} and {LIBRADOS} \
             (Debian/Ubuntu: apt install librbd1; Fedora/RHEL: dnf install librbd1), \
             which could not be loaded: {e}"
        )
    })
}

/// Whether librbd can be loaded here (tests, diagnostics).
pub fn available() -> Result<(), String> {
    lib().map(|_| ())
}

/// A negative errno from librados/librbd as an I/O error.
fn errno(r: i64) -> io::Error {
    io::Error::from_raw_os_error((-r) as i32)
}

fn check(r: c_int) -> io::Result<()> {
    if r < 0 { Err(errno(r.into())) } else { Ok(()) }
}

fn cstring(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {s:?} contains NUL"),
        )
    })
}

/// Where a pool's cluster is and who Weir is there (the pool's `rbd_*` keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdTarget {
    /// The RADOS pool holding the images.
    pub pool: String,
    /// `ceph.conf`; `None`: librados' search (`$CEPH_CONF`, /etc/ceph/ceph.conf, …).
    pub conf: Option<PathBuf>,
    /// The client's name without `client.` (`admin`).
    pub client: String,
    /// The client's keyring; `None`: the configuration's `keyring`.
    pub keyring: Option<PathBuf>,
    pub connect_timeout_s: u32,
}

/// A connection to a cluster and an I/O context on one RADOS pool, shared by
/// the volumes of one Weir pool.
pub struct RbdCluster {
    lib: &'static Lib,
    rados: RadosT,
    ioctx: IoctxT,
    target: RbdTarget,
    space: SpaceCache,
}

// SAFETY: librados handles are thread-safe (the library locks internally), and
// these are only destroyed in Drop, when no one else holds them.
unsafe impl Send for RbdCluster {}
unsafe impl Sync for RbdCluster {}

impl Drop for RbdCluster {
    fn drop(&mut self) {
        // SAFETY: created in `connect`, destroyed once; every image of the
        // cluster holds an Arc to it, so none is open any more.
        unsafe {
            if !self.ioctx.is_null() {
                (self.lib.rados_ioctx_destroy)(self.ioctx);
            }
            (self.lib.rados_shutdown)(self.rados);
        }
    }
}

impl RbdCluster {
    /// Loads librbd, connects to the cluster and opens the RADOS pool.
    pub fn connect(target: &RbdTarget) -> Result<Arc<RbdCluster>, String> {
        let lib = lib()?;
        let who = format!("client.{}", target.client);
        let name = CString::new(who.clone()).map_err(|_| "rbd_client contains NUL".to_string())?;
        let mut rados: RadosT = std::ptr::null_mut();
        // SAFETY: rados_create2 writes a handle to `rados`; the strings are NUL-terminated.
        let r = unsafe { (lib.rados_create2)(&mut rados, c"ceph".as_ptr(), name.as_ptr(), 0) };
        if r < 0 {
            return Err(format!("rados_create2({who}): {}", errno(r.into())));
        }
        // From here on, Drop shuts the handle down (the ioctx is created last).
        let mut cluster = RbdCluster {
            lib,
            rados,
            ioctx: std::ptr::null_mut(),
            target: target.clone(),
            space: SpaceCache::default(),
        };
        let fail = |what: String, r: c_int| Err(format!("{what}: {}", errno(r.into())));
        let path_c = |p: &Path| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| format!("{} contains NUL", p.display()))
        };
        // SAFETY (this block's calls): `cluster.rados` is a live handle and the
        // strings are NUL-terminated and outlive the calls.
        unsafe {
            let r = match &target.conf {
                Some(p) => {
                    if !p.exists() {
                        return Err(format!("rbd_ceph_conf {}: no such file", p.display()));
                    }
                    (lib.rados_conf_read_file)(cluster.rados, path_c(p)?.as_ptr())
                }
                // The default search; no file found is not an error (mon_host
                // may come from $CEPH_ARGS).
                None => {
                    let _ = (lib.rados_conf_read_file)(cluster.rados, std::ptr::null());
                    0
                }
            };
            if r < 0 {
                return fail(format!("reading {}", display_conf(&target.conf)), r);
            }
            if let Some(k) = &target.keyring {
                if !k.exists() {
                    return Err(format!("rbd_keyring {}: no such file", k.display()));
                }
                let r =
                    (lib.rados_conf_set)(cluster.rados, c"keyring".as_ptr(), path_c(k)?.as_ptr());
                if r < 0 {
                    return fail(format!("keyring {}", k.display()), r);
                }
            }
            // librbd's client-side cache off, whatever the configuration says:
            // with it, a gateway killed after its successor had read the image
            // lost flushed writes in the crash test (tests/rbd.rs; as iSCSI
            // gateways on RBD, Weir runs without it), and the QoS gate must
            // see the cluster's latency, not the cache's.
            let r = (lib.rados_conf_set)(cluster.rados, c"rbd_cache".as_ptr(), c"false".as_ptr());
            if r < 0 {
                return fail("setting rbd_cache = false".into(), r);
            }
            let t = CString::new(target.connect_timeout_s.to_string()).expect("digits");
            for key in [c"client_mount_timeout", c"rados_mon_op_timeout"] {
                (lib.rados_conf_set)(cluster.rados, key.as_ptr(), t.as_ptr());
            }
            let r = (lib.rados_connect)(cluster.rados);
            if r < 0 {
                return fail(
                    format!(
                        "connecting to the Ceph cluster of {} as {who} (timeout {} s)",
                        display_conf(&target.conf),
                        target.connect_timeout_s
                    ),
                    r,
                );
            }
            let pool = CString::new(target.pool.clone())
                .map_err(|_| "rbd_pool contains NUL".to_string())?;
            let r = (lib.rados_ioctx_create)(cluster.rados, pool.as_ptr(), &mut cluster.ioctx);
            if r < 0 {
                cluster.ioctx = std::ptr::null_mut();
                let e = errno(r.into());
                return Err(format!(
                    "RADOS pool {:?}: {e} (create it: ceph osd pool create {0} && rbd pool init {0})",
                    target.pool
                ));
            }
            // A full pool (its quota reached, or the cluster full): writes fail
            // with EDQUOT/ENOSPC (the client sees NBD ENOSPC) instead of waiting
            // in librados until space returns, which held the client, the
            // gate's slots and a graceful shutdown forever. librbd's image
            // contexts inherit the flag from this I/O context.
            (lib.rados_set_pool_full_try)(cluster.ioctx);
        }
        Ok(Arc::new(cluster))
    }

    pub fn target(&self) -> &RbdTarget {
        &self.target
    }

    /// Creates an image of `size` bytes (librbd's default format, features and
    /// object size, from the cluster's configuration).
    pub fn create_image(self: &Arc<Self>, name: &str, size: u64) -> io::Result<()> {
        let n = cstring("image name", name)?;
        self.bounded(move |c| {
            let mut order: c_int = 0;
            // SAFETY: live ioctx, NUL-terminated name, `order` written by the call.
            check(unsafe { (c.lib.rbd_create)(c.ioctx, n.as_ptr(), size, &mut order) })
        })
    }

    /// Removes an image (fails with EBUSY while a client has it open, ENOTEMPTY
    /// while it has snapshots).
    pub fn remove_image(self: &Arc<Self>, name: &str) -> io::Result<()> {
        let n = cstring("image name", name)?;
        // SAFETY: live ioctx, NUL-terminated name.
        self.bounded(move |c| check(unsafe { (c.lib.rbd_remove)(c.ioctx, n.as_ptr()) }))
    }

    /// Opens an image for reading and writing.
    pub fn open_image(self: &Arc<Self>, name: &str) -> io::Result<Arc<RbdImage>> {
        let n = cstring("image name", name)?;
        let name = name.to_string();
        self.bounded(move |c| {
            let mut image: ImageT = std::ptr::null_mut();
            // SAFETY: live ioctx, NUL-terminated name, no snapshot; `image` written.
            check(unsafe { (c.lib.rbd_open)(c.ioctx, n.as_ptr(), &mut image, std::ptr::null()) })?;
            Ok(Arc::new(RbdImage {
                cluster: c.clone(),
                image: RwLock::new(Some(Handle(image))),
                name,
            }))
        })
    }

    /// Opens a snapshot of an image, read-only.
    pub fn open_snapshot(self: &Arc<Self>, name: &str, snap: &str) -> io::Result<Arc<RbdImage>> {
        let n = cstring("image name", name)?;
        let sn = cstring("snapshot name", snap)?;
        let name = format!("{name}@{snap}");
        self.bounded(move |c| {
            let mut image: ImageT = std::ptr::null_mut();
            // SAFETY: live ioctx, NUL-terminated names; `image` written.
            check(unsafe {
                (c.lib.rbd_open_read_only)(c.ioctx, n.as_ptr(), &mut image, sn.as_ptr())
            })?;
            Ok(Arc::new(RbdImage {
                cluster: c.clone(),
                image: RwLock::new(Some(Handle(image))),
                name,
            }))
        })
    }

    /// A layered clone `child` of `parent@snap` (librbd's default features and
    /// clone format; the snapshot is protected, which every format accepts).
    pub fn clone_image(self: &Arc<Self>, parent: &str, snap: &str, child: &str) -> io::Result<()> {
        let (p, sn, c) = (
            cstring("image name", parent)?,
            cstring("snapshot name", snap)?,
            cstring("image name", child)?,
        );
        self.bounded(move |cluster| {
            let mut opts: *mut c_void = std::ptr::null_mut();
            // SAFETY: options made and destroyed here; live ioctx; NUL-terminated names.
            unsafe {
                (cluster.lib.rbd_image_options_create)(&mut opts);
                let r = (cluster.lib.rbd_clone3)(
                    cluster.ioctx,
                    p.as_ptr(),
                    sn.as_ptr(),
                    cluster.ioctx,
                    c.as_ptr(),
                    opts,
                );
                (cluster.lib.rbd_image_options_destroy)(opts);
                check(r)
            }
        })
    }

    /// Runs `f`, librbd calls on this cluster, in a thread of its own and waits
    /// for it at most `rbd_connect_timeout_s` ([`bounded`]).
    fn bounded<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Arc<RbdCluster>) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let me = self.clone();
        bounded(self.target.connect_timeout_s, move || f(&me))
    }

    /// The cluster's raw size and free space (all pools: RADOS pools share the
    /// OSDs), in bytes, as last measured: `rados_cluster_stat` asks the
    /// monitor, which may not answer for `rbd_connect_timeout_s` (stopped,
    /// partitioned), and the callers (`weir pool list`, every metrics scrape)
    /// hold the volume store's lock. So a measurement older than
    /// [`SPACE_FRESH`] starts one in a thread of its own (one at a time) and
    /// waits at most [`SPACE_WAIT`] for it; meanwhile the last one answers
    /// (`None`: none yet).
    pub fn space(self: &Arc<Self>) -> Option<(u64, u64)> {
        let latest = || *self.space.latest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, v)) = latest()
            && at.elapsed() < SPACE_FRESH
        {
            return Some(v);
        }
        if !self.space.measuring.swap(true, AtomicOrdering::AcqRel) {
            let (tx, rx) = std::sync::mpsc::channel();
            let me = self.clone();
            let measure = move || {
                match me.stat() {
                    Ok(v) => {
                        *me.space.latest.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some((Instant::now(), v));
                    }
                    Err(e) => tracing::warn!(
                        "RBD pool {:?}: the cluster's space (rados_cluster_stat): {e}",
                        me.target.pool
                    ),
                }
                me.space.measuring.store(false, AtomicOrdering::Release);
                let _ = tx.send(());
            };
            match std::thread::Builder::new()
                .name("weir-rbd-stat".into())
                .spawn(measure)
            {
                Ok(_) => {
                    let _ = rx.recv_timeout(SPACE_WAIT);
                }
                Err(e) => {
                    self.space.measuring.store(false, AtomicOrdering::Release);
                    tracing::warn!("measuring the cluster's space: no thread: {e}");
                }
            }
        }
        latest().map(|(_, v)| v)
    }

    /// `rados_cluster_stat` (waits for the monitor, at most `rados_mon_op_timeout`).
    fn stat(&self) -> io::Result<(u64, u64)> {
        let mut st = ClusterStat::default();
        // SAFETY: live handle; the call fills the #[repr(C)] struct.
        check(unsafe { (self.lib.rados_cluster_stat)(self.rados, &mut st) })?;
        Ok((st.kb << 10, st.kb_avail << 10))
    }
}

/// How long a measurement of a cluster's space is reused.
const SPACE_FRESH: Duration = Duration::from_secs(2);
/// How long a caller of [`RbdCluster::space`] waits for a new measurement.
const SPACE_WAIT: Duration = Duration::from_secs(1);

/// The last measurement of a cluster's space, and whether one is under way.
#[derive(Default)]
struct SpaceCache {
    latest: Mutex<Option<(Instant, (u64, u64))>>,
    measuring: AtomicBool,
}

/// Runs `f` (librbd calls managing images: create, open, remove, resize,
/// snapshots) in a thread of its own and waits for it at most `timeout_s`
/// seconds. The volume store is locked meanwhile, so an OSD that does not
/// answer (stopped, partitioned) must not hold it for longer: librados waits
/// for OSDs without end, and held every admin request and every new NBD
/// connection, to any pool, until the OSD came back. On the timeout, `f` goes
/// on in its thread (and may still complete); the error says so.
fn bounded<T: Send + 'static>(
    timeout_s: u32,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let wait = Duration::from_secs(timeout_s.into());
    crate::within::run_within("weir-rbd-admin", wait, f)?.unwrap_or_else(|| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the Ceph cluster did not answer within {timeout_s} s \
                 (rbd_connect_timeout_s; an OSD down?); the operation may still complete"
            ),
        ))
    })
}

fn display_conf(conf: &Option<PathBuf>) -> String {
    match conf {
        Some(p) => p.display().to_string(),
        None => "the default Ceph configuration ($CEPH_CONF, /etc/ceph/ceph.conf)".into(),
    }
}

#[derive(Clone, Copy)]
struct Handle(ImageT);

/// An open RBD image: one volume's bottom backend.
pub struct RbdImage {
    cluster: Arc<RbdCluster>,
    /// `None` once closed ([`RbdImage::close`]: the volume was deleted); I/O
    /// then fails with ENODEV. Read-locked while an I/O is submitted or waited
    /// for, so closing waits for those.
    image: RwLock<Option<Handle>>,
    name: String,
}

// SAFETY: librbd image handles may be used from any thread at once (AIO calls
// lock internally); the handle is closed only under the write lock.
unsafe impl Send for RbdImage {}
unsafe impl Sync for RbdImage {}

impl Drop for RbdImage {
    fn drop(&mut self) {
        self.close();
    }
}

/// What the completion callback of a started READ/WRITE owns.
struct Pending {
    lib: &'static Lib,
    /// The READ's buffer.
    buf: Vec<u8>,
    /// The WRITE's data, kept until the completion: librbd reads it at submission
    /// (it copies unless `rbd_disable_zero_copy_writes` is off, and then reads it
    /// until the completion), so it is handed over without a copy of ours.
    write: Option<WriteData>,
    runtime: tokio::runtime::Handle,
    done: AsyncDone,
}

/// librbd's completion callback for [`Backend::start_async`].
unsafe extern "C" fn on_complete(c: CompletionT, arg: *mut c_void) {
    // SAFETY: `arg` is the Box leaked in `start_async`, given to exactly this
    // completion; `c` is live until released here.
    let (p, r) = unsafe {
        let p = Box::from_raw(arg.cast::<Pending>());
        let r = (p.lib.rbd_aio_get_return_value)(c);
        (p.lib.rbd_aio_release)(c);
        (p, r)
    };
    let Pending {
        buf,
        write,
        runtime,
        done,
        ..
    } = *p;
    let result = if r < 0 {
        Err(errno(r as i64))
    } else if write.is_none() {
        let mut buf = buf;
        let n = (r as usize).min(buf.len());
        buf[n..].fill(0); // past the end of the image: zeroes
        Ok(buf)
    } else {
        Ok(Vec::new())
    };
    // The session's completion runs here, on librbd's callback thread, inside
    // the runtime (as the upstream backend's reader thread does): handing it to
    // a runtime task instead cost a QD1 write up to the connection's busy-poll
    // time (its one worker spins waiting for this reply and runs no task
    // meanwhile). It may submit the next released I/O from this thread; librbd
    // allows that (an AIO call queues its request and returns; at worst the
    // Objecter's in-flight budget makes it wait for replies, which the
    // messenger threads deliver, not this one).
    let _in_runtime = runtime.enter();
    done(Some(result));
}

impl RbdImage {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Closes the image (waiting for I/O in flight); later I/O fails with ENODEV.
    pub fn close(&self) {
        let mut g = self.image.write().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = g.take() {
            // SAFETY: the handle is open; no I/O holds the read lock now.
            let r = unsafe { (self.cluster.lib.rbd_close)(h.0) };
            if r < 0 {
                tracing::warn!("closing RBD image {:?}: {}", self.name, errno(r.into()));
            }
        }
    }

    /// [`RbdImage::close`], waiting for it at most `rbd_connect_timeout_s`
    /// ([`bounded`]: closing waits for the I/O in flight, and librbd's close for
    /// the OSDs).
    pub fn close_bounded(self: &Arc<Self>) -> io::Result<()> {
        self.bounded(|me| {
            me.close();
            Ok(())
        })
    }

    fn with<T>(&self, f: impl FnOnce(&'static Lib, ImageT) -> io::Result<T>) -> io::Result<T> {
        let g = self.image.read().unwrap_or_else(|e| e.into_inner());
        match *g {
            Some(h) => f(self.cluster.lib, h.0),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("RBD image {:?} is closed (volume deleted)", self.name),
            )),
        }
    }

    pub fn size(self: &Arc<Self>) -> io::Result<u64> {
        self.bounded(|me| {
            me.with(|lib, image| {
                let mut size = 0u64;
                // SAFETY: open image; the call writes `size`.
                check(unsafe { (lib.rbd_get_size)(image, &mut size) })?;
                Ok(size)
            })
        })
    }

    /// Runs `f` (librbd calls on this image) in a thread of its own and waits
    /// for it at most `rbd_connect_timeout_s` ([`bounded`]).
    fn bounded<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&RbdImage) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let me = self.clone();
        bounded(self.cluster.target.connect_timeout_s, move || f(&me))
    }

    /// Runs a librbd call taking the image and a snapshot name.
    fn snap_call(
        &self,
        snap: &str,
        f: impl FnOnce(&'static Lib) -> unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    ) -> io::Result<()> {
        let sn = cstring("snapshot name", snap)?;
        // SAFETY: open image, NUL-terminated name.
        self.with(|lib, image| check(unsafe { f(lib)(image, sn.as_ptr()) }))
    }

    /// Takes a snapshot and protects it (so it can be cloned).
    pub fn snapshot(self: &Arc<Self>, snap: &str) -> io::Result<()> {
        let snap = snap.to_string();
        self.bounded(move |me| {
            me.snap_call(&snap, |l| l.rbd_snap_create)?;
            if let Err(e) = me.snap_call(&snap, |l| l.rbd_snap_protect) {
                let _ = me.snap_call(&snap, |l| l.rbd_snap_remove);
                return Err(e);
            }
            Ok(())
        })
    }

    /// Unprotects (EBUSY while clones read from it) and removes a snapshot.
    pub fn remove_snapshot(self: &Arc<Self>, snap: &str) -> io::Result<()> {
        let snap = snap.to_string();
        self.bounded(move |me| {
            match me.snap_call(&snap, |l| l.rbd_snap_unprotect) {
                // Already unprotected (an earlier removal that failed halfway).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                r => r?,
            }
            me.snap_call(&snap, |l| l.rbd_snap_remove)
        })
    }

    /// Returns the image to a snapshot (its data and size).
    pub fn rollback(&self, snap: &str) -> io::Result<()> {
        self.snap_call(snap, |l| l.rbd_snap_rollback)
    }

    /// Copies what a clone reads from its parent into it (it becomes independent).
    pub fn flatten(&self) -> io::Result<()> {
        // SAFETY: open image.
        self.with(|lib, image| check(unsafe { (lib.rbd_flatten)(image) }))
    }

    /// Lets several gateways write the image at once (each its own bytes, as the
    /// gateway stats volume is written): turns off `exclusive-lock` and the
    /// features that need it (object map, fast diff, journaling). With the lock,
    /// every write of one gateway would ask another for it, and a holder slow to
    /// answer (a loaded machine) is broken and **blocklisted** — all its images
    /// fenced. Nothing to do when the lock is already off.
    pub fn share_writes(&self) -> io::Result<()> {
        const EXCLUSIVE_LOCK: u64 = 1 << 2;
        const NEEDS_LOCK: [u64; 3] = [1 << 6, 1 << 4, 1 << 3]; // journaling, fast diff, object map
        self.with(|lib, image| {
            for f in NEEDS_LOCK.into_iter().chain([EXCLUSIVE_LOCK]) {
                // Read again each time: turning one off may turn others off with it
                // (fast diff takes the object map along), and turning off a feature
                // already off is EINVAL.
                let mut features = 0u64;
                // SAFETY: open image; the call writes `features`.
                check(unsafe { (lib.rbd_get_features)(image, &mut features) })?;
                if features & f != 0 {
                    // SAFETY: open image; turns feature `f` off.
                    check(unsafe { (lib.rbd_update_features)(image, f, 0) })?;
                }
            }
            Ok(())
        })
    }

    /// Failover: breaks the image's exclusive lock held by another client
    /// (another gateway, dead or alive), which librbd blocklists on the cluster
    /// so it can write no more; this gateway's next write takes the lock. The
    /// owners broken (empty: none held it, or this gateway did).
    pub fn take_over(&self) -> io::Result<Vec<String>> {
        const MAX_OWNERS: usize = 8;
        const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;
        self.with(|lib, image| {
            let mut mine: c_int = 0;
            // SAFETY: open image; the call writes `mine`.
            check(unsafe { (lib.rbd_is_exclusive_lock_owner)(image, &mut mine) })?;
            if mine != 0 {
                return Ok(Vec::new()); // this gateway holds it already
            }
            let mut mode: c_int = 0;
            let mut owners: [*mut c_char; MAX_OWNERS] = [std::ptr::null_mut(); MAX_OWNERS];
            let mut n = MAX_OWNERS;
            // SAFETY: open image; librbd fills at most `n` owner strings, freed
            // below with its cleanup call.
            let r =
                unsafe { (lib.rbd_lock_get_owners)(image, &mut mode, owners.as_mut_ptr(), &mut n) };
            if r == -libc::ENOENT {
                return Ok(Vec::new());
            }
            check(r)?;
            let names: Vec<CString> = owners[..n.min(MAX_OWNERS)]
                .iter()
                // SAFETY: NUL-terminated strings librbd allocated.
                .map(|&p| unsafe { std::ffi::CStr::from_ptr(p) }.to_owned())
                .collect();
            // SAFETY: the `n` strings librbd returned, freed once.
            unsafe { (lib.rbd_lock_get_owners_cleanup)(owners.as_mut_ptr(), n) };
            let mut broken = Vec::new();
            for owner in names {
                // SAFETY: open image, NUL-terminated owner.
                match check(unsafe {
                    (lib.rbd_lock_break)(image, RBD_LOCK_MODE_EXCLUSIVE, owner.as_ptr())
                }) {
                    // Released meanwhile, or ours.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    r => r?,
                }
                broken.push(owner.to_string_lossy().into_owned());
            }
            Ok(broken)
        })
    }

    pub fn resize(self: &Arc<Self>, size: u64) -> io::Result<()> {
        // SAFETY: open image.
        self.bounded(move |me| {
            me.with(|lib, image| check(unsafe { (lib.rbd_resize)(image, size) }))
        })
    }

    /// Runs one AIO call and waits for its completion; the completion's return
    /// value (bytes for a read).
    fn wait(
        &self,
        submit: impl FnOnce(&'static Lib, ImageT, CompletionT) -> c_int,
    ) -> io::Result<usize> {
        self.with(|lib, image| {
            let mut c: CompletionT = std::ptr::null_mut();
            // SAFETY: no callback and no argument: the completion is waited for.
            check(unsafe { (lib.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c) })?;
            let r = submit(lib, image, c);
            if r < 0 {
                // SAFETY: never submitted, so no one else holds it.
                unsafe { (lib.rbd_aio_release)(c) };
                return Err(errno(r.into()));
            }
            // SAFETY: a submitted completion, released once after it completes.
            let ret = unsafe {
                (lib.rbd_aio_wait_for_complete)(c);
                let ret = (lib.rbd_aio_get_return_value)(c);
                (lib.rbd_aio_release)(c);
                ret
            };
            if ret < 0 {
                Err(errno(ret as i64))
            } else {
                Ok(ret as usize)
            }
        })
    }
}

impl Backend for RbdImage {
    fn start_async(&self, op: AsyncOp, done: AsyncDone) -> Result<(), AsyncDone> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(done);
        };
        let (offset, buf, write) = match op {
            AsyncOp::Read { offset, length } => (offset, vec![0u8; length as usize], None),
            // FUA: the blocking path (a write, then a flush).
            AsyncOp::Write { fua: true, .. } => return Err(done),
            AsyncOp::Write { offset, data, .. } => (offset, Vec::new(), Some(data)),
        };
        let is_read = write.is_none();
        let g = self.image.read().unwrap_or_else(|e| e.into_inner());
        let Some(h) = *g else {
            return Err(done); // closed: the blocking path reports it
        };
        let lib = self.cluster.lib;
        let mut pending = Box::new(Pending {
            lib,
            buf,
            write,
            runtime,
            done,
        });
        let (ptr, len) = match &pending.write {
            Some(w) => (w.bytes().as_ptr().cast_mut(), w.bytes().len()),
            None => (pending.buf.as_mut_ptr(), pending.buf.len()),
        };
        let arg = Box::into_raw(pending);
        let mut c: CompletionT = std::ptr::null_mut();
        // SAFETY: `arg` is handed to the completion, whose callback frees it; the
        // READ's buffer and the WRITE's data live in it (a Vec's heap block does not
        // move with the Box; `WriteData` is shared and immutable) until then, and
        // librbd only reads a WRITE's bytes; the image is open (read lock held).
        unsafe {
            let r = (lib.rbd_aio_create_completion)(arg.cast(), Some(on_complete), &mut c);
            let r = if r < 0 {
                r
            } else if is_read {
                (lib.rbd_aio_read)(h.0, offset, len, ptr.cast(), c)
            } else {
                (lib.rbd_aio_write)(h.0, offset, len, ptr.cast(), c)
            };
            if r < 0 {
                if !c.is_null() {
                    (lib.rbd_aio_release)(c);
                }
                pending = Box::from_raw(arg);
                return Err(pending.done);
            }
        }
        Ok(())
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        let ptr = buf.as_mut_ptr();
        // SAFETY: `buf` outlives the call, which waits for the completion.
        let n = self.wait(|lib, image, c| unsafe {
            (lib.rbd_aio_read)(image, offset, len, ptr.cast(), c)
        })?;
        buf[n.min(len)..].fill(0);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        // SAFETY: `data` outlives the call, which waits for the completion.
        self.wait(|lib, image, c| unsafe {
            (lib.rbd_aio_write)(image, offset, data.len(), data.as_ptr().cast(), c)
        })
        .map(|_| ())
    }

    fn flush(&self) -> io::Result<()> {
        // SAFETY: open image, waited-for completion.
        self.wait(|lib, image, c| unsafe { (lib.rbd_aio_flush)(image, c) })
            .map(|_| ())
    }

    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        // SAFETY: open image, waited-for completion.
        self.wait(|lib, image, c| unsafe { (lib.rbd_aio_discard)(image, offset, length, c) })
            .map(|_| ())
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        _may_punch: bool,
        _fast_only: bool,
    ) -> io::Result<()> {
        // librbd zeroes without sending zero bytes (whole objects are removed
        // or truncated, partial ones zeroed on the OSD): always fast.
        let len =
            usize::try_from(length).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: open image, waited-for completion.
        self.wait(|lib, image, c| unsafe {
            (lib.rbd_aio_write_zeroes)(image, offset, len, c, 0, 0)
        })
        .map(|_| ())
    }

    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let length = length.clamp(1, MAX_STATUS_RANGE);
        let end = offset + length;
        struct Collect {
            ranges: Vec<(u64, u64)>,
            overflow: bool,
        }
        unsafe extern "C" fn cb(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the Collect below, alive for the whole call.
            let c = unsafe { &mut *arg.cast::<Collect>() };
            if exists != 0 && len > 0 {
                if c.ranges.len() >= MAX_DIFF_RANGES {
                    c.overflow = true;
                    return -libc::ECANCELED;
                }
                c.ranges.push((off, off + len as u64));
            }
            0
        }
        let mut collect = Collect {
            ranges: Vec::new(),
            overflow: false,
        };
        let r = self.with(|lib, image| {
            // SAFETY: open image; `collect` outlives the synchronous iteration.
            Ok(unsafe {
                (lib.rbd_diff_iterate2)(
                    image,
                    std::ptr::null(),
                    offset,
                    length,
                    1, // include the parent's data (clones)
                    0, // exact extents, not whole objects
                    cb,
                    (&mut collect as *mut Collect).cast(),
                )
            })
        })?;
        if collect.overflow {
            return Ok(extents(offset, end, &[(offset, end)]));
        }
        if r < 0 {
            return Err(errno(r.into()));
        }
        let mut ranges = collect.ranges;
        ranges.sort_unstable();
        Ok(extents(offset, end, &ranges))
    }

    fn cache(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(()) // advisory; librbd has no prefetch call
    }
}

/// NBD extents covering `[offset, end)` from sorted (possibly overlapping)
/// allocated ranges: data where a range is, holes reading as zero elsewhere; at
/// most [`MAX_EXTENTS`] (the reply then covers a prefix).
fn extents(offset: u64, end: u64, ranges: &[(u64, u64)]) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut push = |from: u64, to: u64, flags: u32| {
        let mut from = from;
        while from < to && out.len() < MAX_EXTENTS {
            let n = (to - from).min(u32::MAX as u64 & !4095);
            match out.last_mut() {
                Some(last)
                    if last.flags == flags
                        && (last.length as u64 + n) <= u32::MAX as u64 & !4095 =>
                {
                    last.length += n as u32;
                }
                _ => out.push(Extent {
                    length: n as u32,
                    flags,
                }),
            }
            from += n;
        }
    };
    let mut pos = offset;
    for &(a, b) in ranges {
        let (a, b) = (a.max(pos), b.min(end));
        if b <= pos {
            continue;
        }
        if a > pos {
            push(pos, a, STATE_HOLE | STATE_ZERO);
        }
        push(a, b, 0);
        pos = b;
        if pos >= end {
            break;
        }
    }
    if pos < end {
        push(pos, end, STATE_HOLE | STATE_ZERO);
    }
    out
}

/// The error text of a failed librbd call on an image.
pub fn image_error(what: &str, pool: &str, name: &str, e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::EEXIST) => {
            " (an image of that name exists: another gateway's or an older volume's; remove it with `rbd rm` or choose another name)"
        }
        Some(libc::EBUSY) => " (another client has it open: `rbd status` names it)",
        Some(libc::ENOTEMPTY) => " (it has snapshots: `rbd snap purge`, after unprotecting them)",
        Some(libc::ENOENT) => " (no such image)",
        _ => "",
    };
    format!("{what} RBD image {pool}/{name}: {e}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(v: &[(u32, u32)]) -> Vec<Extent> {
        v.iter()
            .map(|&(length, flags)| Extent { length, flags })
            .collect()
    }

    #[test]
    fn extents_fill_holes_merge_overlaps_and_clip_to_the_range() {
        const H: u32 = STATE_HOLE | STATE_ZERO;
        assert_eq!(extents(0, 100, &[]), ext(&[(100, H)]));
        assert_eq!(
            extents(0, 100, &[(10, 20), (15, 30), (50, 200)]),
            ext(&[(10, H), (20, 0), (20, H), (50, 0)])
        );
        assert_eq!(extents(40, 60, &[(0, 45)]), ext(&[(5, 0), (15, H)]));
        assert_eq!(extents(0, 10, &[(0, 4), (4, 10)]), ext(&[(10, 0)]));
    }

    #[test]
    fn a_missing_library_is_a_clear_error_not_a_crash() {
        // Whatever this machine has, the answer is Ok or names the libraries.
        if let Err(e) = available() {
            assert!(
                e.contains(LIBRBD) && e.contains("apt install librbd1"),
                "{e}"
            );
        }
    }
}
