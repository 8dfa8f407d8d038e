//! `WeirConfig`: listeners, data directory, pools, policies, access groups and
//! volumes, read from TOML. Errors name the file, the line and the field.
//!
//! ```toml
//! listen = "127.0.0.1:10809"        # NBD (default)
//! admin_listen = "127.0.0.1:10810"  # admin HTTP API (default); every request needs the
//!                                   # token in data_dir/admin-token (made at first start)
//! # admin_hosts = ["weir.example"]  # names accepted in Host/Origin besides IP literals
//!                                   # and localhost (reaching the API by a DNS name)
//! admin_max_connections = 128       # admin API connections at once (8-65,536; also
//!                                   # bounded by the open-files limit)
//! admin_max_connections_per_host = 16  # … from one client address (1 to the cap);
//!                                   # over either: 503 and closed at once
//! data_dir = "/var/lib/weir"        # default: $XDG_DATA_HOME/weir, ~/.local/share/weir, ./weir-data
//! busy_poll_us = 200                # poll a socket this long before sleeping while its
//!                                   # client waits on its last reply (QD1); 0: off
//! zero_copy_reads = "auto"          # READs of ≥ 64 KiB from the page cache go out with
//!                                   # sendfile(2): "auto" (default) to clients on other
//!                                   # machines only (a client on this one pays more to
//!                                   # receive them than copied data), "on", "off"
//! # worker_threads = 1              # async runtime threads (default: half the CPUs)
//! max_connections = 1024            # NBD connections at once (also bounded by the
//!                                   # open-files limit, raised toward its hard limit)
//! max_connections_per_host = 256    # … from one client address; a client over a cap
//!                                   # is refused with NBD_REP_ERR_POLICY and the reason
//! max_buffered_mib = 2048           # READ/WRITE data held at once (payloads read, replies
//! max_buffered_mib_per_host = 512   # not yet written), in all and per client address
//!                                   # (its requests to one pool at most half of it);
//!                                   # each connection also at most 128 MiB, 256 requests
//! idle_timeout_s = 0                # close a connection whose client sends nothing and
//!                                   # awaits nothing (or reads no reply) this long; 0: off
//! tcp_keepalive_s = 60              # probe a connection idle this long; one whose client
//!                                   # stopped answering (host down), idle or being sent
//!                                   # replies, is closed about twice this after its last
//!                                   # answer; 0: off
//! # tls = "require"                 # NBD over TLS: "off" (default), "on" (offered),
//!                                   # "require" (no option but STARTTLS before TLS)
//! # tls_cert = "server-cert.pem"    # PEM server certificate chain (tls on/require)
//! # tls_key = "server-key.pem"      # PEM private key (PKCS#8, PKCS#1 or SEC1)
//! # tls_client_ca = "ca-cert.pem"   # ask clients for a certificate signed by this CA:
//!                                   # its subject CN is the client's identity, which
//!                                   # access groups can require (`identities`)
//!
//! [[pools]]
//! name = "default"                  # a directory data_dir/pools/<name> of sparse files
//! max_in_flight = 64                # most I/Os (pieces) the pool's QoS gate keeps at the
//!                                   # backend: the ceiling of the adaptive depth below
//! # trim_cost_factor = 1.0          # a TRIM is charged its length times this (0-1)
//! # zero_cost_factor = 1.0          # a WRITE_ZEROES is charged its length times this (0-1)
//! # device = "15k-sas-raid5x24"     # emulated device: I/Os complete no earlier than this
//!                                   # weir-model array says (any of weir_model::ARRAY_PRESETS,
//!                                   # or a table as the simulator's [array]: device =
//!                                   # { controller = "pcie-gen2", drive = "sata-7200",
//!                                   # raid = { level = 10, drives = 16,
//!                                   # stripe_element_bytes = 65536 } })
//! # congestion = { enabled = true, threshold_ms = 30 }
//!                                   # datastore-wide congestion control: a window per
//!                                   # client host (PARDA), threshold 5-100 ms; optional
//!                                   # gamma, min_window, max_window, period_ms (1-60000),
//!                                   # beta_per_1000_shares
//! # gateway_congestion = { enabled = true, threshold_ms = 30, period_ms = 250 }
//!                                   # this gateway's window on a datastore other
//!                                   # gateways share (one Ceph pool, one upstream
//!                                   # array): pieces at the backend follow the device
//!                                   # latency it sees, beta from its active volumes'
//!                                   # shares (PARDA; docs/QOS.md); same keys, and
//!                                   # fair_rate (default true here): with the stats
//!                                   # volume, a gateway served beyond its part of
//!                                   # what the datastore delivers is paced to it
//!                                   # (for devices that serve clients in turn, as
//!                                   # Ceph OSDs: weir_qos::fair_rate)
//! # gateway_stats_volume = "sioc"   # with gateway_id = 0-127 (unique per gateway): a
//! # gateway_id = 0                  # volume of this pool on the shared datastore
//!                                   # (>= 8 KiB) where the gateways share latency, so
//!                                   # every window steps with the datastore-wide mean
//! # qos = false                     # bypass the QoS scheduler (default true); at most
//!                                   # max_in_flight requests still run at once
//! # direct_io = true                # O_DIRECT for aligned requests (default false)
//!
//! # [pools.depth]                   # adaptive device depth (these are the defaults): the
//! # adaptive = true                 # in-flight limit shrinks (x decrease per period) while
//! # min_depth = 4                   # more than over_target_budget of a protected volume's
//! # period_ms = 100                 # requests (mission-/business-critical with a latency
//! # over_target_budget = 0.25       # target) take longer than the target at the backend,
//! # over_twice_budget = 0.01        # or over_twice_budget longer than twice it, and grows
//! # decrease = 0.85                 # back to max_in_flight when they do not
//! # share_aware = true              # also at most the depth at which every active
//! # share_floor = 0.7               # volume's demand covers its share of it (volumes
//! #                                 # whose bound is under share_floor x max_in_flight
//! #                                 # do not count): shares need a queue to act
//! # anticipate_us = 500             # meanwhile, hold a freed slot this long for its
//! #                                 # volume's next request (0-100000; 0: off)
//!
//! # [[pools.faults]]                # fault injection (tests, drills; see `fault`):
//! # kind = "eio"                    # eio | enospc | latency (with latency_ms = …)
//! # ops = ["write"]                 # read write flush trim zero cache block_status
//! # every = 100                     # every 100th matching I/O, or rate = 0.01 (seed = …)
//!
//! # [[pools]]                       # gateway mode (crate::upstream, docs/GATEWAY.md):
//! # name = "san"                    # volumes are exports of an NBD server (the
//! # upstream = "nbd://storage1"     # volume's name or its `export`), sized by it
//! # upstream_connections = 4        # 1-64 per volume, requests pipelined over them
//! # upstream_timeout_s = 30         # per request, retries after reconnects included
//! # upstream_exclusive = "lease"    # with a flash_cache: take each export's exclusive
//! #                                 # lease on a weir upstream (others' writes refused;
//! #                                 # no lease: the cache reads through), or "assume"
//! #                                 # (nothing else writes them: nbdkit, qemu-nbd)
//! # upstream = "nbds://storage1"    # the same over TLS (STARTTLS required):
//! # upstream_tls_ca = "ca.pem"      # the CA the upstream's certificate chains to
//! #                                 # (it must also name the host)
//! # upstream_tls_cert = "gw.pem"    # optional client certificate and key: the
//! # upstream_tls_key = "gw-key.pem" # gateway's identity for the upstream's groups
//! # flash_cache = { dir = "/nvme/weir", size = "64GiB" }  # flash read cache for the
//! #                                 # pool's volumes with cache = "flash" (any pool but
//! #                                 # one with a device; crate::flash_cache,
//! #                                 # docs/FLASH_CACHE.md); also block = "4KiB",
//! #                                 # scan_cutoff = "4MiB" (0: admit sequential scans)
//! # tier = { flash_dir = "/nvme/weir", flash_size = "8GiB" }  # hybrid pool: a flash
//! #                                 # tier in front of the pool's files (a file pool
//! #                                 # without device or flash_cache; crate::tier,
//! #                                 # docs/HYBRID.md); also extent = "1MiB",
//! #                                 # flash_device / disk_device (emulated, as device),
//! #                                 # promote_heat = 3, half_life_s = 60,
//! #                                 # migration_mbps = 200, moves_in_flight = 4,
//! #                                 # dirty_max (flash_size / 4)
//!
//! # [[pools]]                       # Ceph RBD (crate::rbd, docs/RBD.md): each volume
//! # name = "ceph"                   # is an RBD image of its name; librbd is loaded at
//! # backend = "rbd"                 # start (default backend "file")
//! # rbd_pool = "rbd"                # the RADOS pool (required)
//! # rbd_ceph_conf = "/etc/ceph/ceph.conf"  # default: $CEPH_CONF, /etc/ceph/ceph.conf
//! # rbd_client = "admin"            # Ceph client name, "client." implied
//! # rbd_keyring = "/etc/ceph/ceph.client.admin.keyring"  # default: the conf's keyring
//! # rbd_connect_timeout_s = 30      # connecting at start (1-3600)
//!
//! [[policies]]                      # user-defined, beside the five built-ins
//! name = "gold"
//! reservation_iops = 5000
//! limit_iops = 20000
//!
//! [[access_groups]]
//! name = "lab"
//! hosts = ["127.0.0.1", "::1", "10.1.0.0/16"]
//! # identities = ["backup-host"]    # and (if present) a TLS client certificate
//!                                   # with one of these CNs
//!
//! [[volumes]]
//! name = "sql"
//! size = "10GiB"                    # or a number of bytes
//! policy = "mission-critical"
//! pool = "default"                  # default "default"
//! access_groups = ["lab"]           # empty or absent: every host may reach it
//! read_only = false
//! description = "OLTP database"     # at most 4096 bytes, no control characters
//! # export = "sql-lun"              # upstream pools: the upstream export (size optional)
//! # cache = "flash"                 # read through the pool's flash_cache (default "none")
//!
//! [[replications]]                  # asynchronous replication of a thin volume
//! volume = "db"                     # (in a pool with format = "thin")
//! to = "nbd://dr-site:10809/db"     # any NBD target at least the volume's size
//! every = "5m"                      # a cycle (snapshot, ship changes, flush) this often
//! # overwrite = true                 # the target holds data the first copy may write over
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weir_qos::{CongestionConfig, DepthConfig, Policy, PolicyCatalog};

