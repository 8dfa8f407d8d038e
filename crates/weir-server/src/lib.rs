//! # weir-server — NBD storage server with the QoS engine in the I/O path
//!
//! One request: socket → `weir-nbd` decode + [`weir_nbd::validate`] → session
//! (export, client host) → [`qos::QosPool::submit`] (a `weir_qos::Scheduler`
//! per pool) → dispatch (tags, concurrency bound, limit timers) → backend layer
//! chain ([`backend::Backend`]: file today, emulated device later) → completion
//! reported to the scheduler → reply encoded → writer task → socket.
//!
//! Entry points: [`serve`] (`weir serve`: runs until SIGINT/SIGTERM),
//! [`RunningServer::start`] (tests, embedding), [`WeirConfig`],
//! [`admin::Client`] (the CLI's `volume` and `policy` commands).

pub mod access;
pub mod admin;
pub mod backend;
pub mod config;
pub mod device;
pub mod metrics;
pub mod nbd_client;
pub mod qos;
pub mod server;
pub mod session;
pub mod store;

pub use config::{ConfigError, WeirConfig, parse_size};
pub use server::{RunningServer, ServerState, serve};
pub use store::{VolumeCreate, VolumeRecord, VolumeUpdate};
