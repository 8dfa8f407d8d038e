//! The backend stack of a volume: one explicit order of layers, built in one
//! place from the pool's configuration, in the spirit of nbdkit's plugins and
//! filters (a plugin at the bottom, filters stacked above it, each seeing only
//! the calls of the one above).
//!
//! ```text
//!   QoS gate (crate::qos, one per pool: admission, tags, device depth)
//!     │
//!   emulated device   device.rs   `device = "…"`     timing only: a reply waits until
//!     │                                               the pool's weir-model array says
//!     │                                               the I/O is done (performed beside
//!     │                                               the layers below, one model per pool)
//!   flash cache       flash_cache.rs `flash_cache = {…}` + a volume's `cache = "flash"`:
//!     │                                               reads through a cache file on a
//!     │                                               fast device (weir-model's
//!     │                                               FlashCache decides), write-through
//!   hybrid tier       tier.rs     `tier = {…}`       a flash file in front of the files:
//!     │                                               extents placed by heat (weir-model's
//!     │                                               Placement decides), a migrator
//!     │                                               through the gate, a journal; each
//!     │                                               tier its own emulated device
//!   fault injection   fault.rs    `[[pools.faults]]` fails or delays chosen I/Os
//!     │
//!   bottom, one of:
//!     file            backend.rs  (default)          a sparse file per volume
//!     thin            thin.rs     `format = "thin"`  copy-on-write grain maps (weir-thin)
//!     upstream NBD    upstream.rs `upstream = "nbd://…"` a remote NBD server's export
//!     RBD             rbd.rs      `backend = "rbd"`  an RBD image per volume (librbd AIO)
//! ```
//!
//! Every layer but the device is a [`Backend`] wrapping the one below (the
//! device is a pool-wide queueing model whose completions the session awaits
//! beside the data I/O, so it stays in the session's perform path). A layer
//! that is not configured is absent, not a pass-through: a pool with no faults
//! runs the bottom backend directly.
//!
//! Why this order: the tier sits above the faults so a drill fails its disk
//! I/O (and migrations) as the disk's; the cache sits above the faults so a drill's failures reach
//! it as the backing store's (a failed miss fills nothing); faults sit above the bottom so a drill fails the volume as
//! its clients see it, whichever bottom it has; the device is on top so the
//! gate's released pieces (and their urgency) reach its model as they leave the
//! gate.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::{PoolBackend, PoolConfig, PoolFormat};
use crate::flash_cache::{FlashCacheDevice, VolumeCache};
use crate::tier::TierDevice;

/// Wraps a volume's bottom backend in the layers its pool configures, in the
/// stack's order (bottom first).
/// `cache`: the pool's flash cache, the volume's name and its `cache` setting
/// (`None`: the pool has no flash cache, or the export is a snapshot view).
pub fn build(
    pool: Option<&PoolConfig>,
    cache: Option<(&Arc<FlashCacheDevice>, &str, VolumeCache)>,
    tier: Option<(&Arc<TierDevice>, u32, &str)>,
    bottom: Arc<dyn Backend>,
) -> Arc<dyn Backend> {
    let Some(pool) = pool else {
        return bottom;
    };
    let below = crate::fault::wrap(bottom, &pool.faults);
    let below = match tier {
        Some((dev, id, volume)) => dev.wrap(id, volume, below),
        None => below,
    };
    match cache {
        Some((dev, volume, setting)) => dev.wrap(volume, setting, below),
        None => below,
    }
}

/// Checks the combination of layers a pool asks for; on error the key to blame
/// and the message.
pub fn validate_pool(p: &PoolConfig) -> Result<(), (&'static str, String)> {
    if let Some(fc) = &p.flash_cache {
        fc.validate().map_err(|e| ("flash_cache", e))?;
        if p.device.is_some() {
            return Err((
                "flash_cache",
                "not with an emulated device: the device sits above the cache and would time \
                 every hit as an array I/O (emulate the array on the upstream server instead)"
                    .into(),
            ));
        }
    }
    validate_tier(p)?;
    let target = p.upstream_target().map_err(|e| ("upstream", e))?;
    if target.is_some() {
        if p.format == PoolFormat::Thin {
            return Err((
                "upstream",
                "an upstream pool keeps no volume files: format = \"thin\" is for local pools"
                    .into(),
            ));
        }
        if p.direct_io {
            return Err((
                "direct_io",
                "not available on an upstream pool (its data is on the upstream server)".into(),
            ));
        }
    }
    validate_rbd(p)?;
    let max = crate::upstream::MAX_CONNECTIONS;
    if !(1..=max).contains(&p.upstream_connections) {
        return Err((
            "upstream_connections",
            format!("must be 1-{max}, got {}", p.upstream_connections),
        ));
    }
    let max = crate::upstream::MAX_TIMEOUT_S;
    if !(1..=max).contains(&p.upstream_timeout_s) {
        return Err((
            "upstream_timeout_s",
            format!("must be 1-{max}, got {}", p.upstream_timeout_s),
        ));
    }
    Ok(())
}

