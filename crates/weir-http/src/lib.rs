//! # weir-http — the admin API's HTTP/1.1 server behind one plain function
//!
//! weir-server answers admin requests with a synchronous
//! `Fn(Request) -> Response` ([`Handler`]); this crate does the HTTP: hyper parses
//! requests, the handler runs on tokio's blocking pool (admin calls take the
//! volume store's lock and may create or fsync files), the answer is written back.
//!
//! Bounded like the NBD side ([`Limits`]): the admin port shares the process's
//! descriptors with every NBD connection and volume file, so an unbounded accept
//! loop let anyone who could reach it take them all with connections that never
//! finish their headers (19,900 were held open for minutes, leaving the NBD
//! listener 79 descriptors). Now: a cap in total and per client address (over it, a
//! 503 and the connection closed at once), a deadline for each request's head
//! (which also closes an idle keep-alive connection), a size limit for it
//! ([`MAX_HEAD_BYTES`], else 431), one deadline for its body, and one for a reply
//! the client takes nothing of.
//!
//! Why a crate of its own: build time. hyper's connection code is generic and would
//! be compiled in whichever crate instantiates it — in weir-server, at the data
//! path's opt-level 3. Here it is instantiated once, for the boxed handler, and
//! compiled at opt-level 0 (the admin API serves a few requests per second);
//! weir-server only sees [`spawn`] and a `JoinHandle`.

pub mod client;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::StatusCode;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Sleep;

/// Longest request head (request line and headers, up to and with the blank line)
/// accepted; longer: 431 and the connection closed, the request never handled.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// Largest request body accepted (larger: 413).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// What one admin listener lets its clients hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all clients together.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_per_address: usize,
    /// A request's head must arrive within this; an idle keep-alive connection is
    /// closed after it too.
    pub header_timeout: Duration,
    /// A request's body must arrive within this (else 408).
    pub body_timeout: Duration,
    /// A connection whose client takes none of its reply for this long is closed.
    pub write_stall: Duration,
}

impl Limits {
    /// The admin API's: a few operators, their dashboards (a browser opens up to six
    /// connections to one origin), `weir top`, a Prometheus scraper.
    pub const ADMIN: Limits = Limits {
        max_connections: 128,
        max_per_address: 16,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        write_stall: Duration::from_secs(10),
    };
}

/// How long [`spawn`]'s task waits at shutdown for requests in progress.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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

/// One answer: status code, `Content-Type`, body, and any further headers (name,
/// value: `("allow", "GET, POST")` on a 405; one that is not a valid header is
/// left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

impl Response {
    /// An answer without further headers.
    pub fn new(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            body,
            headers: Vec::new(),
        }
    }
}

/// Sent with every answer (the dashboard's page and files, the API's JSON): the page
/// runs only its own scripts and styles from this origin, talks only to this
/// origin, and is never framed by another page (clickjacking).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// What answers requests.
pub type Handler = Arc<dyn Fn(Request) -> Response + Send + Sync>;

/// Looks at a request before its body is read (`body` empty): `Some` answers it
/// at once, the body unread (an unauthenticated client's 2 MiB is never taken
/// in, nor a `100 Continue` sent), and the connection closes after the answer.
pub type HeadCheck = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

/// The head check (if any) and the handler of one listener.
#[derive(Clone)]
struct Handlers {
    head: Option<HeadCheck>,
    answer: Handler,
}

/// Serves HTTP/1.1 on `listener` in a new task until `shutdown` completes, then
/// stops accepting, lets the requests in progress finish (at most
/// [`SHUTDOWN_GRACE`]) and ends the task.
pub fn spawn(
    listener: TcpListener,
    handler: Handler,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    limits: Limits,
) -> JoinHandle<()> {
    let handlers = Handlers {
        head: None,
        answer: handler,
    };
    tokio::spawn(serve(listener, handlers, shutdown, limits))
}

/// [`spawn`], with `head` asked first about every request (see [`HeadCheck`]).
pub fn spawn_checked(
    listener: TcpListener,
    head: HeadCheck,
    handler: Handler,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    limits: Limits,
) -> JoinHandle<()> {
    let handlers = Handlers {
        head: Some(head),
        answer: handler,
    };
    tokio::spawn(serve(listener, handlers, shutdown, limits))
}

