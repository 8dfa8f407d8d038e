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
//! | GET | `/v1/policies` | | `[Policy]` |
//! | POST | `/v1/policies` | `Policy` | `Policy` (201) |
//! | GET | `/v1/policies/{name}` | | `Policy` |
//! | DELETE | `/v1/policies/{name}` | | `Policy` |
//! | GET | `/v1/access-groups` | | `[AccessGroupConfig]` |
//! | PUT | `/v1/access-groups/{name}` | `AccessGroupConfig` | `AccessGroupConfig` (create or replace) |
//! | GET | `/v1/access-groups/{name}` | | `AccessGroupConfig` |
//! | DELETE | `/v1/access-groups/{name}` | | `AccessGroupConfig` |
//! | GET | `/metrics` | | Prometheus text |
//!
//! Errors are `{"error": "message"}` with 400 (invalid), 404 (not found),
//! 409 (conflict) or 500.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_qos::{Policy, VolumeId};

use crate::config::AccessGroupConfig;
use crate::metrics::CounterSnapshot;
use crate::server::ServerState;
use crate::store::{StoreError, VolumeCreate, VolumeRecord, VolumeUpdate};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeRequest {
    pub size_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    pub dispatched_ios: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

struct ApiError(StatusCode, String);

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match e {
            StoreError::NotFound(_) => StatusCode::NOT_FOUND,
            StoreError::Conflict(_) => StatusCode::CONFLICT,
            StoreError::Invalid(_) => StatusCode::BAD_REQUEST,
            StoreError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

type Shared = State<Arc<ServerState>>;
type ApiResult<T> = Result<T, ApiError>;

pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/v1/volumes", get(list_volumes).post(create_volume))
        .route(
            "/v1/volumes/{name}",
            get(show_volume).patch(update_volume).delete(delete_volume),
        )
        .route("/v1/volumes/{name}/resize", post(resize_volume))
        .route("/v1/volumes/{name}/policy", post(set_policy))
        .route("/v1/volumes/{name}/stats", get(volume_stats))
        .route("/v1/policies", get(list_policies).post(create_policy))
        .route(
            "/v1/policies/{name}",
            get(show_policy).delete(delete_policy),
        )
        .route("/v1/access-groups", get(list_groups))
        .route(
            "/v1/access-groups/{name}",
            get(show_group).put(put_group).delete(delete_group),
        )
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn list_volumes(State(s): Shared) -> Json<Vec<VolumeRecord>> {
    Json(s.store().list())
}

async fn create_volume(
    State(s): Shared,
    Json(req): Json<VolumeCreate>,
) -> ApiResult<(StatusCode, Json<VolumeRecord>)> {
    let r = tokio::task::spawn_blocking(move || s.create_volume(req))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok((StatusCode::CREATED, Json(r)))
}

async fn show_volume(State(s): Shared, Path(name): Path<String>) -> ApiResult<Json<VolumeRecord>> {
    Ok(Json(s.store().get(&name)?))
}

async fn update_volume(
    State(s): Shared,
    Path(name): Path<String>,
    Json(change): Json<VolumeUpdate>,
) -> ApiResult<Json<VolumeRecord>> {
    Ok(Json(s.store().update_volume(&name, change)?))
}

async fn delete_volume(
    State(s): Shared,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeRecord>> {
    Ok(Json(s.delete_volume(&name)?))
}

async fn resize_volume(
    State(s): Shared,
    Path(name): Path<String>,
    Json(req): Json<ResizeRequest>,
) -> ApiResult<Json<VolumeRecord>> {
    Ok(Json(s.store().resize(&name, req.size_bytes)?))
}

async fn set_policy(
    State(s): Shared,
    Path(name): Path<String>,
    Json(req): Json<SetPolicyRequest>,
) -> ApiResult<Json<VolumeRecord>> {
    Ok(Json(s.set_volume_policy(&name, &req.policy)?))
}

async fn volume_stats(
    State(s): Shared,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeStatsReport>> {
    let volume = s.store().get(&name)?;
    let counters = s.metrics.volume(&name).snapshot();
    let sched = s
        .pool(&volume.pool)
        .and_then(|p| p.volume_stats(VolumeId(volume.id)))
        .unwrap_or_default();
    Ok(Json(VolumeStatsReport {
        uptime_seconds: s.started.elapsed().as_secs_f64(),
        mean_latency_ms: counters.mean_latency_ms(),
        counters,
        queued: sched.queued,
        reservation_dispatches: sched.reservation_dispatches,
        dispatched_ios: sched.dispatched_ios,
        volume,
    }))
}

async fn list_policies(State(s): Shared) -> Json<Vec<Policy>> {
    Json(s.store().policies())
}

async fn create_policy(
    State(s): Shared,
    Json(p): Json<Policy>,
) -> ApiResult<(StatusCode, Json<Policy>)> {
    Ok((StatusCode::CREATED, Json(s.store().create_policy(p)?)))
}

async fn show_policy(State(s): Shared, Path(name): Path<String>) -> ApiResult<Json<Policy>> {
    Ok(Json(s.store().policy(&name)?))
}

async fn delete_policy(State(s): Shared, Path(name): Path<String>) -> ApiResult<Json<Policy>> {
    Ok(Json(s.store().delete_policy(&name)?))
}

async fn list_groups(State(s): Shared) -> Json<Vec<AccessGroupConfig>> {
    Json(s.store().access_groups())
}

async fn show_group(
    State(s): Shared,
    Path(name): Path<String>,
) -> ApiResult<Json<AccessGroupConfig>> {
    Ok(Json(s.store().access_group(&name)?))
}

async fn put_group(
    State(s): Shared,
    Path(name): Path<String>,
    Json(group): Json<AccessGroupConfig>,
) -> ApiResult<Json<AccessGroupConfig>> {
    if group.name != name {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "group name {:?} in the body does not match {name:?} in the path",
                group.name
            ),
        ));
    }
    Ok(Json(s.store().put_access_group(group)?))
}

async fn delete_group(
    State(s): Shared,
    Path(name): Path<String>,
) -> ApiResult<Json<AccessGroupConfig>> {
    Ok(Json(s.store().delete_access_group(&name)?))
}

async fn metrics(State(s): Shared) -> impl IntoResponse {
    let queued = s.queued_by_volume();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render_prometheus(&queued),
    )
}

