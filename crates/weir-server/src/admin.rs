//! Admin API: JSON over HTTP on the admin listener, plus a small client for the
//! CLI.
//!
//! | method | path | body | answer |
//! | --- | --- | --- | --- |
//! | GET | `/v1/volumes` | | `[VolumeRecord]` |
//! | POST | `/v1/volumes` | `VolumeCreate` | `VolumeRecord` (201) |
//! | GET | `/v1/volumes/{name}` | | `VolumeRecord` |
//! | PATCH | `/v1/volumes/{name}` | `VolumeUpdate` | `VolumeRecord` |
//! | DELETE | `/v1/volumes/{name}` | | `VolumeRecord` |
//! | POST | `/v1/volumes/{name}/resize` | `{"size_bytes": n}` | `VolumeRecord` |
//! | POST | `/v1/volumes/{name}/policy` | `{"policy": "name"}` | `VolumeRecord` |
//! | GET | `/v1/volumes/{name}/stats` | | `VolumeStatsReport` |
//! | GET | `/v1/pools` | | `[PoolStatsReport]` |
//! | GET | `/v1/capacity` | | `[PoolCapacity]` (space, provisioned, overcommit) |
//! | GET | `/v1/server` | | `ServerInfo` (version, commit, host name, uptime) |
//! | GET | `/v1/policies` | | `[Policy]` |
//! | POST | `/v1/policies` | `Policy` | `Policy` (201) |
//! | GET | `/v1/policies/{name}` | | `Policy` |
//! | PUT | `/v1/policies/{name}` | `Policy` | `Policy` (replaces a user-defined one; its volumes follow at once) |
//! | DELETE | `/v1/policies/{name}` | | `Policy` |
//! | GET | `/v1/access-groups` | | `[AccessGroupConfig]` |
//! | PUT | `/v1/access-groups/{name}` | `AccessGroupConfig` | `AccessGroupConfig` (create or replace) |
//! | GET | `/v1/access-groups/{name}` | | `AccessGroupConfig` |
//! | DELETE | `/v1/access-groups/{name}` | | `AccessGroupConfig` |
//! | GET | `/v1/replications` | | `[ReplicationStatus]` |
//! | GET | `/v1/volumes/{name}/replication` | | `ReplicationStatus` |
//! | POST | `/v1/volumes/{name}/replication` | `ReplicationRequest` | `ReplicationStatus` (201 when new) |
//! | DELETE | `/v1/volumes/{name}/replication` | | `ReplicationStatus` (stopped) |
//! | GET | `/v1/stats` | | `LiveStats`: every volume's and host's last second (`weir top`, the dashboard) |
//! | GET | `/v1/volumes/{name}/history?since=1h&step=1m` | | `Series` (the history store, docs/HISTORY.md) |
//! | GET | `/metrics` | | Prometheus text |
//! | GET | `/`, `/ui/…` | | the dashboard (no token needed for these static files; docs/DASHBOARD.md) |
//!
//! Errors are `{"error": "message"}` with 400 (invalid; malformed JSON body), 404
//! (not found), 405 (method not allowed on that path; its `Allow` header lists
//! those that are), 409 (conflict), 422 (JSON body of the wrong shape) or 500.
//!
//! Every request that changes something is logged (target `weir_audit`, info
//! level): method, path, body and outcome.
//!
//! Every request first passes [`crate::admin_auth::AdminGuard`]: its own `Host`
//! (401/403/415 otherwise), a same-origin `Origin` if any, `Authorization: Bearer
//! <token>` (the token in `<data_dir>/admin-token`), JSON bodies; error answers
//! carry no absolute paths.
//!
//! The HTTP side (hyper, with the listener's connection caps and deadlines) is in
//! the `weir-http` crate, compiled apart from the data path; this module routes the
//! decoded request ([`handle`]) and holds the client.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use weir_http::{Request, Response};
use weir_qos::{Policy, VolumeId};

use crate::config::AccessGroupConfig;
use crate::metrics::CounterSnapshot;
use crate::qos::PoolGauges;
use crate::server::ServerState;
use crate::store::{
    LeaseHolder, StoreError, ThinPoolCheck, VolumeCreate, VolumeRecord, VolumeUpdate,
};
use crate::thin::SnapshotRecord;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeRequest {
    pub size_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPolicyRequest {
    pub policy: String,
}

/// Counters of one volume since the server started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeStatsReport {
    pub volume: VolumeRecord,
    pub uptime_seconds: f64,
    pub counters: CounterSnapshot,
    /// Mean latency of every completed request, ms (QoS queueing included).
    pub mean_latency_ms: f64,
    /// Requests waiting in the QoS scheduler now.
    pub queued: usize,
    /// Requests the scheduler released to meet the reservation / by shares.
    pub reservation_dispatches: u64,
    /// Releases protection moved ahead / made while protection held the volume's
    /// level back (its floor).
    #[serde(default)]
    pub protected_dispatches: u64,
    #[serde(default)]
    pub held_back_dispatches: u64,
    pub dispatched_ios: u64,
    /// The volume's pool's QoS gate now (device depth limit, pieces in flight).
    #[serde(default)]
    pub pool: PoolGauges,
    /// The policy the QoS scheduler enforces for the volume now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_policy: Option<Policy>,
    /// The volume's asynchronous replication, if it has one (lag, last cycle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<crate::replicate::ReplicationStatus>,
    /// Its flash cache, if its pool has one and it is cached (or was since the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_cache: Option<VolumeFlashCacheReport>,
}

