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
//!   fault injection   fault.rs    `[[pools.faults]]` fails or delays chosen I/Os
//!     │
//!   bottom, one of:
//!     file            backend.rs  (default)          a sparse file per volume
//!     thin            thin.rs     `format = "thin"`  copy-on-write grain maps (weir-thin)
//!     upstream NBD    upstream.rs `upstream = "nbd://…"` a remote NBD server's export
//! ```
//!
//! Every layer but the device is a [`Backend`] wrapping the one below (the
//! device is a pool-wide queueing model whose completions the session awaits
//! beside the data I/O, so it stays in the session's perform path). A layer
//! that is not configured is absent, not a pass-through: a pool with no faults
//! runs the bottom backend directly.
//!
//! Why this order: faults sit above the bottom so a drill fails the volume as
//! its clients see it, whichever bottom it has; the device is on top so the
//! gate's released pieces (and their urgency) reach its model as they leave the
//! gate.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::{PoolConfig, PoolFormat};

/// Wraps a volume's bottom backend in the layers its pool configures, in the
/// stack's order (bottom first).
pub fn build(pool: Option<&PoolConfig>, bottom: Arc<dyn Backend>) -> Arc<dyn Backend> {
    let Some(pool) = pool else {
        return bottom;
    };
    crate::fault::wrap(bottom, &pool.faults)
}

/// Checks the combination of layers a pool asks for; on error the key to blame
/// and the message.
pub fn validate_pool(p: &PoolConfig) -> Result<(), (&'static str, String)> {
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