/// Admin API client (one HTTP/1.1 request per call, `Connection: close`).
#[derive(Clone, Debug)]
pub struct Client {
    addr: SocketAddr,
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
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr }
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
        let connect = |source| ClientError::Connect {
            addr: self.addr,
            source,
        };
        let mut stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(connect)?;
        let body = body.unwrap_or_default();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).await.map_err(connect)?;
        stream.write_all(body).await.map_err(connect)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.map_err(connect)?;
        parse_response(&answer)
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

/// Parses an HTTP/1.1 response read to EOF (Content-Length, chunked or close-delimited).
fn parse_response(bytes: &[u8]) -> Result<(u16, Vec<u8>), ClientError> {
    let bad = |m: &str| ClientError::Protocol(m.to_string());
    let head_end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&bytes[..head_end]).map_err(|_| bad("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if k == "content-length" {
                length = v.parse::<usize>().ok();
            }
        }
    }
    let rest = &bytes[head_end + 4..];
    let body = if chunked {
        let mut out = Vec::new();
        let mut r = rest;
        loop {
            let line_end = r
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or_else(|| bad("truncated chunk"))?;
            let size_text =
                std::str::from_utf8(&r[..line_end]).map_err(|_| bad("bad chunk size"))?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            r = &r[line_end + 2..];
            if size == 0 {
                break;
            }
            if r.len() < size + 2 {
                return Err(bad("truncated chunk"));
            }
            out.extend_from_slice(&r[..size]);
            r = &r[size + 2..];
        }
        out
    } else if let Some(n) = length {
        rest.get(..n).ok_or_else(|| bad("truncated body"))?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]";
        assert_eq!(parse_response(r).unwrap(), (200, b"[]".to_vec()));
        let r = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(r).unwrap(), (404, b"abcde".to_vec()));
        assert!(parse_response(b"garbage").is_err());
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