/// A volume's flash cache counters since the start, and its pool's cache now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeFlashCacheReport {
    pub read_hits: u64,
    pub read_misses: u64,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Misses not admitted (sequential scans).
    pub scan_bypasses: u64,
    pub pool_capacity_bytes: u64,
    pub pool_resident_bytes: u64,
    /// The pool's reads sent past the cache because an upstream lease was not held
    /// or not confirmed (docs/FLASH_CACHE.md "Nobody writes behind it").
    pub pool_unowned_reads: u64,
}

impl VolumeFlashCacheReport {
    fn of(s: &ServerState, pool: &str, volume: &str) -> Option<VolumeFlashCacheReport> {
        let snaps = s.store().flash_cache_snapshots();
        let p = snaps.iter().find(|p| p.pool == pool)?;
        let (_, v) = p.volumes.iter().find(|(n, _)| n == volume)?;
        Some(VolumeFlashCacheReport {
            read_hits: v.read_hits,
            read_misses: v.read_misses,
            hit_bytes: v.hit_bytes,
            miss_bytes: v.miss_bytes,
            scan_bypasses: v.scan_bypasses,
            pool_capacity_bytes: p.capacity_bytes,
            pool_resident_bytes: p.resident_bytes,
            pool_unowned_reads: p.unowned_reads,
        })
    }
}

/// One pool's QoS gate now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolStatsReport {
    pub name: String,
    /// `false`: requests bypass the gate (`qos = false`).
    pub qos: bool,
    /// The emulated device's preset (or a short description of its table), if any.
    pub device: Option<String>,
    #[serde(flatten)]
    pub gauges: PoolGauges,
    /// Per-host admission windows (empty unless congestion control is on).
    pub host_windows: Vec<HostWindowReport>,
    /// The mean device latency the gateway window last stepped with, ms
    /// (`gateway_congestion` on, after a period with I/O).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_latency_ms: Option<f64>,
}

/// One client host's admission window on a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostWindowReport {
    pub client: u32,
    pub window: u32,
    pub host_shares: u64,
    pub in_gate: usize,
    pub waiting: usize,
}

/// `POST /v1/volumes/{volume}/snapshots`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub name: String,
}

/// `POST /v1/volumes/{volume}/rollback`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub snapshot: String,
}

/// `POST /v1/volumes/{volume}/snapshots/{snapshot}/clones`: linked clones, one
/// per name, with the source volume's policy unless `policy` names another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    pub names: Vec<String>,
    #[serde(default)]
    pub policy: Option<String>,
}

/// `GET /v1/server`: which server answers (the CLI shows it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub version: String,
    pub commit: String,
    /// The machine's host name.
    pub hostname: String,
    pub nbd_listen: String,
    pub admin_listen: String,
    pub uptime_seconds: f64,
    pub volumes: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

impl ErrorBody {
    /// An error answer; its message at most [`MAX_ERROR_BYTES`] (errors quote what
    /// they refuse, and a request can be 2 MiB).
    pub fn new(mut error: String) -> ErrorBody {
        clip(&mut error, MAX_ERROR_BYTES);
        ErrorBody { error }
    }
}

/// Longest error message an answer carries (and the audit log records).
pub const MAX_ERROR_BYTES: usize = 512;

/// Cuts `text` to at most `max` bytes (at a character boundary), marking the cut
/// with '…'.
fn clip(text: &mut String, max: usize) {
    if text.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
}

struct ApiError(u16, String);

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match e {
            StoreError::NotFound(_) => 404,
            StoreError::Conflict(_) => 409,
            StoreError::Invalid(_) => 400,
            StoreError::Io(_) => 500,
            StoreError::Exhausted(_) => 507,
        };
        ApiError(status, e.to_string())
    }
}

type ApiResult = Result<Response, ApiError>;

/// Serves the admin API on `listener` until `shutdown` turns true (the HTTP side
/// is weir-http's; requests come back to [`handle`]).
pub fn spawn(
    state: Arc<ServerState>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    if let Ok(addr) = listener.local_addr() {
        crate::admin_auth::warn_if_exposed(addr);
    }
    let guard = state.admin_guard.clone();
    let admin_connections = state.admin_connections;
    let admin_per_host = state.admin_connections_per_host;
    let early = guard.clone();
    weir_http::spawn_checked(
        listener,
        Arc::new(move |request| match crate::dashboard::asset(request) {
            Some(_) if early.host_ok(request) => None,
            _ => early.refuse_early(request),
        }),
        Arc::new(move |request| match crate::dashboard::asset(&request) {
            Some(page) if guard.host_ok(&request) => page,
            _ => guard.serve(&request, |r| handle(&state, r)),
        }),
        Box::pin(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        }),
        weir_http::Limits {
            max_connections: admin_connections,
            max_per_address: admin_per_host,
            ..weir_http::Limits::ADMIN
        },
    )
}

