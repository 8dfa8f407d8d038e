//! # weir-http — the admin API's HTTP/1.1 server behind one plain function
//!
//! weir-server answers admin requests with a synchronous
//! `Fn(Request) -> Response` ([`Handler`]); this crate does the HTTP: axum and hyper
//! parse requests, the handler runs on tokio's blocking pool (admin calls take the
//! volume store's lock and may create or fsync files), the answer is written back.
//!
//! Why a crate of its own: build time. Routing, extractors and the connection code
//! of axum/hyper are generic and would be compiled in whichever crate instantiates
//! them — in weir-server, at the data path's opt-level 3. Here they are instantiated
//! once, for the boxed handler, and compiled at opt-level 0 (the admin API serves a
//! few requests per second); weir-server only sees [`spawn`] and a `JoinHandle`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response as HttpResponse};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Largest request body accepted (larger: 413).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// One request: method (`GET`, …), path (still percent-encoded), query (what
/// follows `?`, still encoded; empty without one), headers (names in lower case,
/// values that are not visible ASCII dropped), body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// How many times header `name` (lower case) appears.
    pub fn header_count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(n, _)| n == name).count()
    }
}

/// One answer: status code, `Content-Type`, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// Sent with every answer (the dashboard's page and files, the API's JSON): the page
/// runs only its own scripts and styles from this origin, talks only to this
/// origin, and is never framed by another page (clickjacking).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// What answers requests.
pub type Handler = Arc<dyn Fn(Request) -> Response + Send + Sync>;

/// Serves HTTP/1.1 on `listener` in a new task until `shutdown` completes, then
/// finishes the requests in progress and ends the task.
pub fn spawn(
    listener: TcpListener,
    handler: Handler,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> JoinHandle<()> {
    let app = Router::new().fallback(move |request: axum::extract::Request| {
        let handler = handler.clone();
        async move { answer(handler, request).await }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            eprintln!("admin API stopped: {e}");
        }
    })
}

async fn answer(handler: Handler, request: axum::extract::Request) -> HttpResponse {
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let headers = request
        .headers()
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await {
        Ok(b) => b.to_vec(),
        Err(e) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body unreadable or over {MAX_BODY_BYTES} bytes: {e}"),
            )
                .into_response();
        }
    };
    let request = Request {
        method,
        path,
        query,
        headers,
        body,
    };
    match tokio::task::spawn_blocking(move || handler(request)).await {
        Ok(r) => {
            let status =
                StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (
                status,
                [
                    (header::CONTENT_TYPE, r.content_type),
                    (header::X_FRAME_OPTIONS, "DENY"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    (header::REFERRER_POLICY, "no-referrer"),
                    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
                ],
                Body::from(r.body),
            )
                .into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("admin handler failed: {e}"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn exchange(addr: std::net::SocketAddr, raw: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(raw.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn requests_reach_the_handler_and_answers_come_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler: Handler = Arc::new(|r: Request| Response {
            status: if r.path == "/missing" { 404 } else { 201 },
            content_type: "text/plain",
            body: format!(
                "{} {} {} {}",
                r.method,
                r.path,
                r.header("x-test").unwrap_or("-"),
                String::from_utf8_lossy(&r.body)
            )
            .into_bytes(),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = spawn(
            listener,
            handler,
            Box::pin(async move {
                let _ = rx.await;
            }),
        );
        let a = exchange(
            addr,
            "POST /v1/x%20y?q=1 HTTP/1.1\r\nHost: h\r\nX-Test: yes\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        assert!(a.starts_with("HTTP/1.1 201"), "{a}");
        assert!(
            a.to_ascii_lowercase().contains("content-type: text/plain"),
            "{a}"
        );
        assert!(a.ends_with("POST /v1/x%20y yes hello"), "{a}");
        let lower = a.to_ascii_lowercase();
        for header in [
            "x-frame-options: deny",
            "x-content-type-options: nosniff",
            "referrer-policy: no-referrer",
            "content-security-policy: default-src 'self';",
        ] {
            assert!(lower.contains(header), "no {header:?} in {a}");
        }
        assert!(lower.contains("frame-ancestors 'none'"), "{a}");
        let a = exchange(
            addr,
            "GET /missing HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(a.starts_with("HTTP/1.1 404"), "{a}");
        let big = format!(
            "PUT /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(big.as_bytes()).await.unwrap();
        s.write_all(&vec![b'x'; MAX_BODY_BYTES + 1]).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(
            out.starts_with(b"HTTP/1.1 413"),
            "{}",
            String::from_utf8_lossy(&out[..40])
        );
        tx.send(()).unwrap();
        task.await.unwrap();
    }
}