async fn serve(
    listener: TcpListener,
    handler: Handlers,
    mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    limits: Limits,
) {
    let (stop, stopped) = watch::channel(false);
    let occupancy = Arc::new(Mutex::new(Occupancy::default()));
    let mut connections = JoinSet::new();
    let mut refusals = Warnings::default();
    let mut accept_errors = Warnings::default();
    let mut backoff = Duration::ZERO;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff = Duration::ZERO;
                    match Occupancy::take(&occupancy, peer.ip(), &limits) {
                        Some(slot) => {
                            let conn = connection(stream, handler.clone(), stopped.clone(), limits, slot);
                            connections.spawn(conn);
                        }
                        None => {
                            refuse(&stream);
                            refusals.note(|n| format!(
                                "admin API: refused {n} connection(s) over its caps ({} in all, {} per address)",
                                limits.max_connections, limits.max_per_address));
                        }
                    }
                }
                Err(e) => {
                    // Out of descriptors (EMFILE) or the like: back off, 5 ms doubling to 1 s.
                    backoff = (backoff * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    accept_errors.note(|n| format!("admin API: accept failed {n} times: {e}"));
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
    let _ = stop.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, drained).await;
}

/// Connections open, in all and per client address.
#[derive(Default)]
struct Occupancy {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// One connection's place in [`Occupancy`], given back when dropped (also when its
/// task panics or is aborted).
struct Slot {
    occupancy: Arc<Mutex<Occupancy>>,
    address: IpAddr,
}

impl Occupancy {
    fn take(occupancy: &Arc<Mutex<Occupancy>>, address: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut o = occupancy.lock().unwrap_or_else(|e| e.into_inner());
        let mine = o.per_address.get(&address).copied().unwrap_or(0);
        if o.total >= limits.max_connections || mine >= limits.max_per_address {
            return None;
        }
        o.total += 1;
        *o.per_address.entry(address).or_insert(0) += 1;
        Some(Slot {
            occupancy: occupancy.clone(),
            address,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.occupancy.lock().unwrap_or_else(|e| e.into_inner());
        o.total -= 1;
        if let Some(n) = o.per_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                o.per_address.remove(&self.address);
            }
        }
    }
}

/// A connection over the caps gets a 503 if its socket takes it at once, and is
/// closed: no task, no buffer, no wait.
fn refuse(stream: &TcpStream) {
    const BODY: &str = "admin API: too many connections; try again\n";
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(reply.as_bytes());
}

/// At most one warning per kind every 10 s, with the count of what it stands for.
#[derive(Default)]
struct Warnings {
    last: Option<Instant>,
    unsaid: u64,
}

impl Warnings {
    fn note(&mut self, message: impl FnOnce(u64) -> String) {
        self.unsaid += 1;
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!("{}", message(self.unsaid));
            self.unsaid = 0;
            self.last = Some(Instant::now());
        }
    }
}

async fn connection(
    stream: TcpStream,
    handler: Handlers,
    mut stopped: watch::Receiver<bool>,
    limits: Limits,
    _slot: Slot,
) {
    let io = TokioIo::new(StallGuard::new(stream, limits.write_stall));
    let service = service_fn(move |request| answer(handler.clone(), request, limits.body_timeout));
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        // hyper's buffer limit alone is soft (one read can take it past, and a
        // 100 KB head in one read was handled); this one is exact.
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = async { drop(stopped.wait_for(|s| *s).await) } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// The socket, with a deadline on writes that make no progress: a client that
/// sends requests and reads none of the replies is closed after `limit` instead of
/// holding its connection (and its place under the caps) for good.
struct StallGuard {
    stream: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl StallGuard {
    fn new(stream: TcpStream, limit: Duration) -> StallGuard {
        StallGuard {
            stream,
            limit,
            stalled: None,
        }
    }

    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took none of its reply for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

type HttpResponse = hyper::Response<Full<Bytes>>;

async fn answer(
    handler: Handlers,
    request: hyper::Request<Incoming>,
    body_timeout: Duration,
) -> Result<HttpResponse, Infallible> {
    let (parts, body) = request.into_parts();
    let mut request = Request {
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        headers: parts
            .headers
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect(),
        body: Vec::new(),
    };
    if let Some(r) = handler.head.as_ref().and_then(|check| check(&request)) {
        let mut response = http_response(r);
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Ok(response);
    }
    request.body = match tokio::time::timeout(
        body_timeout,
        Limited::new(body, MAX_BODY_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => collected.to_bytes().to_vec(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            let why = format!("request body over {MAX_BODY_BYTES} bytes");
            return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, why));
        }
        Ok(Err(e)) => {
            return Ok(plain(
                StatusCode::BAD_REQUEST,
                format!("request body unreadable: {e}"),
            ));
        }
        Err(_) => {
            let why = format!("request body not received within {body_timeout:?}");
            return Ok(plain(StatusCode::REQUEST_TIMEOUT, why));
        }
    };
    let answer = handler.answer;
    Ok(
        match tokio::task::spawn_blocking(move || answer(request)).await {
            Ok(r) => http_response(r),
            Err(e) => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("admin handler failed: {e}"),
            ),
        },
    )
}

/// The handler's answer as hyper's, with the headers every answer carries and the
/// answer's own.
fn http_response(r: Response) -> HttpResponse {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = with_headers(status, r.content_type, r.body);
    let headers = response.headers_mut();
    for (name, value) in r.headers {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::try_from(name),
            HeaderValue::try_from(value),
        ) {
            headers.append(name, value);
        }
    }
    response
}