/// Answers one admin request (the table at the top of this module).
pub fn handle(s: &ServerState, request: &Request) -> Response {
    let segments = match route(&request.path) {
        Ok(segments) => segments,
        Err(e) => return answered(request, Err(e)),
    };
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let mut response = match crate::sampler::api(s, &request.method, &segments, &request.query) {
        Some(answer) => answer,
        None => answered(
            request,
            dispatch(s, &request.method, &segments, &request.body),
        ),
    };
    if response.status == 405 {
        // RFC 9110 §15.5.6: a 405 says what the resource does accept.
        let allow = allowed_methods(&segments);
        response.headers.push(("allow", allow.to_string()));
    }
    response
}

/// The answer (or error) of a route as sent, audited.
fn answered(request: &Request, answer: ApiResult) -> Response {
    let response = answer.unwrap_or_else(|ApiError(status, error)| {
        let body = serde_json::to_vec(&ErrorBody::new(error)).unwrap_or_default();
        Response::new(status, JSON, body)
    });
    audit(request, &response);
    response
}

/// Target of the log lines that record changes (admin API calls that change
/// something, configuration applied at start): `weir` logs it at info level by
/// default.
pub const AUDIT_TARGET: &str = "weir_audit";

/// Logs a request that changes something (any method but GET/HEAD): method,
/// path, the body (JSON, at most 512 bytes) and the outcome.
fn audit(request: &Request, response: &Response) {
    if matches!(request.method.as_str(), "GET" | "HEAD") {
        return;
    }
    let mut body: String = String::from_utf8_lossy(&request.body)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    clip(&mut body, 512);
    let status = response.status;
    if (200..300).contains(&status) {
        tracing::info!(target: AUDIT_TARGET, "admin: {} {} {body} -> {status}", request.method, request.path);
    } else {
        let error = serde_json::from_slice::<ErrorBody>(&response.body)
            .map(|e| e.error)
            .unwrap_or_default();
        tracing::info!(
            target: AUDIT_TARGET,
            "admin: {} {} {body} -> {status} refused: {error}",
            request.method,
            request.path
        );
    }
}

const JSON: &str = "application/json";

/// The path's segments, percent-decoded.
fn route(path: &str) -> Result<Vec<String>, ApiError> {
    path.trim_start_matches('/')
        .split('/')
        .map(|segment| {
            decode(segment)
                .ok_or_else(|| ApiError(400, format!("bad percent-encoding in {segment:?}")))
        })
        .collect()
}

/// The volumes with who holds their exclusive-writer lease now.
fn with_leases(s: &ServerState, mut volumes: Vec<VolumeRecord>) -> Vec<VolumeRecord> {
    let holders: HashMap<String, LeaseHolder> = s
        .leases
        .holders()
        .into_iter()
        .map(|(volume, holder, connections)| {
            (
                volume,
                LeaseHolder {
                    holder,
                    connections,
                },
            )
        })
        .collect();
    for v in &mut volumes {
        v.exclusive_lease = holders.get(&v.name).cloned();
    }
    volumes
}