use crate::access::HostPattern;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:10810";
pub const DEFAULT_POOL: &str = "default";
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeirConfig {
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    #[serde(default = "default_admin_listen")]
    pub admin_listen: SocketAddr,
    /// Host names the admin API answers to (its `Host` and `Origin` headers),
    /// beside IP literals and `localhost`: anything else is refused, so a web
    /// page cannot reach the API through DNS rebinding.
    #[serde(default)]
    pub admin_hosts: Vec<String>,
    /// Admin API connections open at once (over it: 503 and closed); lowered at
    /// start to what the open-files limit leaves room for, never below
    /// [`MIN_ADMIN_CONNECTIONS`].
    #[serde(default = "default_admin_max_connections")]
    pub admin_max_connections: u32,
    /// … from one client address.
    #[serde(default = "default_admin_max_connections_per_host")]
    pub admin_max_connections_per_host: u32,
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    #[serde(default = "default_pools")]
    pub pools: Vec<PoolConfig>,
    #[serde(default)]
    pub policies: Vec<Policy>,
    #[serde(default)]
    pub access_groups: Vec<AccessGroupConfig>,
    #[serde(default)]
    pub volumes: Vec<VolumeConfig>,
    /// Longest a connection polls its socket, in microseconds, before its thread
    /// sleeps while the client waits on its last reply (0: never poll; see
    /// `busy_poll`). Costs CPU only while a client is actively waiting on us.
    #[serde(default = "default_busy_poll_us")]
    pub busy_poll_us: u32,
    /// Large READs from the page cache sent with `sendfile(2)`: to which clients.
    #[serde(default)]
    pub zero_copy_reads: ZeroCopyReads,
    /// Threads of the async runtime that runs the connections (sockets, QoS, I/O
    /// served from the page cache); blocking I/O has its own pool. Absent: half the
    /// CPUs, at least one ([`WeirConfig::worker_threads`]).
    #[serde(default)]
    pub worker_threads: Option<u32>,
    /// NBD connections served at once (those beyond are refused with the reason);
    /// lowered at start to what the open-files limit leaves room for.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// NBD connections one client address may have at once.
    #[serde(default = "default_max_connections_per_host")]
    pub max_connections_per_host: u32,
    /// READ/WRITE data (payloads read, replies not yet written) all connections
    /// may hold at once, MiB; requests beyond it wait before they are read.
    #[serde(default = "default_max_buffered_mib")]
    pub max_buffered_mib: u32,
    /// … the connections of one client address.
    #[serde(default = "default_max_buffered_mib_per_host")]
    pub max_buffered_mib_per_host: u32,
    /// Seconds a connection may stay idle (no request read while none is
    /// unanswered, or no reply written while some are) before it is closed;
    /// 0: never. Off by default: the Linux kernel's NBD client does not reconnect.
    #[serde(default)]
    pub idle_timeout_s: u32,
    /// TCP keepalive of NBD connections (`crate::keepalive`): the first probe
    /// after this many seconds with nothing received; a client that stops
    /// answering (its host down) is closed about twice this after its last
    /// answer, giving back its connection, budgets and lease: by keepalive
    /// when idle, by the dead-peer watch (`keepalive::PeerWatch`) when it was
    /// being sent replies or had closed its window. 0: off (both).
    #[serde(default = "default_tcp_keepalive_s")]
    pub tcp_keepalive_s: u32,
    /// NBD over TLS (`NBD_OPT_STARTTLS`): off, offered, or required.
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM certificate chain the server presents (TLS on or required).
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): clients may present a certificate it signed; the
    /// subject CN becomes the connection's identity (access groups' `identities`).
    #[serde(default)]
    pub tls_client_ca: Option<PathBuf>,
    /// Asynchronous replication of thin volumes to NBD targets
    /// (`[[replications]]`, docs/THIN.md "Replication").
    #[serde(default)]
    pub replications: Vec<ReplicationConfig>,
}

/// `zero_copy_reads = "auto" | "on" | "off"`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZeroCopyReads {
    /// To clients on other machines: a client on this one (loopback, or our own
    /// address) receives copied data at less cost than page-cache pages.
    #[default]
    Auto,
    /// To every client.
    On,
    /// To none: large READs are read into a buffer and copied.
    Off,
}

impl ZeroCopyReads {
    /// Whether a client on this machine (`same_host`) is sent page-cache pages.
    pub fn applies(self, same_host: bool) -> bool {
        match self {
            ZeroCopyReads::Auto => !same_host,
            ZeroCopyReads::On => true,
            ZeroCopyReads::Off => false,
        }
    }
}

/// `tls = "off" | "on" | "require"`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// No TLS: STARTTLS is refused as unsupported.
    #[default]
    Off,
    /// TLS offered: clients choose (libnbd's `nbds://` and qemu's `tls-creds` do).
    On,
    /// Every client must upgrade before any other option (FORCEDTLS).
    Require,
}

impl TlsMode {
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        }
    }

    /// `off`, `on` or `require` (the command line's `--tls`).
    pub fn parse(text: &str) -> Result<TlsMode, String> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            _ => Err(format!("tls must be off, on or require, not {text:?}")),
        }
    }
}

/// `[[replications]]`: ship a thin volume's changes to an NBD target every
/// `every` (snapshot-based; see `crate::replicate`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationConfig {
    /// A volume in a pool with `format = "thin"`.
    pub volume: String,
    /// `nbd://HOST[:PORT]/EXPORT` (port 10809 by default).
    pub to: String,
    /// Time between cycles: `"30s"`, `"5m"`, `"1h"`, `"1h30m"`, or seconds
    /// (`300` or `"300"`).
    #[serde(deserialize_with = "text_or_integer")]
    pub every: String,
    /// The target may hold data that the first full copy writes over (without
    /// it, a target found holding data is refused).
    #[serde(default)]
    pub overwrite: bool,
}

