//! # weir-server — NBD storage server with the QoS engine in the I/O path
//!
//! One request: socket → `weir-nbd` decode + [`weir_nbd::validate`] → session
//! (export, client host, cost of the command) → [`qos::QosPool::submit`] (a
//! `weir_qos::Gate` per pool: host windows, tags, paced pieces, device depth
//! limit, limit timers) → the session performs each released piece on the
//! backend layer stack ([`stack`]: file, thin or upstream NBD at the bottom,
//! faults above, optionally beside an emulated device) → piece completed at the gate → reply encoded once the request's last
//! piece is done → writer task → socket.
//!
//! The request path avoids hand-offs: the session submits, the pool releases
//! inline what the gate allows, and READ/plain WRITE that the page cache can
//! serve without blocking (`RWF_NOWAIT`, or small buffered writes where the file
//! system lacks it) run on the calling thread; the rest goes to tokio's blocking
//! pool. A dispatcher thread per pool only handles limit timers (finer than the
//! runtime's 1 ms timer). Pool options:
//! `qos = false` bypasses the gate, `direct_io = true` opens volumes
//! `O_DIRECT` (slower on loopback, so off by default), `congestion = { … }`
//! enables datastore-wide congestion control (a `HostWindow` per client host),
//! `gateway_congestion = { … }` the gateway's own window on a datastore other
//! gateways share ([`datastore_stats`] shares their latency),
//! `device = "…"` emulates a device model, `trim_cost_factor` and
//! `zero_cost_factor` scale what TRIM and WRITE_ZEROES are charged, `[pools.depth]`
//! tunes the adaptive device depth under `max_in_flight`, `upstream = "nbd://…"`
//! makes the pool a gateway to another NBD server ([`upstream`]). Each volume's
//! backend is a layer stack built by [`stack`] (bottom file, thin or upstream;
//! faults and the emulated device above).
//!
//! Bounded whatever clients do ([`connections`], docs/HARDENING.md): a request
//! holds its connection's slot and data budget until its reply is written to
//! the socket (256 requests, 128 MiB per connection; `max_buffered_mib` per
//! host and in all); `max_connections` and `max_connections_per_host` (fitted
//! to the open-files limit; a client over a cap is refused with the reason);
//! `idle_timeout_s`; TCP keepalive ([`keepalive`]: a client whose host went
//! down is closed, its lease released); bogus declared lengths refused at once; accept errors backed
//! off and warnings rate-limited. `[[pools.faults]]` ([`fault`]) injects
//! errors and latency for tests and drills.
//! Security: NBD over TLS ([`tls`]: `tls = "off" | "on" | "require"`, X.509 with
//! rustls, client certificates whose subject CN access groups can require), and an
//! admin API behind [`admin_auth::AdminGuard`] (a bearer token made at first start
//! in `<data_dir>/admin-token`, own `Host` and `Origin` only, JSON bodies only).
//!
//! Entry points: [`serve`] (`weir serve`: runs until SIGINT/SIGTERM),
//! [`RunningServer::start`] (tests, embedding; install [`server::StopSignals`]
//! first when the process should stop cleanly on SIGTERM), [`WeirConfig`],
//! [`admin::Client`] (the CLI's `volume` and `policy` commands).

pub mod access;
pub mod admin;
pub mod admin_auth;
pub mod backend;
pub mod budget;
pub mod busy_poll;
pub mod capacity;
pub mod config;
pub mod connections;
pub mod dashboard;
pub mod datastore_stats;
pub mod device;
pub mod fault;
pub mod flash_cache;
pub mod history;
pub mod hosts;
pub mod keepalive;
pub mod lease;
pub mod metrics;
pub mod nbd_client;
pub mod qos;
pub mod rbd;
pub mod replicate;
pub mod sampler;
pub mod server;
pub mod session;
pub mod stack;
pub mod store;
pub mod systemd;
pub mod thin;
pub mod tier;
pub mod tls;
pub mod upstream;
pub mod within;

pub use config::{ConfigError, WeirConfig, parse_size};
pub use server::{RunningServer, ServerState, serve};
pub use store::{LeaseHolder, VolumeCreate, VolumeRecord, VolumeUpdate};

use std::future::Future;
use std::pin::Pin;

/// A future polled through a vtable.
pub type BoxedFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// [`RunningServer::start`] behind a vtable, for callers in other crates (the CLI).
///
/// The futures of an `async fn` (and every task they spawn) are compiled in each
/// crate that polls them, at that crate's optimisation level. The CLI is compiled at
/// opt-level 0 for build time, so it must not poll the server's futures itself: this
/// function creates the future here, where the session, QoS and admin code are
/// compiled at full optimisation, and the caller only sees `dyn Future`.
#[inline(never)]
pub fn start_boxed(config: WeirConfig) -> BoxedFuture<anyhow::Result<RunningServer>> {
    Box::pin(RunningServer::start(config))
}

/// [`RunningServer::shutdown`] behind a vtable (see [`start_boxed`]).
#[inline(never)]
pub fn shutdown_boxed(server: RunningServer) -> BoxedFuture<anyhow::Result<()>> {
    Box::pin(server.shutdown())
}