fn dispatch(s: &ServerState, method: &str, path: &[&str], body: &[u8]) -> ApiResult {
    let store = || s.store();
    match (method, path) {
        ("GET", ["v1", "volumes"]) => ok(&with_leases(s, store().list())),
        ("POST", ["v1", "volumes"]) => created(&s.create_volume(parse(body)?)?),
        ("GET", ["v1", "volumes", name]) => ok(&with_leases(s, vec![store().get(name)?])[0]),
        ("PATCH", ["v1", "volumes", name]) => {
            let change: VolumeUpdate = parse(body)?;
            ok(&store().update_volume(name, change)?)
        }
        ("DELETE", ["v1", "volumes", name]) => ok(&s.delete_volume(name)?),
        ("POST", ["v1", "volumes", name, "resize"]) => {
            let req: ResizeRequest = parse(body)?;
            ok(&s.resize_volume(name, req.size_bytes)?)
        }
        ("POST", ["v1", "volumes", name, "policy"]) => {
            let req: SetPolicyRequest = parse(body)?;
            ok(&s.set_volume_policy(name, &req.policy)?)
        }
        ("GET", ["v1", "volumes", name, "stats"]) => ok(&volume_stats(s, name)?),
        ("GET", ["v1", "snapshots"]) => ok(&store().snapshots(None)?),
        ("GET", ["v1", "volumes", name, "snapshots"]) => ok(&store().snapshots(Some(name))?),
        ("POST", ["v1", "volumes", name, "snapshots"]) => {
            let req: SnapshotRequest = parse(body)?;
            created(&store().snapshot(name, &req.name)?)
        }
        ("DELETE", ["v1", "volumes", name, "snapshots", snap]) => {
            ok(&s.delete_snapshot(name, snap)?)
        }
        ("POST", ["v1", "volumes", name, "snapshots", snap, "clones"]) => {
            let req: CloneRequest = parse(body)?;
            created(&s.clone_snapshot(name, snap, &req.names, req.policy.as_deref())?)
        }
        ("POST", ["v1", "volumes", name, "rollback"]) => {
            let req: RollbackRequest = parse(body)?;
            ok(&s.rollback_volume(name, &req.snapshot)?)
        }
        ("POST", ["v1", "volumes", name, "flatten"]) => ok(&s.flatten_volume(name)?),
        ("POST", ["v1", "volumes", name, "takeover"]) => ok(&store().take_over(name)?),
        ("POST", ["v1", "volumes", name, "break-lease"]) => {
            store().get(name)?;
            ok(&s.leases.break_lease(name))
        }
        ("GET", ["v1", "check"]) => ok(&s.check_thin()?),
        ("GET", ["v1", "replications"]) => ok(&s.replication.list(s)),
        ("GET", ["v1", "volumes", name, "replication"]) => ok(&s.replication.status(s, name)?),
        ("POST", ["v1", "volumes", name, "replication"]) => {
            let req: crate::replicate::ReplicationRequest = parse(body)?;
            match s.replication.put(s, name, &req)? {
                (status, true) => created(&status),
                (status, false) => ok(&status),
            }
        }
        ("DELETE", ["v1", "volumes", name, "replication"]) => ok(&s.replication.stop(s, name)?),
        ("GET", ["v1", "pools"]) => ok(&s.pool_reports()),
        ("GET", ["v1", "capacity"]) => ok(&crate::capacity::pools(&store())),
        ("GET", ["v1", "server"]) => ok(&s.server_info()),
        ("GET", ["v1", "policies"]) => ok(&store().policies()),
        ("POST", ["v1", "policies"]) => {
            let p: Policy = parse(body)?;
            created(&store().create_policy(p)?)
        }
        ("GET", ["v1", "policies", name]) => ok(&store().policy(name)?),
        ("PUT", ["v1", "policies", name]) => {
            let p: Policy = parse(body)?;
            if p.name != *name {
                return Err(ApiError(
                    400,
                    format!(
                        "policy name {:?} in the body does not match {name:?} in the path",
                        p.name
                    ),
                ));
            }
            ok(&s.update_policy(p)?)
        }
        ("DELETE", ["v1", "policies", name]) => ok(&store().delete_policy(name)?),
        ("GET", ["v1", "access-groups"]) => ok(&store().access_groups()),
        ("GET", ["v1", "access-groups", name]) => ok(&store().access_group(name)?),
        ("PUT", ["v1", "access-groups", name]) => {
            let group: AccessGroupConfig = parse(body)?;
            // As the config file refuses it: without client certificates no
            // client has an identity, so such a group would admit nobody.
            if !group.identities.is_empty() && !s.tls.client_certificates() {
                return Err(ApiError(
                    400,
                    format!(
                        "access group {name:?}: client identities need tls_client_ca (and tls) on this server; without it no client presents a certificate, so nobody could reach its volumes"
                    ),
                ));
            }
            if group.name != *name {
                return Err(ApiError(
                    400,
                    format!(
                        "group name {:?} in the body does not match {name:?} in the path",
                        group.name
                    ),
                ));
            }
            ok(&store().put_access_group(group)?)
        }
        ("DELETE", ["v1", "access-groups", name]) => ok(&store().delete_access_group(name)?),
        ("GET", ["metrics"]) => Ok(Response::new(
            200,
            "text/plain; version=0.0.4",
            metrics_text(s).into_bytes(),
        )),
        (_, path) if is_route(path) => Err(ApiError(
            405,
            format!("method {method} is not allowed on /{}", path.join("/")),
        )),
        (_, path) => Err(ApiError(
            404,
            format!("no such resource: /{}", path.join("/")),
        )),
    }
}

/// The methods served at `path` (as an `Allow` header: "GET, POST"); empty: no
/// such resource. The same table as [`dispatch`] and [`crate::sampler::api`].
fn allowed_methods(path: &[&str]) -> &'static str {
    match path {
        ["v1", "volumes" | "policies"] => "GET, POST",
        ["v1", "volumes", _] => "GET, PATCH, DELETE",
        ["v1", "policies" | "access-groups", _] => "GET, PUT, DELETE",
        ["v1", "volumes", _, "snapshots"] => "GET, POST",
        ["v1", "volumes", _, "replication"] => "GET, POST, DELETE",
        ["v1", "volumes", _, "stats" | "history"] => "GET",
        [
            "v1",
            "volumes",
            _,
            "resize" | "policy" | "rollback" | "flatten" | "takeover" | "break-lease",
        ] => "POST",
        ["v1", "volumes", _, "snapshots", _] => "DELETE",
        ["v1", "volumes", _, "snapshots", _, "clones"] => "POST",
        [
            "v1",
            "access-groups" | "pools" | "snapshots" | "check" | "replications" | "capacity"
            | "server" | "stats",
        ]
        | ["metrics"] => "GET",
        _ => "",
    }
}