/// A string, or an integer taken as its decimal text (`every = 300`).
fn text_or_integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration like \"5m\" or a number of seconds")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(V)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// Cost unit of the pool's scheduler (bytes per I/O against IOPS figures).
    #[serde(default)]
    pub cost_unit_bytes: Option<u32>,
    /// A TRIM is charged its length times this (0-1, default 1: as a write).
    #[serde(default = "default_cost_factor")]
    pub trim_cost_factor: f64,
    /// A WRITE_ZEROES is charged its length times this (0-1, default 1).
    #[serde(default = "default_cost_factor")]
    pub zero_cost_factor: f64,
    /// The adaptive device depth (`[pools.depth]`): how many pieces the pool keeps
    /// at the backend, between `min_depth` and `max_in_flight`, shrinking while a
    /// protected volume misses its latency target at the device.
    #[serde(default)]
    pub depth: DepthConfig,
    /// Emulated device (a `weir_model::ARRAY_PRESETS` name or an `ArraySpec` table,
    /// as the simulator's `[array]`): READ/WRITE replies wait until the model
    /// completes them; data still goes to the pool's files.
    #[serde(default)]
    pub device: Option<weir_model::ArrayRef>,
    /// Datastore-wide congestion control: a window per client host, adapted every
    /// period to the pool's mean latency against `threshold_ms` (absent: off).
    #[serde(default)]
    pub congestion: Option<CongestionConfig>,
    /// This gateway's window on a datastore other gateways share (one Ceph pool, one
    /// upstream array): the pool's pieces at the backend adapt every period to the
    /// device latency it observes against `threshold_ms`, with `β` from the shares
    /// of its active volumes (absent: off; needs `qos`). `fair_rate` is on unless
    /// the table turns it off (`weir_qos::fair_rate`: needs `gateway_stats_volume`).
    #[serde(default, deserialize_with = "gateway_congestion")]
    pub gateway_congestion: Option<CongestionConfig>,
    /// A volume of this pool, on the shared datastore, through which the gateways
    /// share their latency (`crate::datastore_stats`): the windows step with the
    /// datastore-wide mean, as SIOC's do. Absent: each gateway uses its own.
    #[serde(default)]
    pub gateway_stats_volume: Option<String>,
    /// This gateway's slot in the stats volume (0-127, unique per gateway).
    #[serde(default)]
    pub gateway_id: Option<u32>,
    /// `false`: requests bypass the QoS scheduler (benchmarks, pass-through pools);
    /// at most `max_in_flight` of them are performed at once all the same.
    #[serde(default = "default_true")]
    pub qos: bool,
    /// Open the pool's volume files with `O_DIRECT` (aligned requests skip the
    /// page cache; unaligned ones fall back to buffered I/O). Default off: on
    /// loopback benchmarks buffered I/O measured faster (docs/PERFORMANCE.md).
    #[serde(default)]
    pub direct_io: bool,
    /// Fault injection on the pool's volumes (`[[pools.faults]]`; see `fault`).
    #[serde(default)]
    pub faults: Vec<crate::fault::FaultRule>,
    /// How the pool stores volumes: `"file"` (a sparse file per volume, the
    /// default) or `"thin"` (copy-on-write grain maps: snapshots, linked clones,
    /// rollback, flatten; docs/THIN.md).
    #[serde(default)]
    pub format: PoolFormat,
    /// Thin pools: memory for the clone-aware read cache (grains of snapshots and
    /// golden images, cached once for all their clones). Default 0 (off): the
    /// kernel's page cache already holds one copy of a shared layer for all its
    /// clones and measured faster for small random reads (docs/THIN.md).
    #[serde(default = "default_clone_cache")]
    pub clone_cache: ByteSize,
    /// A flash read cache for the pool's volumes with `cache = "flash"`
    /// (`flash_cache = { dir = "/fast/weir", size = "64GiB" }`; crate::flash_cache,
    /// docs/FLASH_CACHE.md). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_cache: Option<crate::flash_cache::FlashCacheConfig>,
    /// A hybrid pool: a flash tier in front of the pool's files, extents placed
    /// by heat (`tier = { flash_dir = "/nvme/weir", flash_size = "8GiB" }`;
    /// crate::tier, docs/HYBRID.md). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::tier::TierConfig>,
    /// Gateway mode: the pool's volumes live on a remote NBD server
    /// (`nbd://HOST[:PORT]`); each volume is the upstream export of its name, or
    /// its `export` (crate::upstream, docs/GATEWAY.md).
    #[serde(default)]
    pub upstream: Option<String>,
    /// Upstream pools: connections per volume to the upstream (requests are
    /// pipelined over them).
    #[serde(default = "default_upstream_connections")]
    pub upstream_connections: u32,
    /// Upstream pools: how long a request may take, retries after reconnects
    /// included, before it fails with EIO.
    #[serde(default = "default_upstream_timeout_s")]
    pub upstream_timeout_s: u32,
    /// Upstream pools with a flash cache: how the cache knows that nobody else
    /// writes the exports behind it (`crate::lease`).
    #[serde(default)]
    pub upstream_exclusive: UpstreamExclusive,
    /// `upstream = "nbds://…"`: the CA (PEM) the upstream's certificate must chain
    /// to; the certificate must also name the upstream's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_tls_ca: Option<PathBuf>,
    /// `nbds://`: a client certificate (PEM) and its key to present, the
    /// gateway's identity for the upstream's access groups. Both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_tls_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_tls_key: Option<PathBuf>,
    /// Where the pool keeps its volumes: `"file"` (the default: files under
    /// data_dir, of the pool's `format`) or `"rbd"` (an RBD image per volume in
    /// a Ceph cluster, crate::rbd, docs/RBD.md).
    #[serde(default)]
    pub backend: PoolBackend,
    /// RBD pools: the RADOS pool holding the images (required).
    #[serde(default)]
    pub rbd_pool: Option<String>,
    /// RBD pools: the Ceph configuration file (default: librados' search,
    /// `$CEPH_CONF` then /etc/ceph/ceph.conf).
    #[serde(default)]
    pub rbd_ceph_conf: Option<PathBuf>,
    /// RBD pools: the Ceph client name, `client.` implied (default "admin").
    #[serde(default)]
    pub rbd_client: Option<String>,
    /// RBD pools: the client's keyring (default: the configuration's `keyring`).
    #[serde(default)]
    pub rbd_keyring: Option<PathBuf>,
    /// RBD pools: how long connecting to the cluster (and each monitor
    /// command) may take at start, in seconds.
    #[serde(default = "default_rbd_connect_timeout_s")]
    pub rbd_connect_timeout_s: u32,
}

/// Where a pool keeps its volumes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolBackend {
    #[default]
    File,
    Rbd,
}

fn default_rbd_connect_timeout_s() -> u32 {
    crate::rbd::DEFAULT_CONNECT_TIMEOUT_S
}

impl PoolConfig {
    /// The pool's upstream (`upstream = "nbd://…"` or `"nbds://…"`), parsed, with
    /// its TLS settings read (certificate files included).
    pub fn upstream_target(&self) -> Result<Option<crate::upstream::UpstreamTarget>, String> {
        // The first TLS setting given, for a pool that cannot use it.
        let stray = [
            ("upstream_tls_ca", &self.upstream_tls_ca),
            ("upstream_tls_cert", &self.upstream_tls_cert),
            ("upstream_tls_key", &self.upstream_tls_key),
        ]
        .into_iter()
        .find_map(|(key, v)| v.is_some().then_some(key));
        let Some(text) = self.upstream.as_deref() else {
            return match stray {
                Some(key) => Err(format!(
                    "{key}: only for a pool with upstream = \"nbds://…\""
                )),
                None => Ok(None),
            };
        };
        let mut target = crate::upstream::UpstreamTarget::parse(text)?;
        if !target.secure {
            return match stray {
                Some(key) => Err(format!(
                    "{key}: the upstream {text:?} is plain text; TLS needs nbds://"
                )),
                None => Ok(Some(target)),
            };
        }
        let Some(ca) = &self.upstream_tls_ca else {
            return Err(format!(
                "{text:?}: nbds:// needs upstream_tls_ca (the CA that signed the upstream's \
                 certificate)"
            ));
        };
        let cert_key = match (&self.upstream_tls_cert, &self.upstream_tls_key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            (None, None) => None,
            _ => return Err("upstream_tls_cert and upstream_tls_key go together".into()),
        };
        let config =
            crate::tls::upstream_client_config(ca, cert_key).map_err(|e| format!("{e:#}"))?;
        target.tls = Some(crate::upstream::UpstreamTls(config));
        Ok(Some(target))
    }

    /// An RBD pool's cluster and RADOS pool (`None`: not an RBD pool).
    pub fn rbd_target(&self) -> Option<crate::rbd::RbdTarget> {
        (self.backend == PoolBackend::Rbd).then(|| crate::rbd::RbdTarget {
            pool: self.rbd_pool.clone().unwrap_or_default(),
            conf: self.rbd_ceph_conf.clone(),
            client: self
                .rbd_client
                .as_deref()
                .map(|c| c.strip_prefix("client.").unwrap_or(c).to_string())
                .unwrap_or_else(|| crate::rbd::DEFAULT_CLIENT.to_string()),
            keyring: self.rbd_keyring.clone(),
            connect_timeout_s: self.rbd_connect_timeout_s,
        })
    }
}

fn default_upstream_connections() -> u32 {
    crate::upstream::DEFAULT_CONNECTIONS
}
/// A caching upstream pool's `upstream_exclusive`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamExclusive {
    /// Each volume's connections take a `weir:exclusive` lease on the upstream
    /// (a weir server): while it is held the upstream refuses everybody else's
    /// writes; without it (refused, or an upstream that grants none) the cache
    /// reads through.
    #[default]
    Lease,
    /// The operator guarantees that nothing else writes the exports (an
    /// upstream that has no leases, such as nbdkit or qemu-nbd).
    Assume,
}

fn default_upstream_timeout_s() -> u32 {
    crate::upstream::DEFAULT_TIMEOUT_S
}