/// `tier`: a plain file pool, without a pool-wide device or a flash cache.
fn validate_tier(p: &PoolConfig) -> Result<(), (&'static str, String)> {
    let Some(t) = &p.tier else {
        return Ok(());
    };
    t.validate().map_err(|e| ("tier", e))?;
    let refuse = |key, why: &str| Err((key, format!("not with tier: {why}")));
    if p.device.is_some() {
        return refuse(
            "device",
            "each tier has its own emulated device (tier.flash_device, tier.disk_device)",
        );
    }
    if p.flash_cache.is_some() {
        return refuse("flash_cache", "the tier's flash already serves hot reads");
    }
    if p.upstream.is_some() || p.backend == PoolBackend::Rbd {
        return refuse("tier", "a hybrid pool keeps its disk tier in local files");
    }
    if p.format == PoolFormat::Thin {
        return refuse("format", "a hybrid pool's volumes are plain files");
    }
    Ok(())
}

/// The `rbd_*` keys: only in a pool with `backend = "rbd"`, which needs
/// `rbd_pool` and excludes the other bottoms and file-only options.
fn validate_rbd(p: &PoolConfig) -> Result<(), (&'static str, String)> {
    let rbd = p.backend == PoolBackend::Rbd;
    if !rbd {
        for (key, set) in [
            ("rbd_pool", p.rbd_pool.is_some()),
            ("rbd_ceph_conf", p.rbd_ceph_conf.is_some()),
            ("rbd_client", p.rbd_client.is_some()),
            ("rbd_keyring", p.rbd_keyring.is_some()),
            (
                "rbd_connect_timeout_s",
                p.rbd_connect_timeout_s != crate::rbd::DEFAULT_CONNECT_TIMEOUT_S,
            ),
        ] {
            if set {
                return Err((key, "only for a pool with backend = \"rbd\"".into()));
            }
        }
        return Ok(());
    }
    match p.rbd_pool.as_deref() {
        None => {
            return Err((
                "rbd_pool",
                "required with backend = \"rbd\": the RADOS pool holding the volumes' images"
                    .into(),
            ));
        }
        Some(name) if name.is_empty() || name.contains('\0') || name.len() > 255 => {
            return Err(("rbd_pool", format!("{name:?}: 1-255 bytes without NUL")));
        }
        Some(_) => {}
    }
    if let Some(c) = p.rbd_client.as_deref() {
        let bare = c.strip_prefix("client.").unwrap_or(c);
        if bare.is_empty()
            || !bare
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err((
                "rbd_client",
                format!("{c:?}: a Ceph client name such as \"admin\" or \"client.weir\""),
            ));
        }
    }
    let max = crate::rbd::MAX_CONNECT_TIMEOUT_S;
    if !(1..=max).contains(&p.rbd_connect_timeout_s) {
        return Err((
            "rbd_connect_timeout_s",
            format!("must be 1-{max}, got {}", p.rbd_connect_timeout_s),
        ));
    }
    if p.upstream.is_some() {
        return Err((
            "backend",
            "\"rbd\" and upstream = \"nbd://…\" are two different bottoms: choose one".into(),
        ));
    }
    if p.format == PoolFormat::Thin {
        return Err((
            "format",
            "format = \"thin\" is for file pools: an RBD pool's volumes are RBD images \
             (snapshots and clones are RBD's, docs/RBD.md)"
                .into(),
        ));
    }
    if p.direct_io {
        return Err((
            "direct_io",
            "not available on an RBD pool (its data is in the Ceph cluster)".into(),
        ));
    }
    Ok(())
}