/// Whether some method is served at `path`.
fn is_route(path: &[&str]) -> bool {
    !allowed_methods(path).is_empty()
}

/// The Prometheus text of `/metrics`: every volume (from the start, with its
/// size, policy figures and labels), host, pool and connection, thin space,
/// replication, build info and `process_*`.
pub fn metrics_text(s: &ServerState) -> String {
    let volumes = s.volume_views();
    let pools = s.pool_gauges();
    let mut text = s.metrics.render_prometheus(&volumes, &pools);
    text.push_str(&s.limits.render_prometheus());
    text.push_str(&crate::capacity::render_prometheus(&s.store()));
    text.push_str(&s.thin_metrics());
    text.push_str(&s.descriptor_metrics());
    text.push_str(&s.upstream_metrics());
    text.push_str(&s.flash_cache_metrics());
    text.push_str(&s.tier_metrics());
    text.push_str(&s.replication.prometheus(s));
    text.push_str(&s.leases.render_prometheus());
    text.push_str(&crate::metrics::render_process());
    text
}

fn volume_stats(s: &ServerState, name: &str) -> Result<VolumeStatsReport, ApiError> {
    let volume = s.store().get(name)?;
    let counters = s.metrics.volume(name).snapshot();
    let pool = s.pool(&volume.pool);
    let sched = pool
        .as_ref()
        .and_then(|p| p.volume_stats(VolumeId(volume.id)))
        .unwrap_or_default();
    let applied_policy = pool.as_ref().and_then(|p| p.policy(VolumeId(volume.id)));
    let gauges = pool.map(|p| p.gauges()).unwrap_or_default();
    Ok(VolumeStatsReport {
        uptime_seconds: s.started.elapsed().as_secs_f64(),
        mean_latency_ms: counters.mean_latency_ms(),
        counters,
        queued: sched.queued,
        reservation_dispatches: sched.reservation_dispatches,
        protected_dispatches: sched.protected_dispatches,
        held_back_dispatches: sched.held_back_dispatches,
        dispatched_ios: sched.dispatched_ios,
        pool: gauges,
        applied_policy,
        replication: s.replication.status(s, name).ok(),
        flash_cache: VolumeFlashCacheReport::of(s, &volume.pool, name),
        volume,
    })
}

/// A JSON request body; as axum's `Json` does: 400 for malformed JSON, 422 for JSON
/// of the wrong shape.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let status = match e.classify() {
            serde_json::error::Category::Data => 422,
            _ => 400,
        };
        ApiError(status, format!("invalid request body: {e}"))
    })
}

fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> ApiResult {
    let body = serde_json::to_vec(value).map_err(|e| ApiError(500, e.to_string()))?;
    Ok(Response::new(status, JSON, body))
}

fn ok<T: Serialize + ?Sized>(value: &T) -> ApiResult {
    json(200, value)
}

fn created<T: Serialize + ?Sized>(value: &T) -> ApiResult {
    json(201, value)
}

/// Percent-decodes one path segment (`None`: a bad escape or not UTF-8).
fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Admin API client (one HTTP/1.1 request per call, `Connection: close`).
#[derive(Clone, Debug)]
pub struct Client {
    addr: SocketAddr,
    token: Option<String>,
    /// The `Host` header (default: the address).
    host: Option<String>,
}

/// An admin call that failed: transport trouble or an error answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the weir admin API at {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("admin API answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("malformed admin API answer: {0}")]
    Protocol(String),
}