/// A pool's volume format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolFormat {
    #[default]
    File,
    Thin,
}

fn default_clone_cache() -> ByteSize {
    ByteSize(0)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessGroupConfig {
    pub name: String,
    /// Addresses or CIDRs (`10.0.0.0/8`, `::1`), or `*` for any host.
    pub hosts: Vec<String>,
    /// TLS client identities (certificate subject CNs, see `tls_client_ca`); not
    /// empty: a client must also present a certificate with one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    /// Required, except in an upstream pool (the size is the upstream export's;
    /// if given it must match).
    #[serde(default)]
    pub size: ByteSize,
    pub policy: String,
    #[serde(default = "default_pool_name")]
    pub pool: String,
    #[serde(default)]
    pub access_groups: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub description: String,
    /// Upstream pools: the upstream export this volume is (default: its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<String>,
    /// `"flash"`: reads go through the pool's `flash_cache`; `"none"` (default).
    #[serde(default)]
    pub cache: crate::flash_cache::VolumeCache,
}

/// A size in bytes; in TOML a number or a string like `"10GiB"`, `"512MB"`, `"4k"`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than an untagged enum: no buffering of the value through
        // serde's generic `Content` (less code per deserializer, clearer errors).
        struct SizeVisitor;
        impl serde::de::Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: a number of bytes or a string like \"10GiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, bytes: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(bytes))
            }
            fn visit_i64<E: serde::de::Error>(self, bytes: i64) -> Result<ByteSize, E> {
                u64::try_from(bytes)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("size {bytes} is negative")))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ByteSize, E> {
                // A quoted number is more likely "20" meant as 20 GiB than 20 bytes
                // (the CLI refuses `--size 20` for that reason): bytes are a TOML
                // integer.
                let t = text.trim();
                if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
                    return Err(E::custom(format!(
                        "size {text:?} has no unit: write \"{t}GiB\" (or G, MiB, TB, …), or {t} without quotes for bytes"
                    )));
                }
                parse_size(text).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(SizeVisitor)
    }
}

/// Parses `"10GiB"`, `"1.5 GB"`, `"4k"`, `"4096"`: binary suffixes (KiB, MiB, GiB,
/// TiB, and bare K/M/G/T) are powers of 1024, decimal ones (KB, MB, GB, TB) of 1000.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("size {text:?} does not start with a number"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "size {text:?} has an unknown unit {other:?} (use B; K, M, G, T or KiB, MiB, GiB, TiB for powers of 1024; KB, MB, GB, TB for powers of 1000)"
            ));
        }
    };
    let bytes = number * multiplier;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("size {text:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("constant address")
}
fn default_admin_listen() -> SocketAddr {
    DEFAULT_ADMIN_LISTEN.parse().expect("constant address")
}
fn default_max_in_flight() -> u32 {
    DEFAULT_MAX_IN_FLIGHT
}
fn default_tcp_keepalive_s() -> u32 {
    60
}
fn default_max_buffered_mib() -> u32 {
    crate::connections::DEFAULT_MAX_BUFFERED_MIB
}
fn default_max_buffered_mib_per_host() -> u32 {
    crate::connections::DEFAULT_MAX_BUFFERED_MIB_PER_HOST
}
fn default_max_connections() -> u32 {
    crate::connections::DEFAULT_MAX_CONNECTIONS
}
fn default_max_connections_per_host() -> u32 {
    crate::connections::DEFAULT_MAX_CONNECTIONS_PER_HOST
}
fn default_admin_max_connections() -> u32 {
    weir_http::Limits::ADMIN.max_connections as u32
}
fn default_admin_max_connections_per_host() -> u32 {
    weir_http::Limits::ADMIN.max_per_address as u32
}
fn default_busy_poll_us() -> u32 {
    crate::busy_poll::DEFAULT_BUSY_POLL_US
}
fn default_cost_factor() -> f64 {
    1.0
}
/// `gateway_congestion` with `fair_rate` on unless the table says otherwise: a
/// gateway's datastore may serve its clients in turn (Ceph OSDs do), where windows
/// alone do not divide the I/Os; on one that serves by outstanding count the rate
/// agrees with the windows.
fn gateway_congestion<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<CongestionConfig>, D::Error> {
    let Some(mut table) = Option::<toml::Table>::deserialize(d)? else {
        return Ok(None);
    };
    table
        .entry("fair_rate")
        .or_insert(toml::Value::Boolean(true));
    CongestionConfig::deserialize(toml::Value::Table(table))
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn default_true() -> bool {
    true
}
fn default_pool_name() -> String {
    DEFAULT_POOL.to_string()
}
pub(crate) fn default_pools() -> Vec<PoolConfig> {
    vec![PoolConfig {
        name: DEFAULT_POOL.into(),
        max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        cost_unit_bytes: None,
        trim_cost_factor: 1.0,
        zero_cost_factor: 1.0,
        depth: DepthConfig::default(),
        device: None,
        congestion: None,
        gateway_congestion: None,
        gateway_stats_volume: None,
        gateway_id: None,
        qos: true,
        direct_io: false,
        faults: Vec::new(),
        format: PoolFormat::File,
        clone_cache: default_clone_cache(),
        flash_cache: None,
        tier: None,
        upstream: None,
        upstream_connections: default_upstream_connections(),
        upstream_timeout_s: default_upstream_timeout_s(),
        upstream_exclusive: UpstreamExclusive::Lease,
        upstream_tls_ca: None,
        upstream_tls_cert: None,
        upstream_tls_key: None,
        backend: PoolBackend::File,
        rbd_pool: None,
        rbd_ceph_conf: None,
        rbd_client: None,
        rbd_keyring: None,
        rbd_connect_timeout_s: default_rbd_connect_timeout_s(),
    }]
}

/// `$XDG_DATA_HOME/weir`, else `$HOME/.local/share/weir`, else `./weir-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("weir");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".local/share/weir");
    }
    PathBuf::from("./weir-data")
}

/// A configuration error: where (file and line when known) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub origin: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.origin, l, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Longest volume description (the NBD protocol's string limit).
pub const MAX_DESCRIPTION_BYTES: usize = weir_nbd::consts::MAX_STRING_LEN;

/// Checks a volume description: at most [`MAX_DESCRIPTION_BYTES`], and no control
/// characters (clients print descriptions; an escape sequence would reach the
/// terminal of whoever lists the exports).
pub fn validate_description(text: &str) -> Result<(), String> {
    if text.len() > MAX_DESCRIPTION_BYTES {
        return Err(format!(
            "must be at most {MAX_DESCRIPTION_BYTES} bytes, got {}",
            text.len()
        ));
    }
    match text.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!(
            "must not contain control characters, found {:?}",
            c.escape_unicode().to_string()
        )),
        None => Ok(()),
    }
}

/// Checks a volume, pool or group name: 1–64 of `[A-Za-z0-9._-]`, not starting with '.'.
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{kind} name must be 1-64 characters of [A-Za-z0-9._-] not starting with '.', got {name:?}"
        ))
    }
}