fn plain(status: StatusCode, text: String) -> HttpResponse {
    with_headers(status, "text/plain; charset=utf-8", text.into_bytes())
}

fn with_headers(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
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
            headers: vec![
                ("allow", "GET, POST".into()),
                ("bad name", "dropped".into()),
                ("x-bad-value", "a\nb".into()),
            ],
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = spawn(
            listener,
            handler,
            Box::pin(async move {
                let _ = rx.await;
            }),
            Limits::ADMIN,
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
        assert!(lower.contains("\r\nallow: get, post\r\n"), "{a}");
        assert!(
            !lower.contains("dropped") && !lower.contains("x-bad-value"),
            "{a}"
        );
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

#[cfg(test)]
mod bounds {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpSocket;

    const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n";

    /// A listener with `limits` whose handler answers `body_bytes` bytes.
    async fn start(
        limits: Limits,
        body_bytes: usize,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler: Handler =
            Arc::new(move |_| Response::new(200, "text/plain", vec![b'x'; body_bytes]));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        spawn(
            listener,
            handler,
            Box::pin(async move { drop(rx.await) }),
            limits,
        );
        (addr, tx)
    }

    /// A connection to `addr` from the loopback address `from` (127.0.0.x).
    async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// The status line of the first answer on `s` (after sending `request`), or
    /// "closed" if the server closed the connection without one.
    async fn status(s: &mut TcpStream, request: &[u8]) -> String {
        let _ = s.write_all(request).await;
        let mut head = [0u8; 12];
        match tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head)).await {
            Ok(Ok(_)) => String::from_utf8_lossy(&head).trim().to_string(),
            Ok(Err(_)) => "closed".to_string(),
            Err(_) => panic!("no answer and not closed within 5 s"),
        }
    }

    /// Whether the server closes `s` within `within` (reading and dropping what comes).
    async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        let mut sink = vec![0u8; 1 << 16];
        tokio::time::timeout(within, async {
            loop {
                match s.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn connections_over_the_caps_get_503_and_given_back_slots_serve_again() {
        let limits = Limits {
            max_connections: 4,
            max_per_address: 3,
            header_timeout: LONG,
            body_timeout: LONG,
            write_stall: LONG,
        };
        let (addr, _stop) = start(limits, 2).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut s = connect_from([127, 0, 0, 1], addr).await;
            s.write_all(b"GET /x HTTP/1.1\r\n").await.unwrap(); // never finished
            held.push(s);
        }
        let mut fourth = connect_from([127, 0, 0, 1], addr).await;
        assert_eq!(status(&mut fourth, GET).await, "HTTP/1.1 503");
        assert!(closed_within(&mut fourth, Duration::from_secs(2)).await);
        // Another address still has room, until the total is reached.
        let mut other = connect_from([127, 0, 0, 2], addr).await;
        assert_eq!(status(&mut other, GET).await, "HTTP/1.1 200");
        let mut third = connect_from([127, 0, 0, 3], addr).await;
        assert_eq!(status(&mut third, GET).await, "HTTP/1.1 503");
        // A closed connection gives its place back.
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let mut again = connect_from([127, 0, 0, 1], addr).await;
            let got = status(&mut again, GET).await;
            if got == "HTTP/1.1 200" {
                break;
            }
            assert!(Instant::now() < deadline, "the slot never came back: {got}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One connection allowed; each kind of hostile client must lose it within its
    /// deadline, so that the next client is served.
    async fn freed_after(hostile: &[u8], body_bytes: usize, what: &str) {
        let short = Duration::from_millis(300);
        let limits = Limits {
            max_connections: 1,
            max_per_address: 1,
            header_timeout: short,
            body_timeout: short,
            write_stall: short,
        };
        let (addr, _stop) = start(limits, body_bytes).await;
        let mut bad = connect_from([127, 0, 0, 1], addr).await;
        bad.write_all(hostile).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut next = connect_from([127, 0, 0, 2], addr).await;
        assert_eq!(
            status(&mut next, GET).await,
            "HTTP/1.1 503",
            "{what}: not held at first"
        );
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut next = connect_from([127, 0, 0, 2], addr).await;
            if status(&mut next, GET).await == "HTTP/1.1 200" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still holding its connection after 3 s"
            );
        }
    }

    /// A request for /x whose head (request line and headers) is `bytes` long.
    fn head_of(bytes: usize) -> Vec<u8> {
        let bare = "GET /x HTTP/1.1\r\nHost: h\r\nX-Pad: \r\n\r\n".len();
        let pad = "a".repeat(bytes - bare);
        format!("GET /x HTTP/1.1\r\nHost: h\r\nX-Pad: {pad}\r\n\r\n").into_bytes()
    }

    #[tokio::test]
    async fn a_head_over_the_limit_gets_431_and_loses_its_connection() {
        let (addr, _stop) = start(Limits::ADMIN, 2).await;
        let mut s = connect_from([127, 0, 0, 1], addr).await;
        assert_eq!(
            status(&mut s, &head_of(MAX_HEAD_BYTES)).await,
            "HTTP/1.1 200"
        );
        for bytes in [MAX_HEAD_BYTES + 1, 100_000, 1 << 20] {
            let mut s = connect_from([127, 0, 0, 1], addr).await;
            let got = status(&mut s, &head_of(bytes)).await;
            assert_eq!(got, "HTTP/1.1 431", "a head of {bytes} bytes");
            assert!(closed_within(&mut s, Duration::from_secs(2)).await);
        }
    }

    #[tokio::test]
    async fn a_head_never_finished_loses_its_connection() {
        freed_after(b"GET /x HTTP/1.1\r\nHost: h\r\n", 2, "slow head").await;
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed() {
        let short = Duration::from_millis(300);
        let limits = Limits {
            max_connections: 8,
            max_per_address: 8,
            header_timeout: short,
            body_timeout: LONG,
            write_stall: LONG,
        };
        let (addr, _stop) = start(limits, 2).await;
        let mut s = connect_from([127, 0, 0, 1], addr).await;
        assert_eq!(status(&mut s, GET).await, "HTTP/1.1 200");
        assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    }

    #[tokio::test]
    async fn a_body_never_finished_gets_408_and_loses_its_connection() {
        let limits = Limits {
            body_timeout: Duration::from_millis(300),
            ..Limits::ADMIN
        };
        let (addr, _stop) = start(limits, 2).await;
        let mut s = connect_from([127, 0, 0, 1], addr).await;
        let request = b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n0123456789";
        assert_eq!(status(&mut s, request).await, "HTTP/1.1 408");
        freed_after(request, 2, "slow body").await;
    }

    #[tokio::test]
    async fn a_client_that_reads_no_replies_loses_its_connection() {
        // 64 pipelined requests for 1 MiB each, none read: far beyond the sockets'
        // buffers, so the server's writes stall.
        let pipelined = GET.repeat(64);
        freed_after(&pipelined, 1 << 20, "deaf client").await;
    }
}

#[cfg(test)]
mod large {
    use super::*;

    #[tokio::test]
    async fn a_large_answer_arrives_whole_through_the_small_read_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler: Handler = Arc::new(|_| {
            let body = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
            Response::new(200, "application/octet-stream", body)
        });
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        spawn(
            listener,
            handler,
            Box::pin(async move { drop(rx.await) }),
            Limits::ADMIN,
        );
        let (status, body) = client::exchange(addr, "GET", "/big", &[], Vec::new())
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert_eq!(body.len(), 8 << 20);
        assert!(body.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
}