impl Client {
    /// A client without a token (every call but a refused one needs
    /// [`Client::with_token`]).
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            token: None,
            host: None,
        }
    }

    /// Sends `Host: <host>` (a name the server's `admin_hosts` accepts) instead
    /// of the address.
    pub fn with_host(mut self, host: impl Into<String>) -> Client {
        self.host = Some(host.into());
        self
    }

    /// The address it connects to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Which server answers (`GET /v1/server`).
    pub async fn server_info(&self) -> Result<ServerInfo, ClientError> {
        self.call("GET", "/v1/server", None::<&()>).await
    }
    /// Every pool's space (`GET /v1/capacity`).
    pub async fn capacity(&self) -> Result<Vec<crate::capacity::PoolCapacity>, ClientError> {
        self.call("GET", "/v1/capacity", None::<&()>).await
    }
    /// Replaces a user-defined policy; its volumes follow at once.
    pub async fn update_policy(&self, policy: &Policy) -> Result<Policy, ClientError> {
        let path = format!("/v1/policies/{}", encode(&policy.name));
        self.call("PUT", &path, Some(policy)).await
    }

    /// Sends `Authorization: Bearer <token>` with every call.
    pub fn with_token(mut self, token: impl Into<String>) -> Client {
        self.token = Some(token.into());
        self
    }

    pub async fn list_volumes(&self) -> Result<Vec<VolumeRecord>, ClientError> {
        self.call("GET", "/v1/volumes", None::<&()>).await
    }
    pub async fn create_volume(&self, req: &VolumeCreate) -> Result<VolumeRecord, ClientError> {
        self.call("POST", "/v1/volumes", Some(req)).await
    }
    pub async fn show_volume(&self, name: &str) -> Result<VolumeRecord, ClientError> {
        self.call("GET", &format!("/v1/volumes/{}", encode(name)), None::<&()>)
            .await
    }
    /// Changes access groups, read-only flag or description (new connections).
    pub async fn update_volume(
        &self,
        name: &str,
        change: &VolumeUpdate,
    ) -> Result<VolumeRecord, ClientError> {
        self.call(
            "PATCH",
            &format!("/v1/volumes/{}", encode(name)),
            Some(change),
        )
        .await
    }
    pub async fn delete_volume(&self, name: &str) -> Result<VolumeRecord, ClientError> {
        self.call(
            "DELETE",
            &format!("/v1/volumes/{}", encode(name)),
            None::<&()>,
        )
        .await
    }
    /// Grows a volume (shrinking is refused).
    pub async fn resize_volume(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<VolumeRecord, ClientError> {
        let body = ResizeRequest { size_bytes };
        self.call(
            "POST",
            &format!("/v1/volumes/{}/resize", encode(name)),
            Some(&body),
        )
        .await
    }
    pub async fn set_volume_policy(
        &self,
        name: &str,
        policy: &str,
    ) -> Result<VolumeRecord, ClientError> {
        let body = SetPolicyRequest {
            policy: policy.to_string(),
        };
        self.call(
            "POST",
            &format!("/v1/volumes/{}/policy", encode(name)),
            Some(&body),
        )
        .await
    }
    pub async fn volume_stats(&self, name: &str) -> Result<VolumeStatsReport, ClientError> {
        self.call(
            "GET",
            &format!("/v1/volumes/{}/stats", encode(name)),
            None::<&()>,
        )
        .await
    }
    /// Every pool's QoS gate now (`/v1/pools`).
    pub async fn list_pools(&self) -> Result<Vec<PoolStatsReport>, ClientError> {
        self.call("GET", "/v1/pools", None::<&()>).await
    }
    pub async fn list_policies(&self) -> Result<Vec<Policy>, ClientError> {
        self.call("GET", "/v1/policies", None::<&()>).await
    }
    pub async fn create_policy(&self, policy: &Policy) -> Result<Policy, ClientError> {
        self.call("POST", "/v1/policies", Some(policy)).await
    }
    pub async fn show_policy(&self, name: &str) -> Result<Policy, ClientError> {
        self.call(
            "GET",
            &format!("/v1/policies/{}", encode(name)),
            None::<&()>,
        )
        .await
    }
    pub async fn delete_policy(&self, name: &str) -> Result<Policy, ClientError> {
        self.call(
            "DELETE",
            &format!("/v1/policies/{}", encode(name)),
            None::<&()>,
        )
        .await
    }
    pub async fn list_access_groups(&self) -> Result<Vec<AccessGroupConfig>, ClientError> {
        self.call("GET", "/v1/access-groups", None::<&()>).await
    }
    pub async fn show_access_group(&self, name: &str) -> Result<AccessGroupConfig, ClientError> {
        self.call(
            "GET",
            &format!("/v1/access-groups/{}", encode(name)),
            None::<&()>,
        )
        .await
    }
    /// Creates or replaces the group `group.name`.
    pub async fn put_access_group(
        &self,
        group: &AccessGroupConfig,
    ) -> Result<AccessGroupConfig, ClientError> {
        self.call(
            "PUT",
            &format!("/v1/access-groups/{}", encode(&group.name)),
            Some(group),
        )
        .await
    }
    pub async fn delete_access_group(&self, name: &str) -> Result<AccessGroupConfig, ClientError> {
        self.call(
            "DELETE",
            &format!("/v1/access-groups/{}", encode(name)),
            None::<&()>,
        )
        .await
    }
    pub async fn snapshot(&self, volume: &str, name: &str) -> Result<SnapshotRecord, ClientError> {
        let req = SnapshotRequest { name: name.into() };
        let path = format!("/v1/volumes/{}/snapshots", encode(volume));
        self.call("POST", &path, Some(&req)).await
    }
    /// Snapshots of `volume`, or of every volume.
    pub async fn snapshots(
        &self,
        volume: Option<&str>,
    ) -> Result<Vec<SnapshotRecord>, ClientError> {
        let path = match volume {
            Some(v) => format!("/v1/volumes/{}/snapshots", encode(v)),
            None => "/v1/snapshots".into(),
        };
        self.call("GET", &path, None::<&()>).await
    }
    pub async fn delete_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotRecord, ClientError> {
        let path = format!("/v1/volumes/{}/snapshots/{}", encode(volume), encode(name));
        self.call("DELETE", &path, None::<&()>).await
    }
    pub async fn rollback(
        &self,
        volume: &str,
        snapshot: &str,
    ) -> Result<VolumeRecord, ClientError> {
        let req = RollbackRequest {
            snapshot: snapshot.into(),
        };
        let path = format!("/v1/volumes/{}/rollback", encode(volume));
        self.call("POST", &path, Some(&req)).await
    }
    pub async fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        req: &CloneRequest,
    ) -> Result<Vec<VolumeRecord>, ClientError> {
        let path = format!(
            "/v1/volumes/{}/snapshots/{}/clones",
            encode(volume),
            encode(snapshot)
        );
        self.call("POST", &path, Some(req)).await
    }
    pub async fn flatten(&self, volume: &str) -> Result<VolumeRecord, ClientError> {
        let path = format!("/v1/volumes/{}/flatten", encode(volume));
        self.call("POST", &path, None::<&()>).await
    }
    /// Failover: fences the gateway holding the volume's RBD lock.
    pub async fn takeover(&self, volume: &str) -> Result<crate::store::TakeOver, ClientError> {
        let path = format!("/v1/volumes/{}/takeover", encode(volume));
        self.call("POST", &path, None::<&()>).await
    }
    /// Breaks the exclusive lease a caching gateway holds on the volume.
    pub async fn break_lease(
        &self,
        volume: &str,
    ) -> Result<crate::lease::BrokenLease, ClientError> {
        let path = format!("/v1/volumes/{}/break-lease", encode(volume));
        self.call("POST", &path, None::<&()>).await
    }
    pub async fn check(&self) -> Result<Vec<ThinPoolCheck>, ClientError> {
        self.call("GET", "/v1/check", None::<&()>).await
    }
    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let (status, body) = self.raw("GET", "/metrics", None).await?;
        if status != 200 {
            return Err(ClientError::Api {
                status,
                message: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        String::from_utf8(body).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let body = body
            .map(|b| serde_json::to_vec(b))
            .transpose()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (status, bytes) = self.raw(method, path, body.as_deref()).await?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ClientError::Api { status, message });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            ClientError::Protocol(format!("{e} in {:?}", String::from_utf8_lossy(&bytes)))
        })
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let host = self.host.clone().unwrap_or_else(|| self.addr.to_string());
        let mut headers = vec![("host", host), ("accept", "application/json".to_string())];
        let body = body.unwrap_or_default();
        if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
            headers.push(("content-type", "application/json".to_string()));
        }
        if let Some(token) = &self.token {
            headers.push(("authorization", format!("Bearer {token}")));
        }
        weir_http::client::exchange(self.addr, method, path, &headers, body.to_vec())
            .await
            .map_err(|e| match e {
                weir_http::client::ExchangeError::Connect(source) => ClientError::Connect {
                    addr: self.addr,
                    source,
                },
                weir_http::client::ExchangeError::Protocol(m) => ClientError::Protocol(m),
            })
    }
}