// `from_toml_str`, `load` and `embedded_default` are `#[inline]` for build time: an
// inline function is compiled in the crate that calls it, at that crate's
// optimisation level, so the TOML deserializer code for the config model is compiled
// in the CLI (opt-level 0), not in this crate (opt-level 3, for the data path).
impl WeirConfig {
    /// Parses and validates TOML; `origin` (a file name) prefixes every error.
    #[inline]
    pub fn from_toml_str(text: &str, origin: &str) -> Result<WeirConfig, ConfigError> {
        let config: WeirConfig = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            ConfigError {
                origin: origin.to_string(),
                line,
                message: e.message().to_string(),
            }
        })?;
        config.validate().map_err(|(needle, message)| ConfigError {
            origin: origin.to_string(),
            line: needle.and_then(|n| find_line(text, &n)),
            message,
        })?;
        Ok(config)
    }

    #[inline]
    pub fn load(path: &Path) -> Result<WeirConfig, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            origin: origin.clone(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::from_toml_str(&text, &origin)
    }

    /// The built-in demo configuration: one pool, a `local` access group
    /// (loopback only) and five 1 GiB volumes, one per built-in policy.
    #[inline]
    pub fn embedded_default() -> WeirConfig {
        Self::from_toml_str(EMBEDDED_DEFAULT, "<embedded default>")
            .expect("embedded default configuration is valid")
    }

    /// The async runtime's thread count: `worker_threads`, else half the CPUs (at
    /// least one). Half, because the other half serves what the connections wait
    /// on: the blocking I/O pool, the kernel's network stack, and on a hyperconverged
    /// host the clients themselves. Measured on 2 CPUs (docs/PERFORMANCE.md): one
    /// worker beat two in every fio cell (4 KiB QD32 1.05–1.07× vs 0.88–0.90× of
    /// nbdkit), and a busy-polling connection keeps its socket's readiness on the
    /// thread that polls.
    pub fn worker_threads(&self) -> usize {
        match self.worker_threads {
            Some(n) => n as usize,
            None => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
        }
    }

    /// The runtime's blocking threads at most: every pool's `max_in_flight` (each
    /// request a pool performs at once may hold one: a read or write of a volume
    /// file) plus 256 for the rest (admin API, leases, flushes), at least tokio's
    /// default of 512 and at most 8,192. So a pool whose device stopped
    /// answering holds its own share and never the threads the others need.
    pub fn blocking_threads(&self) -> usize {
        let pools: u64 = self.pools.iter().map(|p| u64::from(p.max_in_flight)).sum();
        (pools + 256).clamp(512, 8192) as usize
    }

    /// The TLS keys agree: a mode other than off has a certificate and key, a
    /// client CA comes with TLS. On error: the key to blame and the message.
    pub fn check_tls(&self) -> Result<(), (&'static str, String)> {
        if self.tls != TlsMode::Off {
            for (key, value) in [("tls_cert", &self.tls_cert), ("tls_key", &self.tls_key)] {
                if value.is_none() {
                    return Err((
                        "tls",
                        format!("tls = \"{}\" needs {key} (a PEM file)", self.tls.name()),
                    ));
                }
            }
        } else if self.tls_client_ca.is_some() {
            return Err((
                "tls_client_ca",
                "tls_client_ca: client certificates need tls = \"on\" or \"require\"".into(),
            ));
        }
        Ok(())
    }

    /// Semantic checks; on error, a string to locate (a `name = "…"` line) and the message.
    fn validate(&self) -> Result<(), (Option<String>, String)> {
        let max_poll = crate::busy_poll::MAX_BUSY_POLL_US;
        if self.busy_poll_us > max_poll {
            return Err((
                Some("busy_poll_us".into()),
                format!(
                    "busy_poll_us: must be 0-{max_poll}, got {}",
                    self.busy_poll_us
                ),
            ));
        }
        if let Some(n) = self.worker_threads
            && !(1..=1024).contains(&n)
        {
            return Err((
                Some("worker_threads".into()),
                format!("worker_threads: must be 1-1024, got {n}"),
            ));
        }
        self.validate_connections()?;
        self.check_tls()
            .map_err(|(key, message)| (Some(key.to_string()), message))?;
        let mut catalog = PolicyCatalog::new();
        let mut policies = std::collections::BTreeSet::new();
        for (i, p) in self.policies.iter().enumerate() {
            if !policies.insert(p.name.as_str()) {
                return Err((
                    at(&p.name),
                    format!("policies[{i}].name: duplicate policy {:?}", p.name),
                ));
            }
            catalog
                .insert(p.clone())
                .map_err(|e| (at(&p.name), format!("policies[{i}] ({:?}): {e}", p.name)))?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in self.pools.iter().enumerate() {
            if !seen.insert(&p.name) {
                return Err((
                    at(&p.name),
                    format!("pools[{i}].name: duplicate pool {:?}", p.name),
                ));
            }
            validate_pool(i, p)?;
        }
        let groups = self.validate_access_groups()?;
        let mut volumes = std::collections::BTreeSet::new();
        for (i, v) in self.volumes.iter().enumerate() {
            if !volumes.insert(v.name.as_str()) {
                return Err((
                    at(&v.name),
                    format!("volumes[{i}] ({:?}).name: duplicate volume", v.name),
                ));
            }
            self.validate_volume(i, v, &catalog, &groups)?;
        }
        self.validate_replications()
    }

    /// `[[access_groups]]`: names (unique), host patterns, identities (which need
    /// client certificates); the set of their names.
    fn validate_access_groups(
        &self,
    ) -> Result<std::collections::BTreeSet<&str>, (Option<String>, String)> {
        let mut groups = std::collections::BTreeSet::new();
        for (i, g) in self.access_groups.iter().enumerate() {
            validate_name("access group", &g.name)
                .map_err(|e| (at(&g.name), format!("access_groups[{i}].name: {e}")))?;
            if !groups.insert(g.name.as_str()) {
                return Err((
                    at(&g.name),
                    format!("access_groups[{i}].name: duplicate group {:?}", g.name),
                ));
            }
            for h in &g.hosts {
                HostPattern::parse(h)
                    .map_err(|e| (at(&g.name), format!("access_groups[{i}].hosts: {e}")))?;
            }
            crate::access::GroupRule::parse_new(g)
                .map_err(|e| (at(&g.name), format!("access_groups[{i}]: {e}")))?;
            if !g.identities.is_empty() && self.tls_client_ca.is_none() {
                return Err((
                    at(&g.name),
                    format!(
                        "access_groups[{i}].identities: client identities need tls_client_ca (and tls)"
                    ),
                ));
            }
        }
        Ok(groups)
    }

    /// One `[[volumes]]` entry (its name's uniqueness is the caller's): size,
    /// upstream export, description, and that its policy, pool and access groups exist.
    fn validate_volume(
        &self,
        i: usize,
        v: &VolumeConfig,
        catalog: &PolicyCatalog,
        groups: &std::collections::BTreeSet<&str>,
    ) -> Result<(), (Option<String>, String)> {
        let here = |field: &str, msg: String| {
            (
                at(&v.name),
                format!("volumes[{i}] ({:?}).{field}: {msg}", v.name),
            )
        };
        validate_name("volume", &v.name).map_err(|e| here("name", e))?;
        let upstream = self
            .pools
            .iter()
            .any(|p| p.name == v.pool && p.upstream.is_some());
        if v.size.0 == 0 && !upstream {
            return Err(here("size", "must be more than 0 bytes".into()));
        }
        if let Some(e) = &v.export {
            if !upstream {
                return Err(here(
                    "export",
                    format!(
                        "only for volumes in a pool with upstream = \"nbd://…\" ({:?} has none)",
                        v.pool
                    ),
                ));
            }
            crate::upstream::validate_export_name(e).map_err(|m| here("export", m))?;
        }
        validate_description(&v.description).map_err(|e| here("description", e))?;
        catalog
            .get(&v.policy)
            .map_err(|e| here("policy", e.to_string()))?;
        if !self.pools.iter().any(|p| p.name == v.pool) {
            return Err(here("pool", format!("no pool named {:?}", v.pool)));
        }
        for g in &v.access_groups {
            if !groups.contains(g.as_str()) {
                return Err(here(
                    "access_groups",
                    format!("no access group named {g:?}"),
                ));
            }
        }
        Ok(())
    }

    /// `[[replications]]`: names, targets and intervals. A volume declared in
    /// this file must be in a thin pool; one that is not declared is checked
    /// against the volume catalog when the server starts.
    fn validate_replications(&self) -> Result<(), (Option<String>, String)> {
        let mut seen = std::collections::BTreeSet::new();
        for (i, r) in self.replications.iter().enumerate() {
            let here = |field: &str, msg: String| {
                (
                    Some(format!("volume = \"{}\"", r.volume)),
                    format!("replications[{i}] ({:?}).{field}: {msg}", r.volume),
                )
            };
            validate_name("volume", &r.volume).map_err(|e| here("volume", e))?;
            if !seen.insert(r.volume.as_str()) {
                return Err(here(
                    "volume",
                    "replicated twice (one replication per volume)".into(),
                ));
            }
            crate::replicate::NbdUrl::parse(&r.to).map_err(|e| here("to", e))?;
            crate::replicate::parse_every(&r.every).map_err(|e| here("every", e))?;
            if let Some(v) = self.volumes.iter().find(|v| v.name == r.volume) {
                let thin = self
                    .pools
                    .iter()
                    .any(|p| p.name == v.pool && p.format == PoolFormat::Thin);
                if !thin {
                    return Err(here(
                        "volume",
                        format!(
                            "is in pool {:?}, whose format is not \"thin\": replication ships \
                             snapshots, which need format = \"thin\"",
                            v.pool
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl WeirConfig {
    /// `max_connections`, `max_connections_per_host`, `admin_max_connections`,
    /// `admin_max_connections_per_host`, `idle_timeout_s`.
    fn validate_connections(&self) -> Result<(), (Option<String>, String)> {
        for (field, value, max) in [
            ("max_connections", self.max_connections, MAX_CONNECTIONS),
            (
                "max_connections_per_host",
                self.max_connections_per_host,
                MAX_CONNECTIONS,
            ),
        ] {
            if !(1..=max).contains(&value) {
                return Err((
                    Some(field.into()),
                    format!("{field}: must be 1-{max}, got {value}"),
                ));
            }
        }
        for (field, value) in [
            ("max_buffered_mib", self.max_buffered_mib),
            ("max_buffered_mib_per_host", self.max_buffered_mib_per_host),
        ] {
            if !(MIN_BUFFERED_MIB..=MAX_BUFFERED_MIB).contains(&value) {
                return Err((
                    Some(field.into()),
                    format!(
                        "{field}: must be {MIN_BUFFERED_MIB}-{MAX_BUFFERED_MIB} \
                         (MiB; at least one largest request), got {value}"
                    ),
                ));
            }
        }
        let admin = self.admin_max_connections;
        if !(MIN_ADMIN_CONNECTIONS..=MAX_ADMIN_CONNECTIONS).contains(&admin) {
            return Err((
                Some("admin_max_connections".into()),
                format!(
                    "admin_max_connections: must be {MIN_ADMIN_CONNECTIONS}-{MAX_ADMIN_CONNECTIONS}, \
                     got {admin}"
                ),
            ));
        }
        let per_host = self.admin_max_connections_per_host;
        if !(1..=admin).contains(&per_host) {
            return Err((
                Some("admin_max_connections_per_host".into()),
                format!(
                    "admin_max_connections_per_host: must be 1 to admin_max_connections \
                     ({admin}), got {per_host}"
                ),
            ));
        }
        if self.idle_timeout_s > MAX_IDLE_TIMEOUT_S {
            return Err((
                Some("idle_timeout_s".into()),
                format!(
                    "idle_timeout_s: must be 0 (off) to {MAX_IDLE_TIMEOUT_S} (a week), got {}",
                    self.idle_timeout_s
                ),
            ));
        }
        if self.tcp_keepalive_s > crate::keepalive::MAX_IDLE_S {
            return Err((
                Some("tcp_keepalive_s".into()),
                format!(
                    "tcp_keepalive_s: must be 0 (off) to {} (Linux's TCP_KEEPIDLE bound), got {}",
                    crate::keepalive::MAX_IDLE_S,
                    self.tcp_keepalive_s
                ),
            ));
        }
        Ok(())
    }
}

/// Largest `max_connections` and `max_connections_per_host`.
pub const MAX_CONNECTIONS: u32 = 1 << 20;
/// Smallest `admin_max_connections`: what the admin API keeps however short the
/// open-files limit is.
pub const MIN_ADMIN_CONNECTIONS: u32 = crate::connections::MIN_ADMIN_CONNECTIONS as u32;
/// Largest `admin_max_connections`.
pub const MAX_ADMIN_CONNECTIONS: u32 = 1 << 16;
/// Smallest `max_buffered_mib` and `max_buffered_mib_per_host`: one request of
/// the largest payload.
pub const MIN_BUFFERED_MIB: u32 = weir_nbd::consts::DEFAULT_MAX_PAYLOAD >> 20;
/// Largest `max_buffered_mib` and `max_buffered_mib_per_host` (1 TiB).
pub const MAX_BUFFERED_MIB: u32 = 1 << 20;
/// Largest `idle_timeout_s`.
pub const MAX_IDLE_TIMEOUT_S: u32 = 7 * 24 * 3600;

/// Checks a pool's `[pools.depth]` table; an error names the field.
/// The `name = "…"` line to locate an error at.
fn at(name: &str) -> Option<String> {
    Some(format!("name = \"{name}\""))
}

/// One `[[pools]]` entry (its name's uniqueness is the caller's): name, in-flight
/// limit, cost factors, depth controller, format, congestion and faults, its stack.
fn validate_pool(i: usize, p: &PoolConfig) -> Result<(), (Option<String>, String)> {
    validate_name("pool", &p.name).map_err(|e| (at(&p.name), format!("pools[{i}].name: {e}")))?;
    if p.max_in_flight == 0 || p.max_in_flight > 65536 {
        return Err((
            at(&p.name),
            format!(
                "pools[{i}].max_in_flight: must be 1-65536, got {}",
                p.max_in_flight
            ),
        ));
    }
    for (field, f) in [
        ("trim_cost_factor", p.trim_cost_factor),
        ("zero_cost_factor", p.zero_cost_factor),
    ] {
        if !(0.0..=1.0).contains(&f) {
            return Err((
                Some(field.into()),
                format!(
                    "pools[{i}].{field}: must be 0-1 (the fraction of its length a request is charged), got {f}"
                ),
            ));
        }
    }
    validate_depth(&p.depth, p.max_in_flight)
        .map_err(|(field, e)| (Some(field.into()), format!("pools[{i}].depth.{field}: {e}")))?;
    if p.format == PoolFormat::Thin && p.direct_io {
        return Err((
            Some("direct_io".into()),
            format!("pools[{i}].direct_io: not available for format = \"thin\""),
        ));
    }
    if let Some(c) = &p.congestion {
        c.validate()
            .map_err(|e| (at(&p.name), format!("pools[{i}].congestion: {e}")))?;
    }
    validate_gateway_congestion(i, p)?;
    for (j, f) in p.faults.iter().enumerate() {
        f.validate()
            .map_err(|e| (at(&p.name), format!("pools[{i}].faults[{j}].{e}")))?;
    }
    crate::stack::validate_pool(p)
        .map_err(|(field, e)| (Some(field.into()), format!("pools[{i}].{field}: {e}")))
}

/// A pool's gateway window: its settings, and the shared stats volume and slot
/// that go with it.
fn validate_gateway_congestion(i: usize, p: &PoolConfig) -> Result<(), (Option<String>, String)> {
    let err = |msg: String| Err((at(&p.name), msg));
    let enabled = p.gateway_congestion.as_ref().is_some_and(|c| c.enabled);
    if let Some(c) = &p.gateway_congestion {
        c.validate()
            .map_err(|e| (at(&p.name), format!("pools[{i}].gateway_congestion: {e}")))?;
        if p.gateway_stats_volume.is_some() != p.gateway_id.is_some() {
            return err(format!(
                "pools[{i}]: gateway_stats_volume and gateway_id go together \
                 (each gateway writes its own slot of the shared volume)"
            ));
        }
        if let Some(id) = p.gateway_id
            && id as usize >= crate::datastore_stats::SLOTS
        {
            return err(format!(
                "pools[{i}].gateway_id: {id} is out of range (0-{})",
                crate::datastore_stats::SLOTS - 1
            ));
        }
        if c.enabled && !p.qos {
            return err(format!(
                "pools[{i}].gateway_congestion: needs qos = true (with qos = false \
                 requests bypass the gate that holds the window)"
            ));
        }
    }
    if p.gateway_stats_volume.is_some() && !enabled {
        return err(format!(
            "pools[{i}].gateway_stats_volume: needs gateway_congestion = \
             {{ enabled = true, … }} (the stats feed the gateway window)"
        ));
    }
    Ok(())
}

fn validate_depth(d: &DepthConfig, max_in_flight: u32) -> Result<(), (&'static str, String)> {
    if d.min_depth == 0 || d.min_depth > max_in_flight {
        return Err((
            "min_depth",
            format!(
                "must be 1-{max_in_flight} (the pool's max_in_flight), got {}",
                d.min_depth
            ),
        ));
    }
    if !(d.period_ms.is_finite() && (1.0..=60_000.0).contains(&d.period_ms)) {
        return Err(("period_ms", format!("must be 1-60000, got {}", d.period_ms)));
    }
    for (field, f) in [
        ("over_target_budget", d.over_target_budget),
        ("over_twice_budget", d.over_twice_budget),
    ] {
        if !(f.is_finite() && f > 0.0 && f <= 1.0) {
            return Err((
                field,
                format!("must be a fraction above 0 and at most 1, got {f}"),
            ));
        }
    }
    if !(d.decrease.is_finite() && (0.1..=0.99).contains(&d.decrease)) {
        return Err((
            "decrease",
            format!(
                "must be 0.1-0.99 (the factor the depth shrinks by per period), got {}",
                d.decrease
            ),
        ));
    }
    if !(d.share_floor.is_finite() && (0.0..=1.0).contains(&d.share_floor)) {
        return Err((
            "share_floor",
            format!(
                "must be a fraction 0-1 of max_in_flight, got {}",
                d.share_floor
            ),
        ));
    }
    if d.anticipate_us > 100_000 {
        return Err((
            "anticipate_us",
            format!("must be at most 100000 (100 ms), got {}", d.anticipate_us),
        ));
    }
    Ok(())
}

/// The line that is `needle` (a `name = "…"` line), or whose key is `needle`.
fn find_line(text: &str, needle: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let l = l.trim();
            l == needle
                || l.split_once('=')
                    .is_some_and(|(key, _)| key.trim() == needle)
        })
        .map(|i| i + 1)
}

const EMBEDDED_DEFAULT: &str = r#"
# Weir demo configuration: five volumes on the five built-in policies,
# reachable from this machine only.
[[pools]]
name = "default"
max_in_flight = 64

[[access_groups]]
name = "local"
hosts = ["127.0.0.1", "::1"]

[[volumes]]
name = "sql"
size = "1GiB"
policy = "mission-critical"
access_groups = ["local"]
description = "OLTP database (mission-critical)"

[[volumes]]
name = "exchange"
size = "1GiB"
policy = "business-critical"
access_groups = ["local"]
description = "mail store (business-critical)"

[[volumes]]
name = "vdi-gold"
size = "1GiB"
policy = "business-critical-2"
access_groups = ["local"]
description = "mid-range desktops (business-critical)"

[[volumes]]
name = "vdi-standard"
size = "1GiB"
policy = "non-critical"
access_groups = ["local"]
description = "standard desktops (non-critical)"

[[volumes]]
name = "scratch"
size = "1GiB"
policy = "non-critical-2"
access_groups = ["local"]
description = "scratch space (non-critical)"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_has_one_volume_per_builtin_policy() {
        let c = WeirConfig::embedded_default();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
        let mut policies: Vec<_> = c.volumes.iter().map(|v| v.policy.as_str()).collect();
        policies.sort();
        assert_eq!(
            policies,
            [
                "business-critical",
                "business-critical-2",
                "mission-critical",
                "non-critical",
                "non-critical-2"
            ]
        );
        assert!(c.volumes.iter().all(|v| v.size.0 == 1 << 30));
    }

    #[test]
    fn admin_connection_caps_are_checked() {
        let c = WeirConfig::from_toml_str("", "w.toml").unwrap();
        assert_eq!(c.admin_max_connections, 128);
        assert_eq!(c.admin_max_connections_per_host, 16);
        let c = WeirConfig::from_toml_str(
            "admin_max_connections = 4096\nadmin_max_connections_per_host = 64\n",
            "w.toml",
        )
        .unwrap();
        assert_eq!(
            (c.admin_max_connections, c.admin_max_connections_per_host),
            (4096, 64)
        );
        for (text, want) in [
            (
                "admin_max_connections = 7\n",
                "admin_max_connections: must be 8-65536, got 7",
            ),
            (
                "admin_max_connections = 70000\n",
                "admin_max_connections: must be 8-65536",
            ),
            (
                "admin_max_connections_per_host = 0\n",
                "admin_max_connections_per_host: must be 1 to admin_max_connections (128), got 0",
            ),
            (
                "admin_max_connections = 8\nadmin_max_connections_per_host = 9\n",
                "admin_max_connections_per_host: must be 1 to admin_max_connections (8), got 9",
            ),
        ] {
            let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
            assert!(e.message.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }

    #[test]
    fn syntax_errors_name_file_line_and_field() {
        let text = "listen = \"127.0.0.1:1\"\n\n[[volumes]]\nname = \"a\"\nsise = 5\npolicy = \"non-critical\"\n";
        let e = WeirConfig::from_toml_str(text, "weir.toml").unwrap_err();
        assert_eq!(e.origin, "weir.toml");
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("sise"), "{e}");
        let text = "[[volumes]]\nname = \"a\"\nsize = \"big\"\npolicy = \"non-critical\"\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("\"big\""), "{e}");
        let text = "[[volumes]]\nname = \"a\"\nsize = -5\npolicy = \"non-critical\"\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("negative"), "{e}");
        let text = "[[volumes]]\nname = \"a\"\nsize = [1]\npolicy = \"non-critical\"\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("a size"), "{e}");
    }

    #[test]
    fn busy_poll_and_worker_threads_are_bounded() {
        let c = WeirConfig::from_toml_str("", "w.toml").unwrap();
        assert_eq!(c.busy_poll_us, crate::busy_poll::DEFAULT_BUSY_POLL_US);
        let c = WeirConfig::from_toml_str("busy_poll_us = 0\n", "w.toml").unwrap();
        assert_eq!(c.busy_poll_us, 0);
        let text = "listen = \"127.0.0.1:1\"\nbusy_poll_us = 5000\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("busy_poll_us: must be 0-1000"), "{e}");
        let e = WeirConfig::from_toml_str("worker_threads = 0\n", "w.toml").unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        let c = WeirConfig::from_toml_str("worker_threads = 3\n", "w.toml").unwrap();
        assert_eq!(c.worker_threads(), 3);
        assert!(
            WeirConfig::from_toml_str("", "w.toml")
                .unwrap()
                .worker_threads()
                >= 1
        );
        // Blocking threads: every pool's max_in_flight and 256 more, 512-8,192.
        let pools = |n: u32| {
            let t: String = (0..12)
                .map(|i| format!("[[pools]]\nname = \"p{i}\"\nmax_in_flight = {n}\n"))
                .collect();
            WeirConfig::from_toml_str(&t, "w.toml")
                .unwrap()
                .blocking_threads()
        };
        assert_eq!(pools(64), 12 * 64 + 256);
        assert_eq!(pools(8), 512);
        assert_eq!(pools(4096), 8192);
    }

    #[test]
    fn cost_factors_and_depth_are_read_and_checked() {
        let c = WeirConfig::from_toml_str("", "w.toml").unwrap();
        assert_eq!(c.pools[0].trim_cost_factor, 1.0);
        assert_eq!(c.pools[0].zero_cost_factor, 1.0);
        assert_eq!(c.pools[0].depth, DepthConfig::default());
        let text = "[[pools]]\nname = \"p\"\nmax_in_flight = 32\ntrim_cost_factor = 0.25\nzero_cost_factor = 0\n\n[pools.depth]\nadaptive = false\nmin_depth = 8\n";
        let c = WeirConfig::from_toml_str(text, "w.toml").unwrap();
        let p = &c.pools[0];
        assert_eq!((p.trim_cost_factor, p.zero_cost_factor), (0.25, 0.0));
        assert!(!p.depth.adaptive);
        assert_eq!(p.depth.min_depth, 8);
        assert_eq!(p.depth.decrease, DepthConfig::default().decrease);

        let text = "[[pools]]\nname = \"p\"\ntrim_cost_factor = 1.5\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(
            e.message.contains("pools[0].trim_cost_factor: must be 0-1"),
            "{e}"
        );
        let text = "[[pools]]\nname = \"p\"\nzero_cost_factor = -1\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(e.message.contains("pools[0].zero_cost_factor"), "{e}");
        let text = "[[pools]]\nname = \"p\"\nmax_in_flight = 16\n[pools.depth]\nmin_depth = 32\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.message.contains("pools[0].depth.min_depth: must be 1-16"),
            "{e}"
        );
        let text = "[[pools]]\nname = \"p\"\n[pools.depth]\nanticipate_us = 9000000\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(e.message.contains("pools[0].depth.anticipate_us"), "{e}");
        let text = "[[pools]]\nname = \"p\"\ndepth = { decrease = 1.5 }\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(e.message.contains("pools[0].depth.decrease"), "{e}");
        let text = "[[pools]]\nname = \"p\"\ndepth = { period_ms = 0 }\n";
        assert!(
            WeirConfig::from_toml_str(text, "w.toml")
                .unwrap_err()
                .message
                .contains("depth.period_ms")
        );
        let text = "[[pools]]\nname = \"p\"\ndepth = { over_twice_budget = 0 }\n";
        assert!(
            WeirConfig::from_toml_str(text, "w.toml")
                .unwrap_err()
                .message
                .contains("depth.over_twice_budget")
        );
        let text = "[[pools]]\nname = \"p\"\ndepth = { adaptve = false }\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(e.message.contains("adaptve"), "{e}");
    }

    /// `nbds://` upstreams: a CA is required, TLS settings without `nbds://` and a
    /// certificate without its key are refused, unreadable files are named.
    #[test]
    fn upstream_tls_settings_are_checked() {
        let pool = |lines: &str| {
            WeirConfig::from_toml_str(&format!("[[pools]]\nname = \"p\"\n{lines}"), "w.toml")
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(pool("upstream = \"nbd://storage\"\n").is_ok());
        for (lines, says) in [
            ("upstream = \"nbds://storage\"\n", "needs upstream_tls_ca"),
            (
                "upstream_tls_ca = \"ca.pem\"\n",
                "only for a pool with upstream",
            ),
            (
                "upstream = \"nbd://storage\"\nupstream_tls_ca = \"ca.pem\"\n",
                "TLS needs nbds://",
            ),
            (
                "upstream = \"nbds://storage\"\nupstream_tls_ca = \"/nonexistent/ca.pem\"\n",
                "upstream_tls_ca /nonexistent/ca.pem",
            ),
            (
                "upstream = \"nbds://storage\"\nupstream_tls_ca = \"ca.pem\"\nupstream_tls_key = \"k.pem\"\n",
                "go together",
            ),
            ("upstream = \"nbds://storage/x\"\n", "no export"),
        ] {
            let e = pool(lines).unwrap_err();
            assert!(e.contains(says), "{lines}: {e}");
        }
    }

    #[test]
    fn gateway_congestion_is_read_with_fair_rate_on_unless_turned_off() {
        let pool = |table: &str| {
            let text = format!("[[pools]]\nname = \"p\"\ngateway_congestion = {table}\n");
            WeirConfig::from_toml_str(&text, "w.toml").map(|c| c.pools[0].clone())
        };
        let p =
            pool("{ enabled = true, threshold_ms = 20, period_ms = 250, gamma = 0.5 }").unwrap();
        let c = p.gateway_congestion.unwrap();
        assert!(c.enabled && c.fair_rate);
        assert_eq!((c.threshold_ms, c.period_ms, c.gamma), (20.0, 250.0, 0.5));
        let c = pool("{ fair_rate = false }")
            .unwrap()
            .gateway_congestion
            .unwrap();
        assert!(!c.fair_rate);
        assert_eq!(c.threshold_ms, CongestionConfig::default().threshold_ms);
        let e = pool("{ threshold = 20 }").unwrap_err();
        assert!(e.message.contains("threshold"), "{e}");
        let e = pool("{ threshold_ms = 1 }").unwrap_err();
        assert!(e.message.contains("gateway_congestion"), "{e}");
        assert!(pool("{}").unwrap().gateway_congestion.unwrap().fair_rate);
        let c = WeirConfig::from_toml_str("[[pools]]\nname = \"p\"\n", "w.toml").unwrap();
        assert_eq!(c.pools[0].gateway_congestion, None);
    }

    #[test]
    fn tls_keys_are_read_and_checked() {
        let c = WeirConfig::from_toml_str("", "w.toml").unwrap();
        assert_eq!(c.tls, TlsMode::Off);
        let text = "tls = \"require\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\ntls_client_ca = \"ca.pem\"\n[[access_groups]]\nname = \"g\"\nhosts = [\"*\"]\nidentities = [\"backup\"]\n";
        let c = WeirConfig::from_toml_str(text, "w.toml").unwrap();
        assert_eq!(c.tls, TlsMode::Require);
        assert_eq!(c.access_groups[0].identities, ["backup"]);
        let e = WeirConfig::from_toml_str("tls = \"on\"\ntls_cert = \"c.pem\"\n", "w.toml")
            .unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        assert!(e.message.contains("needs tls_key"), "{e}");
        let e = WeirConfig::from_toml_str("tls = \"maybe\"\n", "w.toml").unwrap_err();
        assert!(e.message.contains("maybe"), "{e}");
        let e = WeirConfig::from_toml_str("tls_client_ca = \"ca.pem\"\n", "w.toml").unwrap_err();
        assert!(e.message.contains("tls = \"on\""), "{e}");
        let text = "[[access_groups]]\nname = \"g\"\nhosts = [\"*\"]\nidentities = [\"x\"]\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(e.message.contains("tls_client_ca"), "{e}");
        assert_eq!(TlsMode::parse("on"), Ok(TlsMode::On));
        assert!(TlsMode::parse("yes").is_err());
    }

    #[test]
    fn replications_are_read_and_checked() {
        let base = "[[pools]]\nname = \"thin\"\nformat = \"thin\"\n[[pools]]\nname = \"files\"\n\n[[volumes]]\nname = \"db\"\nsize = \"1GiB\"\npolicy = \"non-critical\"\npool = \"thin\"\n\n[[volumes]]\nname = \"plain\"\nsize = \"1GiB\"\npolicy = \"non-critical\"\npool = \"files\"\n";
        let with = |r: &str| format!("{base}\n[[replications]]\n{r}");
        let c = WeirConfig::from_toml_str(
            &with("volume = \"db\"\nto = \"nbd://dr:10809/db\"\nevery = \"5m\"\n"),
            "w.toml",
        )
        .unwrap();
        assert_eq!(c.replications[0].every, "5m");
        // Seconds as a TOML integer, as THIN.md says.
        let c = WeirConfig::from_toml_str(
            &with("volume = \"db\"\nto = \"nbd://dr:10809/db\"\nevery = 300\n"),
            "w.toml",
        )
        .unwrap();
        assert_eq!(c.replications[0].every, "300");
        assert!(!c.replications[0].overwrite);
        let c = WeirConfig::from_toml_str(
            &with("volume = \"db\"\nto = \"nbd://dr:10809/db\"\nevery = 300\noverwrite = true\n"),
            "w.toml",
        )
        .unwrap();
        assert!(c.replications[0].overwrite);
        // A volume the file does not declare is checked against the catalog at start.
        let text = with("volume = \"made-by-api\"\nto = \"nbd://dr/x\"\nevery = \"1h\"\n");
        assert!(WeirConfig::from_toml_str(&text, "w.toml").is_ok());
        for (r, field, needle) in [
            (
                "volume = \"db\"\nto = \"dr:10809\"\nevery = \"5m\"\n",
                "to",
                "not an NBD URL",
            ),
            (
                "volume = \"db\"\nto = \"nbd://dr/db\"\nevery = \"5 minutes\"\n",
                "every",
                "interval",
            ),
            (
                "volume = \"db\"\nto = \"nbd://dr/db\"\nevery = \"0s\"\n",
                "every",
                "between 1 s",
            ),
            (
                "volume = \"plain\"\nto = \"nbd://dr/p\"\nevery = \"5m\"\n",
                "volume",
                "format = \"thin\"",
            ),
        ] {
            let e = WeirConfig::from_toml_str(&with(r), "w.toml").unwrap_err();
            assert!(
                e.message.contains(&format!(").{field}:")) && e.message.contains(needle),
                "{e}"
            );
            assert_eq!(e.line, Some(base.lines().count() + 3), "{e}");
        }
        let twice = with(
            "volume = \"db\"\nto = \"nbd://a/db\"\nevery = \"5m\"\n[[replications]]\nvolume = \"db\"\nto = \"nbd://b/db\"\nevery = \"5m\"\n",
        );
        let e = WeirConfig::from_toml_str(&twice, "w.toml").unwrap_err();
        assert!(e.message.contains("replicated twice"), "{e}");
        let e =
            WeirConfig::from_toml_str(&with("volume = \"db\"\nto = \"nbd://a/db\"\n"), "w.toml")
                .unwrap_err();
        assert!(e.message.contains("every"), "{e}");
    }

    #[test]
    fn a_policy_declared_twice_is_refused() {
        let policy = "[[policies]]\nname = \"gold\"\nlimit_iops = 100\n";
        let text = format!("{policy}\n{policy}");
        let e = WeirConfig::from_toml_str(&text, "w.toml").unwrap_err();
        assert!(e.message.contains("duplicate policy \"gold\""), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn a_host_listed_twice_in_a_group_is_refused() {
        let text = "[[access_groups]]\nname = \"g\"\nhosts = [\"10.0.0.1\", \"10.0.0.1/32\"]\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(e.message.contains("listed twice"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn sizes_read_as_numbers_or_strings() {
        let text = "[[volumes]]\nname = \"a\"\nsize = 4096\npolicy = \"non-critical\"\n\n[[volumes]]\nname = \"b\"\nsize = \"2 MiB\"\npolicy = \"non-critical\"\n";
        let c = WeirConfig::from_toml_str(text, "w.toml").unwrap();
        assert_eq!(c.volumes[0].size, ByteSize(4096));
        assert_eq!(c.volumes[1].size, ByteSize(2 << 20));
        // A quoted number has no unit: refused, not read as bytes.
        let e =
            WeirConfig::from_toml_str(&text.replace("\"2 MiB\"", "\"20\""), "w.toml").unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        assert!(e.message.contains("has no unit"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_volume_line_and_field() {
        let text = "[[volumes]]\nname = \"a\"\nsize = 1\npolicy = \"non-critical\"\n\n[[volumes]]\nname = \"b\"\nsize = 1\npolicy = \"gold\"\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert!(
            e.to_string()
                .starts_with("w.toml:7: volumes[1] (\"b\").policy: no policy named \"gold\""),
            "{e}"
        );
        let text = "[[volumes]]\nname = \"a\"\nsize = 1\npolicy = \"non-critical\"\naccess_groups = [\"x\"]\n";
        let e = WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
        assert!(
            e.message.contains("access_groups") && e.message.contains("\"x\""),
            "{e}"
        );
        let text = "[[access_groups]]\nname = \"g\"\nhosts = [\"10.0.0.0/33\"]\n";
        assert!(
            WeirConfig::from_toml_str(text, "w.toml")
                .unwrap_err()
                .message
                .contains("10.0.0.0/33")
        );
        let text = "[[policies]]\nname = \"x\"\nlimit_iops = 3\n";
        assert!(
            WeirConfig::from_toml_str(text, "w.toml")
                .unwrap_err()
                .message
                .contains("limit_iops")
        );
    }
}