/// Replication (`crate::replicate`).
impl Client {
    /// Creates or updates the replication of `volume` (`once`: a cycle now).
    pub async fn replicate(
        &self,
        volume: &str,
        req: &crate::replicate::ReplicationRequest,
    ) -> Result<crate::replicate::ReplicationStatus, ClientError> {
        let path = format!("/v1/volumes/{}/replication", encode(volume));
        self.call("POST", &path, Some(req)).await
    }
    pub async fn replication(
        &self,
        volume: &str,
    ) -> Result<crate::replicate::ReplicationStatus, ClientError> {
        let path = format!("/v1/volumes/{}/replication", encode(volume));
        self.call("GET", &path, None::<&()>).await
    }
    pub async fn replications(
        &self,
    ) -> Result<Vec<crate::replicate::ReplicationStatus>, ClientError> {
        self.call("GET", "/v1/replications", None::<&()>).await
    }
    /// Stops the replication of `volume`; returns its last status.
    pub async fn stop_replication(
        &self,
        volume: &str,
    ) -> Result<crate::replicate::ReplicationStatus, ClientError> {
        let path = format!("/v1/volumes/{}/replication", encode(volume));
        self.call("DELETE", &path, None::<&()>).await
    }
}

/// Live figures and history (`crate::sampler`, `crate::history`).
impl Client {
    /// Every volume's and host's last second (`GET /v1/stats`).
    pub async fn live_stats(&self) -> Result<crate::sampler::LiveStats, ClientError> {
        self.call("GET", "/v1/stats", None::<&()>).await
    }
    /// A volume's history over the last `since_s` seconds, a point every `step_s`.
    pub async fn volume_history(
        &self,
        name: &str,
        since_s: u64,
        step_s: u64,
    ) -> Result<crate::history::Series, ClientError> {
        let path = format!(
            "/v1/volumes/{}/history?since={since_s}&step={step_s}",
            encode(name)
        );
        self.call("GET", &path, None::<&()>).await
    }
}

fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn error_messages_are_bounded_at_a_character_boundary() {
        let long = format!("bad name {:?}", "é".repeat(3000));
        let error = ErrorBody::new(long).error;
        assert!(
            error.len() <= MAX_ERROR_BYTES + '…'.len_utf8(),
            "{}",
            error.len()
        );
        assert!(
            error.starts_with("bad name \"é") && error.ends_with('…'),
            "{error}"
        );
        assert_eq!(ErrorBody::new("short".into()).error, "short");
    }

    #[test]
    fn requests_route_to_answers_with_status_and_error_bodies() {
        let dir = weir_testkit::TempDir::new("admin-handle");
        let mut config = crate::WeirConfig::embedded_default();
        config.data_dir = dir.path().to_path_buf();
        let state = ServerState::new(&config).unwrap();
        let call = |method: &str, path: &str, body: &str| {
            handle(
                &state,
                &Request {
                    method: method.into(),
                    path: path.into(),
                    body: body.as_bytes().to_vec(),
                    ..Request::default()
                },
            )
        };
        let error = |r: &Response| serde_json::from_slice::<ErrorBody>(&r.body).unwrap().error;

        let r = call("GET", "/v1/volumes", "");
        assert_eq!((r.status, r.content_type), (200, JSON));
        let volumes: Vec<VolumeRecord> = serde_json::from_slice(&r.body).unwrap();
        assert!(!volumes.is_empty());
        let name = &volumes[0].name;
        let r = call("GET", &format!("/v1/volumes/{}", encode(name)), "");
        assert_eq!(r.status, 200);
        let r = call("GET", "/v1/volumes/no%20such", "");
        assert_eq!(r.status, 404);
        assert!(error(&r).contains("no such"), "{}", error(&r));
        let r = call("DELETE", "/v1/policies", "");
        assert_eq!(r.status, 405);
        assert!(error(&r).contains("DELETE"), "{}", error(&r));
        // RFC 9110 §15.5.6: a 405 lists what the resource accepts.
        let allow = |method: &str, path: &str| {
            let r = call(method, path, "");
            assert_eq!(r.status, 405, "{method} {path}");
            let allow: Vec<_> = r.headers.iter().filter(|h| h.0 == "allow").collect();
            assert_eq!(allow.len(), 1, "{method} {path}: {:?}", r.headers);
            allow[0].1.clone()
        };
        assert_eq!(allow("DELETE", "/v1/policies"), "GET, POST");
        assert_eq!(
            allow("POST", &format!("/v1/volumes/{}", encode(name))),
            "GET, PATCH, DELETE"
        );
        assert_eq!(allow("GET", "/v1/volumes/x/resize"), "POST");
        assert_eq!(allow("PUT", "/v1/volumes/x/snapshots/s"), "DELETE");
        assert_eq!(allow("POST", "/v1/stats"), "GET");
        assert_eq!(allow("DELETE", "/v1/volumes/x/history"), "GET");
        assert_eq!(allow("POST", "/metrics"), "GET");
        assert!(call("GET", "/v1/volumes", "").headers.is_empty());
        assert_eq!(call("GET", "/v2/volumes", "").status, 404);
        assert_eq!(call("GET", "/v1/volumes/%zz", "").status, 400);
        let r = call("POST", "/v1/policies", "{");
        assert_eq!(r.status, 400);
        assert!(error(&r).contains("invalid request body"), "{}", error(&r));
        assert_eq!(call("POST", "/v1/policies", r#"{"name": 5}"#).status, 422);
        let r = call(
            "POST",
            "/v1/policies",
            r#"{"name": "gold", "limit_iops": 5000}"#,
        );
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(
            call("POST", "/v1/policies", r#"{"name": "gold"}"#).status,
            409
        );
        let r = call("GET", "/metrics", "");
        assert_eq!(r.status, 200);
        assert!(r.content_type.starts_with("text/plain"));
    }

    #[test]
    fn paths_decode_and_route() {
        assert_eq!(decode(&encode("a b/c")).as_deref(), Some("a b/c"));
        assert_eq!(decode("x%2"), None);
        assert_eq!(decode("%zz"), None);
        assert_eq!(decode("%FF"), None);
        assert_eq!(
            route("/v1/volumes/db%2F1").ok(),
            Some(vec!["v1".into(), "volumes".into(), "db/1".into()])
        );
        assert!(is_route(&["v1", "volumes", "db", "stats"]));
        assert!(is_route(&["v1", "volumes", "db", "history"]));
        assert!(is_route(&["v1", "stats"]));
        assert!(is_route(&["metrics"]));
        assert!(!is_route(&["v1", "volumes", "db", "nope"]));
        assert!(!is_route(&["v2"]));
    }
}
