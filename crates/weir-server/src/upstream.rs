//! The upstream NBD backend (gateway mode): a volume of a pool with
//! `upstream = "nbd://HOST[:PORT]"` is an export of that server, reached over
//! `upstream_connections` TCP connections on which requests are pipelined.
//!
//! The protocol is `weir_nbd`'s client state machines ([`ClientHandshake`],
//! [`ClientSession`]), the same ones `crate::nbd_client` (replication) and
//! `weir load` drive; this module only drives them with blocking sockets, as the
//! [`Backend`] trait is blocking: the calling thread encodes its request and
//! writes it under the connection's write lock, a reader thread per connection
//! decodes replies and hands each to its waiting caller.
//!
//! Failures:
//! - an error reply (EIO, ENOSPC, EPERM, …) is returned as that errno, so the
//!   gateway's client sees the upstream's NBD error;
//! - a lost connection (upstream killed, restarted, network cut) fails its
//!   in-flight requests over to another connection, reconnecting (backoff 50 ms
//!   to 1 s), and retries them until `upstream_timeout_s` after the request
//!   was first sent, then fails them with EIO; every step of a reconnect (TCP
//!   connect, handshake) ends by that deadline too. Retrying is safe: a READ, WRITE, TRIM or
//!   WRITE_ZEROES that may or may not have reached the upstream is idempotent,
//!   and its client has no acknowledgement yet (NBD gives no order between
//!   overlapping requests in flight). A write is acknowledged only after the
//!   upstream acknowledged it. A FLUSH is retried only on an upstream that
//!   advertises `NBD_FLAG_CAN_MULTI_CONN` (a flush on any connection covers every
//!   connection's completed writes); otherwise it fails with EIO;
//! - a request unanswered for `upstream_timeout_s` fails with EIO and its
//!   connection is closed (its other requests fail over);
//! - failing to reach the upstream (connection refused, timed out, a failed
//!   handshake, a request unanswered) is a warning naming it and why, at most
//!   one per 10 s per volume, and its return an info line (log target
//!   [`LOG_TARGET`]).
//!
//! FLUSH, FUA, TRIM, WRITE_ZEROES (and FAST_ZERO), CACHE and BLOCK_STATUS
//! (`base:allocation`) go upstream when it advertises them; otherwise FLUSH,
//! TRIM and CACHE succeed doing nothing (nothing to flush; advisory), FUA becomes
//! a WRITE then a FLUSH, WRITE_ZEROES is written as zeroes (or fails ENOTSUP for
//! a fast zero), and BLOCK_STATUS reports the range allocated.

use std::collections::HashMap;
use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use weir_nbd::consts::*;
use weir_nbd::{
    ClientConfig, ClientExport, ClientHandshake, ClientOutcome, ClientSession, ErrorCode, Extent,
    NbdError, ReplyData,
};

use crate::backend::{AsyncDone, AsyncOp, Backend, Ownership};
use crate::connections::{RateLimited, WARN_EVERY, suppressed_note};
use crate::lease::LEASE_FRESH;

/// The log target of an upstream becoming unreachable and reachable again,
/// logged at info by default (`weir serve` shows other info lines only when
/// `RUST_LOG` asks).
pub const LOG_TARGET: &str = "weir_upstream";

/// Default `upstream_connections`.
pub const DEFAULT_CONNECTIONS: u32 = 4;
/// Most `upstream_connections`.
pub const MAX_CONNECTIONS: u32 = 64;
/// Default `upstream_timeout_s`.
pub const DEFAULT_TIMEOUT_S: u32 = 30;
/// Most `upstream_timeout_s`.
pub const MAX_TIMEOUT_S: u32 = 3600;
/// Connecting and the handshake each give up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect backoff: first and longest wait between attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Bytes read from a connection at once.
const READ_CHUNK: usize = 256 << 10;
/// Largest WRITE sent by [`Backend::start_async`]; larger ones take the
/// blocking path.
const ASYNC_MAX_WRITE_BYTES: usize = 256 << 10;
/// How often a reader thread checks its connection's oldest request, at most.
const WATCHDOG: Duration = Duration::from_secs(1);

/// How often a reader thread checks its connection's oldest request: a
/// quarter of `upstream_timeout_s` (at most [`WATCHDOG`]), so a request left
/// unanswered ends within 1.25 times the timeout.
fn watch_period(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), WATCHDOG)
}
/// Longest range one TRIM/WRITE_ZEROES/CACHE/BLOCK_STATUS request covers.
const MAX_RANGE: u64 = 1 << 30;

/// Whether a volume's connections take its export's exclusive lease.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LeasePolicy {
    /// No lease: nothing else writes the export (`upstream_exclusive =
    /// "assume"`), or there is no cache above to need it.
    Assume,
    /// Take it (a cached volume).
    Ask,
    /// Not yet (an uncached volume of a caching pool: [`UpstreamBackend::ask_lease`]
    /// when its cache is switched on); until then a cache above reads through.
    Later,
}

/// `nbd://HOST[:PORT]` (TCP; port 10809 by default). A path is refused: the
/// export is per volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamTarget {
    pub host: String,
    pub port: u16,
    /// `nbds://`: STARTTLS required, with `tls` (set from the pool's
    /// `upstream_tls_*` by `PoolConfig::upstream_target`).
    pub secure: bool,
    pub tls: Option<UpstreamTls>,
}

/// The rustls client configuration towards an upstream (`crate::tls`).
#[derive(Clone)]
pub struct UpstreamTls(pub Arc<rustls::ClientConfig>);

impl PartialEq for UpstreamTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for UpstreamTls {}
impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamTls")
    }
}

impl UpstreamTarget {
    /// `nbd://HOST[:PORT]` or `nbds://HOST[:PORT]` (TLS; its settings are added
    /// by the caller).
    pub fn parse(text: &str) -> Result<UpstreamTarget, String> {
        let secure = text
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("nbds://"));
        let plain = if secure {
            format!("nbd://{}", &text[7..])
        } else {
            text.to_string()
        };
        // The replication target's parser, with an export to satisfy it.
        let url = crate::replicate::NbdUrl::parse(&format!("{}/x", plain.trim_end_matches('/')))
            .map_err(|e| {
                e.replace("/EXPORT", "")
                    .replace(&format!("{plain}/x"), text)
                    .replace("nbd://HOST", "nbd[s]://HOST")
                    .replace(
                        "only plain nbd:// over TCP is supported",
                        "only nbd:// and nbds:// over TCP are supported",
                    )
            })?;
        let rest = text.split_once("://").map_or("", |(_, r)| r);
        if rest.trim_end_matches('/').contains('/') {
            return Err(format!(
                "{text:?}: no export in the pool's upstream (nbd[s]://HOST[:PORT]); each volume \
                 is the export of its name, or its `export`"
            ));
        }
        Ok(UpstreamTarget {
            host: url.host,
            port: url.port,
            secure,
            tls: None,
        })
    }

    /// The target's addresses, looked up by `deadline` (a name server that does
    /// not answer would hold a reconnecting request past its own deadline).
    fn addrs(&self, deadline: Instant) -> io::Result<Vec<SocketAddr>> {
        if let Ok(ip) = self.host.parse::<std::net::IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        let (host, port) = (self.host.clone(), self.port);
        look_up_by(deadline, move || {
            Ok((host.as_str(), port).to_socket_addrs()?.collect())
        })
    }
}

/// Name lookups running at most at once (each on a thread of its own, which
/// outlives a lookup given up on until the resolver answers).
const MAX_LOOKUPS: u64 = 16;
static LOOKUPS: AtomicU64 = AtomicU64::new(0);

/// Runs `lookup` (blocking, `getaddrinfo`) on a thread and waits for it until
/// `deadline`; refused while [`MAX_LOOKUPS`] are still running.
fn look_up_by(
    deadline: Instant,
    lookup: impl FnOnce() -> io::Result<Vec<SocketAddr>> + Send + 'static,
) -> io::Result<Vec<SocketAddr>> {
    let wait = time_left(deadline, "name lookup")?;
    if LOOKUPS.fetch_add(1, Ordering::AcqRel) >= MAX_LOOKUPS {
        LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("name lookup: {MAX_LOOKUPS} earlier lookups still unanswered"),
        ));
    }
    let answer = crate::within::run_within("weir-lookup", wait, move || {
        let answer = lookup();
        LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        answer
    });
    match answer {
        Ok(Some(answer)) => answer,
        Err(e) => {
            // No thread: the lookup never ran.
            LOOKUPS.fetch_sub(1, Ordering::AcqRel);
            Err(e)
        }
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "name lookup: no answer in time",
        )),
    }
}

impl std::fmt::Display for UpstreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.secure { "nbds" } else { "nbd" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// An export name the NBD protocol can carry (at most 4096 bytes, no NUL).
pub fn validate_export_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 4096 || name.contains('\0') {
        return Err(format!(
            "{name:?}: an export name is 1-4096 bytes without NUL"
        ));
    }
    Ok(())
}

/// Counters of one upstream volume (metrics).
#[derive(Default, Debug)]
pub struct UpstreamStats {
    /// Connections opened after the first.
    pub reconnects: AtomicU64,
    /// Requests sent again after their connection was lost.
    pub retries: AtomicU64,
    /// Requests failed because the upstream was unreachable or silent.
    pub unreachable: AtomicU64,
}

/// Whether the upstream could be reached lately, for the log: failures to
/// reach it (a connection refused, timed out or its handshake failed, a request
/// left unanswered) are warnings, at most one per [`WARN_EVERY`]; the first
/// success after a warned one is an info line.
#[derive(Debug)]
struct Reach {
    warnings: RateLimited,
    /// When the failures began (`None`: the last attempt succeeded).
    down_since: Option<Instant>,
    /// Failures since then.
    failures: u64,
    /// One of them was logged as a warning: its end is logged too.
    warned: bool,
}

impl Reach {
    const fn new() -> Reach {
        Reach {
            warnings: RateLimited::new(WARN_EVERY),
            down_since: None,
            failures: 0,
            warned: false,
        }
    }

    /// A failure at `now`: `Some(n)` when it is to be logged as a warning,
    /// noting `n` failures not logged since the last warning.
    fn failed(&mut self, now: Instant) -> Option<u64> {
        self.down_since.get_or_insert(now);
        self.failures += 1;
        let allowed = self.warnings.allow(now);
        self.warned |= allowed.is_some();
        allowed
    }

    /// A success at `now`: `Some((for how long, failures))` when it ends
    /// failures of which one was warned about.
    fn succeeded(&mut self, now: Instant) -> Option<(Duration, u64)> {
        let since = self.down_since.take()?;
        let failures = std::mem::take(&mut self.failures);
        std::mem::take(&mut self.warned).then(|| (now.saturating_duration_since(since), failures))
    }
}

/// The result a reader thread hands a waiting caller.
enum Answer {
    Done(Result<ReplyData, NbdError>),
    /// The connection broke before the reply came.
    Lost,
}

/// Who waits for a reply: a blocked caller, or a callback (`start_async`) run
/// by the reader thread.
enum Waiter {
    Blocked {
        since: Instant,
        tx: SyncSender<Answer>,
    },
    Callback {
        since: Instant,
        done: Box<dyn FnOnce(Answer) + Send>,
    },
}

impl Waiter {
    /// When its request was sent (just before).
    fn since(&self) -> Instant {
        match self {
            Waiter::Blocked { since, .. } | Waiter::Callback { since, .. } => *since,
        }
    }

    fn answer(self, a: Answer) {
        match self {
            Waiter::Blocked { tx, .. } => {
                let _ = tx.try_send(a);
            }
            Waiter::Callback { done, .. } => done(a),
        }
    }
}

struct ConnState {
    session: ClientSession,
    waiters: HashMap<u64, Waiter>,
    alive: bool,
    /// Requests started by [`Backend::start_async`] wait in the session's output
    /// for a flush already scheduled ([`Conn::schedule_flush`]).
    flush_scheduled: bool,
}

/// A connection's bytes not yet written ([`Conn::send`]).
#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    /// A sender (a caller, or the connection's writer thread) is writing: the
    /// others only append.
    sending: bool,
    /// A write failed: nothing more is taken (the connection is being killed).
    closed: bool,
}

/// Writes what the socket takes without waiting (`MSG_DONTWAIT`: the socket
/// itself stays blocking for the reader thread and the writer thread): the
/// bytes written, fewer than `bytes` once it is full.
fn send_nowait(socket: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut done = 0;
    while done < bytes.len() {
        let rest = &bytes[done..];
        // SAFETY: send(2) reads at most `rest.len()` bytes of `rest`.
        let n = unsafe {
            libc::send(
                socket.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            done += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => break,
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
    Ok(done)
}

thread_local! {
    /// Inside an upstream reader's round of answers: the connections whose
    /// output the round's callbacks left to send, flushed when it ends.
    static ROUND: std::cell::RefCell<Option<Vec<Arc<Conn>>>> = const { std::cell::RefCell::new(None) };
}

/// One connection: the protocol state shared by callers and the reader thread.
struct Conn {
    state: Mutex<ConnState>,
    /// What is still to be written, in stream order (requests whole; over TLS,
    /// records), and whether a sender is writing it ([`Conn::send`]).
    outbox: Mutex<Outbox>,
    /// The socket the sender writes to.
    writer: TcpStream,
    /// For shutting the socket down from any thread.
    socket: TcpStream,
    /// `nbds://`: the TLS state, shared by the writers (encrypting) and the
    /// reader thread (decrypting); never held across a socket call.
    tls: Option<Mutex<rustls::ClientConnection>>,
    /// The volume's lease freshness, when this connection holds the lease:
    /// every answer moves it to its request's send time.
    lease: Option<Arc<UpstreamLease>>,
    /// Its volume, to log why the connection broke (rate-limited).
    backend: std::sync::Weak<UpstreamBackend>,
}

/// The volume's exclusive lease as the gateway knows it (`crate::lease`).
#[derive(Debug)]
struct UpstreamLease {
    /// The `weir:exclusive=TOKEN` token of this volume's connections.
    token: String,
    epoch: Instant,
    /// When the newest request a lease-holding connection got an answer to was
    /// sent (nanoseconds after `epoch`; 0: none yet).
    sent_ns: AtomicU64,
    /// Lease-holding connections alive now.
    live: AtomicU64,
    /// Incremented whenever a connection takes the lease while none held it:
    /// the lease may have been lost in between (data cached before may be stale).
    generation: AtomicU64,
    /// A connection was opened without the lease (another client holds it, or
    /// has written the volume, or the upstream grants none).
    refused: AtomicBool,
    /// New connections ask for the lease (off until the volume's cache is on).
    asking: AtomicBool,
    /// A renewal (a small read sent only to confirm the lease) is in flight.
    renewing: AtomicBool,
}

impl UpstreamLease {
    fn new(asking: bool) -> io::Result<UpstreamLease> {
        // 256 bits from the kernel's random source: another client cannot guess
        // it and share the lease.
        let token = crate::admin_auth::new_token()?;
        debug_assert!(weir_nbd::valid_lease_token(&token));
        Ok(UpstreamLease {
            token,
            epoch: Instant::now(),
            sent_ns: AtomicU64::new(0),
            live: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            refused: AtomicBool::new(false),
            asking: AtomicBool::new(asking),
            renewing: AtomicBool::new(false),
        })
    }

    fn answered(&self, sent: Instant) {
        let ns = sent.saturating_duration_since(self.epoch).as_nanos() as u64;
        self.sent_ns.fetch_max(ns.max(1), Ordering::AcqRel);
    }

    /// How long ago the newest confirmed request was sent (`None`: none yet).
    fn age(&self) -> Option<Duration> {
        let ns = self.sent_ns.load(Ordering::Acquire);
        (ns != 0).then(|| {
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_nanos(ns))
        })
    }
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_alive(&self) -> bool {
        self.lock().alive
    }

    /// Sends encoded requests (encrypted first over TLS) without ever blocking
    /// the caller: the bytes join the connection's outbox, and whoever finds no
    /// sender at work becomes it, writing what the socket takes at once. What it
    /// does not take (an upstream that stopped reading: its window and our send
    /// buffer are full) a writer thread of this connection finishes, so one
    /// stalled upstream never holds up the runtime, and with it every other
    /// volume's clients. Errors other than a full socket kill the connection.
    fn send(self: &Arc<Self>, bytes: &[u8]) -> io::Result<()> {
        let mut pending = {
            let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            if out.closed {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            self.seal(bytes, &mut out.bytes)?;
            if out.sending {
                return Ok(());
            }
            out.sending = true;
            std::mem::take(&mut out.bytes)
        };
        loop {
            let written = match send_nowait(&self.writer, &pending) {
                Ok(n) => n,
                Err(e) => {
                    self.outbox_closed();
                    self.kill();
                    return Err(e);
                }
            };
            if written < pending.len() {
                pending.drain(..written);
                return self.finish_in_thread(pending);
            }
            pending.clear();
            let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            if out.bytes.is_empty() {
                out.sending = false;
                // Keeps the buffer's allocation for the next batch.
                out.bytes = pending;
                return Ok(());
            }
            std::mem::swap(&mut out.bytes, &mut pending);
        }
    }

    /// Appends `bytes` to `out` as they go on the wire: encrypted over TLS.
    fn seal(&self, bytes: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            out.extend_from_slice(bytes);
            return Ok(());
        };
        let mut c = tls.lock().unwrap_or_else(|e| e.into_inner());
        let mut rest = bytes;
        // rustls takes plaintext up to its buffer limit (64 KiB) at a time.
        while !rest.is_empty() {
            let n = c.writer().write(rest)?;
            rest = &rest[n..];
            let before = out.len();
            while c.wants_write() {
                c.write_tls(out)?;
            }
            if n == 0 && out.len() == before {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// The sender's part once the socket is full: a thread writes `pending` and
    /// whatever joins the outbox meanwhile, blocking, until the outbox is empty
    /// (or the connection dies: the reader's watchdog shuts a silent upstream's
    /// socket, which ends the blocked write).
    fn finish_in_thread(self: &Arc<Self>, mut pending: Vec<u8>) -> io::Result<()> {
        let conn = self.clone();
        let spawned = std::thread::Builder::new()
            .name("weir-upstream-w".into())
            .spawn(move || {
                loop {
                    if (&conn.writer).write_all(&pending).is_err() {
                        conn.outbox_closed();
                        conn.kill();
                        return;
                    }
                    let mut out = conn.outbox.lock().unwrap_or_else(|e| e.into_inner());
                    if out.bytes.is_empty() {
                        out.sending = false;
                        return;
                    }
                    pending = std::mem::take(&mut out.bytes);
                }
            });
        spawned.map(drop).inspect_err(|_| {
            self.outbox_closed();
            self.kill();
        })
    }

    /// After a failed write: nothing more is sent (the connection is killed).
    fn outbox_closed(&self) {
        let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        out.bytes = Vec::new();
        out.closed = true;
    }

    /// Marks the connection dead and fails every waiting request over.
    fn kill(&self) {
        let waiters = {
            let mut st = self.lock();
            let was_alive = std::mem::replace(&mut st.alive, false);
            if let Some(f) = self.lease.as_ref().filter(|_| was_alive) {
                f.live.fetch_sub(1, Ordering::AcqRel);
            }
            std::mem::take(&mut st.waiters)
        };
        let _ = self.socket.shutdown(Shutdown::Both);
        for (_, w) in waiters {
            w.answer(Answer::Lost);
        }
    }

    /// Sends the requests waiting in the session's output, later: at the end of
    /// the reader's round when called from one, else in a runtime task, which
    /// runs once the task starting requests yields (so a client's batch of
    /// requests goes out in one write, not one write each: a write on loopback
    /// costs the sender the receiver's TCP processing too). Outside a runtime, at
    /// once. Call only when `flush_scheduled` went from false to true.
    fn schedule_flush(self: &Arc<Self>) {
        let conn = self.clone();
        let conn = match ROUND.with_borrow_mut(|r| match r {
            Some(round) => {
                round.push(conn);
                None
            }
            None => Some(conn),
        }) {
            Some(conn) => conn,
            None => return,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(async move { conn.flush_output() })),
            Err(_) => conn.flush_output(),
        }
    }

    /// Writes out what the session holds (requests of every caller encoded so far).
    fn flush_output(self: &Arc<Self>) {
        let bytes = {
            let mut st = self.lock();
            st.flush_scheduled = false;
            if !st.alive {
                return;
            }
            st.session.take_output()
        };
        if !bytes.is_empty() {
            // A failed write has killed the connection: its waiters fail over.
            let _ = self.send(&bytes);
        }
    }

    /// The upstream broke the protocol (or TLS) on this connection: logged as
    /// a failure to reach it ([`UpstreamBackend::reach_failed`], rate-limited).
    fn broken(&self, why: &str) {
        if let Some(b) = self.backend.upgrade() {
            b.reach_failed(&format_args!("{why}; reconnecting"));
        }
    }

    /// Whether the connection is to be closed: killed, or a callback request
    /// has waited longer than `timeout` (blocked callers time out by
    /// themselves).
    fn stale(&self, timeout: Duration) -> bool {
        let st = self.lock();
        !st.alive
            || st
                .waiters
                .values()
                .any(|w| matches!(w, Waiter::Callback { since, .. } if since.elapsed() > timeout))
    }

    /// Decodes replies and hands each to its waiter (outside the lock: a
    /// callback may start the next request on this connection). Every
    /// [`watch_period`] (waking up if nothing comes, and between replies if
    /// they keep coming: an upstream that answers the others may never answer
    /// one) closes the connection if [`Conn::stale`].
    fn reader(self: Arc<Self>, mut stream: TcpStream, timeout: Duration) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut plain = Vec::new();
        let mut answered = Vec::new();
        let watch = watch_period(timeout);
        let mut watched = Instant::now();
        let _ = stream.set_read_timeout(Some(watch));
        // Over TLS, replies may already wait decrypted from the handshake's reads.
        let mut n = 0;
        loop {
            let input: &[u8] = match &self.tls {
                None => &buf[..n],
                Some(tls) => match decrypt(tls, &buf[..n], &mut plain) {
                    Ok(()) => &plain,
                    Err(e) => {
                        self.broken(&format!("TLS error: {e}"));
                        break;
                    }
                },
            };
            if !input.is_empty() {
                let mut st = self.lock();
                if !st.alive {
                    break;
                }
                if let Err(e) = st.session.input(input) {
                    drop(st);
                    self.broken(&format!("protocol error: {e}"));
                    break;
                }
                while let Some(c) = st.session.poll_completion() {
                    if let Some(w) = st.waiters.remove(&c.handle) {
                        if let Some(f) = &self.lease {
                            f.answered(w.since());
                        }
                        answered.push((w, c.result));
                    }
                }
            }
            if !answered.is_empty() {
                // A callback may start requests (the gate releases more): they go
                // out together when the round ends.
                ROUND.with_borrow_mut(|r| *r = Some(Vec::new()));
                for (w, r) in answered.drain(..) {
                    w.answer(Answer::Done(r));
                }
                for conn in ROUND.with_borrow_mut(Option::take).unwrap_or_default() {
                    conn.flush_output();
                }
            }
            n = match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    0
                }
                Err(_) => break,
            };
            if watched.elapsed() >= watch {
                watched = Instant::now();
                if self.stale(timeout) {
                    break;
                }
            }
        }
        self.kill();
    }
}

struct Slot {
    conn: Mutex<Option<Arc<Conn>>>,
    /// A background reconnect of this slot is under way.
    reconnecting: AtomicBool,
}

impl Slot {
    fn live(&self) -> Option<Arc<Conn>> {
        self.live_depth().map(|(c, _)| c)
    }

    /// Its connection if alive, with the requests it has in flight.
    fn live_depth(&self) -> Option<(Arc<Conn>, usize)> {
        let c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let conn = c.as_ref()?;
        let st = conn.lock();
        st.alive.then(|| (conn.clone(), st.waiters.len()))
    }
}

/// Requests in flight on a connection before the next one takes any. One
/// client's queue shares one reader thread's wake-ups (its replies decoded in
/// batches) until it is this deep; deeper loads spread over every connection.
/// Round robin per request cost ≈ 1.14× the gateway's CPU per I/O at QD32 over
/// four connections (docs/PERFORMANCE.md "Gateway mode").
const SPILL_IN_FLIGHT: usize = 32;

/// How long a blocking read of a cached volume waits for its lapsed lease to be
/// confirmed before it reads through instead.
const CONFIRM_WAIT: Duration = Duration::from_millis(100);

/// What the upstream advertised for the export.
#[derive(Clone, Copy, Debug)]
struct Negotiated {
    flags: u16,
    base_allocation: Option<u32>,
    /// Its block size constraints (None: not advertised).
    block_size: Option<weir_nbd::BlockSize>,
}

/// What a volume on an upstream may promise its own clients: no larger
/// requests, no finer alignment and no more writability than the upstream's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamLimits {
    pub block_size: weir_nbd::BlockSize,
    pub read_only: bool,
}

/// Without constraints advertised, the NBD spec has clients send at most 32 MiB.
const UNADVERTISED_MAX_PAYLOAD: u32 = 32 << 20;

/// One volume's upstream export.
pub struct UpstreamBackend {
    target: UpstreamTarget,
    export: String,
    size_bytes: u64,
    negotiated: Mutex<Option<Negotiated>>,
    /// `limits().block_size.max_payload_bytes`, read on every READ and WRITE
    /// without the lock (set with `negotiated`).
    max_request: std::sync::atomic::AtomicU32,
    slots: Vec<Slot>,
    timeout: Duration,
    pub stats: UpstreamStats,
    /// The volume's exclusive lease (`None`: `upstream_exclusive = "assume"`,
    /// or no flash cache in the pool).
    lease: Option<Arc<UpstreamLease>>,
    /// Weak self, for background reconnects.
    me: std::sync::Weak<UpstreamBackend>,
    /// Failures to reach the upstream, for the log.
    reach: Mutex<Reach>,
}

/// A copy of one upstream volume's counters, and its connections alive now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamSnapshot {
    pub reconnects: u64,
    pub retries: u64,
    pub unreachable: u64,
    pub connections_alive: usize,
    pub connections: usize,
}

impl UpstreamBackend {
    /// The counters now, and how many of the volume's connections are alive.
    pub fn snapshot(&self) -> UpstreamSnapshot {
        UpstreamSnapshot {
            reconnects: self.stats.reconnects.load(Ordering::Relaxed),
            retries: self.stats.retries.load(Ordering::Relaxed),
            unreachable: self.stats.unreachable.load(Ordering::Relaxed),
            connections_alive: self.slots.iter().filter(|s| s.live().is_some()).count(),
            connections: self.slots.len(),
        }
    }
}

fn io_other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// An NBD error reply as the errno that the gateway's session maps back to it.
fn nbd_to_io(e: NbdError) -> io::Error {
    let errno = match e.code {
        ErrorCode::Perm => libc::EPERM,
        ErrorCode::Io => libc::EIO,
        ErrorCode::NoMem => libc::ENOMEM,
        ErrorCode::Inval => libc::EINVAL,
        ErrorCode::NoSpc => libc::ENOSPC,
        ErrorCode::Overflow => libc::EOVERFLOW,
        ErrorCode::NotSup => libc::EOPNOTSUPP,
        ErrorCode::Shutdown => libc::ESHUTDOWN,
    };
    io::Error::from_raw_os_error(errno)
}

/// A failure without an error reply (the session sends it as EIO).
fn eio(what: String) -> io::Error {
    io::Error::other(UpstreamFailure(what))
}

/// Why a request to the upstream failed without an error reply.
#[derive(Debug)]
struct UpstreamFailure(String);
impl std::fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UpstreamFailure {}

/// A connection just opened: its socket, the export, the transmission bytes
/// that came with the handshake's end, and the TLS state over the socket.
type Opened = (
    TcpStream,
    ClientExport,
    Vec<u8>,
    Option<rustls::ClientConnection>,
);

/// Time left before `deadline`; a `TimedOut` error naming `what` once it passed.
fn time_left(deadline: Instant, what: &str) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no answer in time"),
        ));
    }
    Ok(left)
}

/// A failed step of connecting, named: a socket timeout (`SO_RCVTIMEO`
/// reports `WouldBlock`) as `TimedOut`, other errors of their kind.
fn step_failed(e: io::Error, what: &str) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no answer in time"),
        ),
        kind => io::Error::new(kind, format!("{what}: {e}")),
    }
}

/// Bounds the socket's next reads and writes by `deadline`.
fn bound(stream: &TcpStream, deadline: Instant, what: &str) -> io::Result<()> {
    let left = time_left(deadline, what)?;
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

/// The first of `target`'s addresses that accepts a TCP connection before
/// `deadline`.
fn connect_tcp(target: &UpstreamTarget, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = None;
    for a in target.addrs(deadline)? {
        let left = time_left(deadline, "TCP connect")?;
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(step_failed(e, "TCP connect")),
        }
    }
    Err(last.unwrap_or_else(|| io_other(format!("{}: no address", target.host))))
}

/// Connects and opens `export` (blocking), over TLS after `NBD_OPT_STARTTLS`
/// for an `nbds://` target. Every step (TCP connect, TLS, each read and write of
/// the handshake) ends by `deadline`, and by [`CONNECT_TIMEOUT`] from now: a
/// request reconnecting never waits past its own deadline. TCP keepalive
/// probes the connection after `timeout` with nothing received, so an idle
/// connection to an upstream that went down is given up about `2 timeout` after
/// it last answered (`crate::keepalive`), before a request has to time out on it.
fn connect(
    target: &UpstreamTarget,
    export: &str,
    lease: Option<&str>,
    timeout: Duration,
    deadline: Instant,
) -> io::Result<Opened> {
    let deadline = deadline.min(Instant::now() + CONNECT_TIMEOUT);
    let mut stream = connect_tcp(target, deadline)?;
    stream.set_nodelay(true)?;
    crate::keepalive::enable(std::os::fd::AsRawFd::as_raw_fd(&stream), timeout)?;
    let mut config = ClientConfig {
        starttls: target.secure,
        ..ClientConfig::go(export)
    };
    if let Some(token) = lease {
        config
            .meta_contexts
            .push(format!("{WEIR_EXCLUSIVE_PREFIX}{token}"));
    }
    let mut hs = ClientHandshake::new(config);
    let mut tls: Option<rustls::ClientConnection> = None;
    let mut buf = vec![0u8; 64 << 10];
    let outcome = loop {
        bound(&stream, deadline, "handshake")?;
        let n = match &mut tls {
            None => stream.read(&mut buf),
            Some(c) => rustls::Stream::new(c, &mut stream).read(&mut buf),
        }
        .map_err(|e| step_failed(e, "handshake"))?;
        if n == 0 {
            return Err(io_other(
                "the upstream closed the connection during the handshake".into(),
            ));
        }
        let handshake = |e| io_other(format!("handshake: {e}"));
        let mut outcome = hs.input(&buf[..n]).map_err(handshake)?;
        if outcome == Some(ClientOutcome::StartTls) {
            tls = Some(start_tls(target, &mut stream, deadline)?);
            outcome = hs.tls_started().map_err(handshake)?;
        }
        let out = hs.take_output();
        if !out.is_empty() {
            bound(&stream, deadline, "handshake")?;
            match &mut tls {
                None => stream.write_all(&out),
                Some(c) => {
                    let mut s = rustls::Stream::new(c, &mut stream);
                    s.write_all(&out).and_then(|()| s.flush())
                }
            }
            .map_err(|e| step_failed(e, "handshake"))?;
        }
        if let Some(o) = outcome {
            break o;
        }
    };
    let ClientOutcome::Connected(ex) = outcome else {
        return Err(io_other("the handshake ended without an export".into()));
    };
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok((stream, ex, hs.take_leftover(), tls))
}

/// The TLS handshake after the upstream acknowledged `NBD_OPT_STARTTLS`: its
/// certificate must chain to `upstream_tls_ca` and name the target's host.
fn start_tls(
    target: &UpstreamTarget,
    stream: &mut TcpStream,
    deadline: Instant,
) -> io::Result<rustls::ClientConnection> {
    let Some(UpstreamTls(config)) = &target.tls else {
        return Err(io_other("nbds:// without upstream_tls_ca".into()));
    };
    let name = rustls::pki_types::ServerName::try_from(target.host.clone())
        .map_err(|e| io_other(format!("TLS server name {:?}: {e}", target.host)))?;
    let mut c = rustls::ClientConnection::new(config.clone(), name)
        .map_err(|e| io_other(format!("TLS: {e}")))?;
    while c.is_handshaking() {
        bound(stream, deadline, "TLS handshake")?;
        c.complete_io(stream)
            .map_err(|e| step_failed(e, "TLS handshake"))?;
    }
    Ok(c)
}

/// Decrypts `cipher` (bytes read from the socket) into `plain`, then whatever
/// plaintext `tls` still holds. Never blocks: the lock is not held across a
/// socket call.
fn decrypt(
    tls: &Mutex<rustls::ClientConnection>,
    mut cipher: &[u8],
    plain: &mut Vec<u8>,
) -> io::Result<()> {
    let mut c = tls.lock().unwrap_or_else(|e| e.into_inner());
    plain.clear();
    loop {
        if !cipher.is_empty() {
            if c.read_tls(&mut cipher)? == 0 {
                // rustls took nothing (never expected once its plaintext is
                // drained): fail the connection rather than spin.
                return Err(io::Error::other("TLS: the record buffer is full"));
            }
            c.process_new_packets().map_err(io::Error::other)?;
        }
        let mut chunk = [0u8; 16 << 10];
        loop {
            match c.reader().read(&mut chunk) {
                Ok(0) => break, // close_notify: the socket's end follows
                Ok(n) => plain.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if cipher.is_empty() {
            return Ok(());
        }
    }
}

impl UpstreamBackend {
    /// Opens `export` on `target` (one connection now, to learn its size and
    /// flags; the others on first use). `known_size`: the size stored from an
    /// earlier start, used (with a warning) when the upstream cannot be reached
    /// now; without it an unreachable upstream is an error.
    pub fn open(
        target: &UpstreamTarget,
        export: &str,
        connections: u32,
        timeout: Duration,
        known_size: Option<u64>,
        lease: LeasePolicy,
    ) -> Result<Arc<UpstreamBackend>, String> {
        let lease = match lease {
            LeasePolicy::Assume => None,
            LeasePolicy::Ask | LeasePolicy::Later => Some(Arc::new(
                UpstreamLease::new(lease == LeasePolicy::Ask)
                    .map_err(|e| format!("a lease token from /dev/urandom: {e}"))?,
            )),
        };
        let asked = lease.as_ref().filter(|l| l.asking.load(Ordering::Acquire));
        let token = asked.map(|l| l.token.as_str());
        let first = connect(
            target,
            export,
            token,
            timeout,
            Instant::now() + CONNECT_TIMEOUT,
        );
        let (size_bytes, first) = match first {
            Ok(opened) => (opened.1.size_bytes, Some(opened)),
            Err(e) => match known_size.filter(|&s| s > 0) {
                Some(size) => {
                    tracing::warn!(
                        "upstream {target} export {export:?}: {e}; serving its last known size \
                         ({size} bytes) and reconnecting on demand"
                    );
                    (size, None)
                }
                None => {
                    return Err(format!(
                        "upstream {target}, export {export:?}: {e} (the export must exist \
                         upstream: its size is the volume's)"
                    ));
                }
            },
        };
        let backend = Arc::new_cyclic(|me| UpstreamBackend {
            target: target.clone(),
            export: export.to_string(),
            size_bytes,
            negotiated: Mutex::new(None),
            max_request: std::sync::atomic::AtomicU32::new(UNADVERTISED_MAX_PAYLOAD),
            slots: (0..connections.max(1))
                .map(|_| Slot {
                    conn: Mutex::new(None),
                    reconnecting: AtomicBool::new(false),
                })
                .collect(),
            timeout,
            stats: UpstreamStats::default(),
            lease,
            me: me.clone(),
            reach: Mutex::new(Reach::new()),
        });
        if let Some(first) = first {
            let conn = backend.adopt(first).map_err(|e| e.to_string())?;
            *backend.slots[0]
                .conn
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(conn);
        }
        Ok(backend)
    }

    /// The export's size (the volume's).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn target(&self) -> &UpstreamTarget {
        &self.target
    }
    pub fn export(&self) -> &str {
        &self.export
    }

    fn negotiated(&self) -> Option<Negotiated> {
        *self.negotiated.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The upstream's limits, once a connection learned them; before, only the
    /// spec's implicit 32 MiB.
    pub fn limits(&self) -> UpstreamLimits {
        let n = self.negotiated();
        let block_size = n.and_then(|n| n.block_size).unwrap_or(weir_nbd::BlockSize {
            max_payload_bytes: UNADVERTISED_MAX_PAYLOAD,
            ..weir_nbd::BlockSize::default()
        });
        UpstreamLimits {
            block_size,
            read_only: n.is_some_and(|n| n.flags & FLAG_READ_ONLY != 0),
        }
    }

    /// The largest READ or WRITE sent upstream in one request.
    fn max_request(&self) -> usize {
        (self.max_request.load(Ordering::Acquire) as usize).max(1)
    }

    /// Whether the upstream advertised `flag` (before any connection: no).
    fn has(&self, flag: u16) -> bool {
        self.negotiated().is_some_and(|n| n.flags & flag != 0)
    }

    /// The lease token new connections ask for: none once a connection was
    /// refused it (the volume reads through for the rest of this run, and a
    /// connection that took it now would block the rightful holder).
    fn lease_token(&self) -> Option<&str> {
        self.lease
            .as_ref()
            .filter(|l| l.asking.load(Ordering::Acquire) && !l.refused.load(Ordering::Acquire))
            .map(|l| l.token.as_str())
    }

    /// Sends one 512-byte read on a live lease-holding connection, only so that
    /// its answer confirms the lease (at most one at a time; the answer's data is
    /// dropped).
    fn renew(&self, f: &UpstreamLease) {
        if f.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(conn) = self
            .slots
            .iter()
            .filter_map(Slot::live)
            .find(|c| c.lease.is_some())
        else {
            f.renewing.store(false, Ordering::Release);
            return;
        };
        let lease = conn.lease.clone();
        let waiter = Waiter::Callback {
            since: Instant::now(),
            done: Box::new(move |_| {
                if let Some(l) = lease {
                    l.renewing.store(false, Ordering::Release);
                }
            }),
        };
        let bytes = {
            let mut st = conn.lock();
            if !st.alive {
                drop(st);
                waiter.answer(Answer::Lost);
                return;
            }
            let handle = st.session.read(0, 512);
            st.waiters.insert(handle, waiter);
            st.session.take_output()
        };
        if conn.send(&bytes).is_err() {
            conn.kill();
        }
    }

    /// The volume's cache was switched on: from now on its connections ask for
    /// the lease; the ones open now are closed (reopened on demand, asking).
    pub fn ask_lease(&self) {
        let Some(l) = &self.lease else { return };
        if l.asking.swap(true, Ordering::AcqRel) {
            return;
        }
        for slot in &self.slots {
            if let Some(c) = slot.live() {
                c.kill();
            }
        }
    }

    /// A failure to reach the upstream: a warning naming it and why (at most
    /// one per [`WARN_EVERY`] per volume; the others at debug level).
    fn reach_failed(&self, why: &dyn std::fmt::Display) {
        let allowed = self
            .reach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed(Instant::now());
        let (target, export) = (&self.target, &self.export);
        match allowed {
            Some(n) => tracing::warn!(
                target: LOG_TARGET,
                "upstream {target} export {export:?} unreachable: {why}{}",
                suppressed_note(n)
            ),
            None => tracing::debug!(
                target: LOG_TARGET,
                "upstream {target} export {export:?} unreachable: {why}"
            ),
        }
    }

    /// A connection opened: after warned failures, an info line saying so.
    fn reach_succeeded(&self) {
        let ended = self
            .reach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .succeeded(Instant::now());
        if let Some((down, failures)) = ended {
            tracing::info!(
                target: LOG_TARGET,
                "upstream {} export {:?} reachable again after {:.1} s ({failures} failed \
                 attempts or requests)",
                self.target,
                self.export,
                down.as_secs_f64()
            );
        }
    }

    /// A request that failed unanswered (`why`): counted, logged, and its
    /// error (EIO).
    fn unanswered(&self, why: String) -> io::Error {
        self.stats.unreachable.fetch_add(1, Ordering::Relaxed);
        self.reach_failed(&why);
        eio(format!(
            "upstream {} export {:?}: {why}",
            self.target, self.export
        ))
    }

    /// Starts a connection from a finished handshake.
    fn adopt(&self, (stream, ex, leftover, tls): Opened) -> io::Result<Arc<Conn>> {
        if ex.size_bytes < self.size_bytes {
            return Err(io_other(format!(
                "upstream {} export {:?} shrank to {} bytes (the volume is {})",
                self.target, self.export, ex.size_bytes, self.size_bytes
            )));
        }
        let info = ex.export_info();
        *self.negotiated.lock().unwrap_or_else(|e| e.into_inner()) = Some(Negotiated {
            flags: ex.transmission_flags,
            base_allocation: info.base_allocation_id,
            block_size: ex.block_size,
        });
        self.max_request.store(
            self.limits().block_size.max_payload_bytes,
            Ordering::Release,
        );
        let granted = match &self.lease {
            Some(f) if info.exclusive_lease.as_deref() == Some(f.token.as_str()) => Some(f.clone()),
            Some(f) if !f.asking.load(Ordering::Acquire) => None,
            Some(f) => {
                if !f.refused.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        "upstream {} export {:?}: no exclusive lease (another client holds it \
                         or has written the export, or the upstream grants none): the flash \
                         cache reads through",
                        self.target,
                        self.export
                    );
                }
                None
            }
            None => None,
        };
        let mut session = ClientSession::new(info);
        session
            .input(&leftover)
            .map_err(|e| io_other(format!("upstream: {e}")))?;
        let conn = Arc::new(Conn {
            state: Mutex::new(ConnState {
                session,
                waiters: HashMap::new(),
                alive: true,
                flush_scheduled: false,
            }),
            outbox: Mutex::new(Outbox::default()),
            writer: stream.try_clone()?,
            socket: stream.try_clone()?,
            tls: tls.map(Mutex::new),
            lease: granted.clone(),
            backend: self.me.clone(),
        });
        if let Some(f) = &granted
            && f.live.fetch_add(1, Ordering::AcqRel) == 0
        {
            f.generation.fetch_add(1, Ordering::AcqRel);
        }
        let reader = conn.clone();
        let timeout = self.timeout;
        let spawned = std::thread::Builder::new()
            .name(format!("weir-upstream-{}", self.export))
            .spawn(move || reader.reader(stream, timeout));
        if let Err(e) = spawned {
            // Counted out of the lease's live connections, and closed.
            conn.kill();
            return Err(e);
        }
        Ok(conn)
    }

    /// (Re)connects slot `i`, giving up at `deadline` (and after
    /// [`CONNECT_TIMEOUT`]). A failure is logged ([`Reach`]).
    /// The slot's lock is not held while connecting: the request path reads the
    /// slot from runtime threads (in a test, the upstream may even be served by
    /// those same threads), so it must never wait on a handshake.
    fn reconnect(&self, i: usize, deadline: Instant) -> io::Result<Arc<Conn>> {
        let slot = &self.slots[i];
        if let Some(conn) = slot.live() {
            return Ok(conn);
        }
        let token = self.lease_token();
        let opened = connect(&self.target, &self.export, token, self.timeout, deadline)
            .and_then(|o| self.adopt(o));
        let fresh = match opened {
            Ok(fresh) => fresh,
            Err(e) => {
                self.reach_failed(&e);
                return Err(e);
            }
        };
        self.reach_succeeded();
        let mut c = slot.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = c.as_ref().filter(|c| c.is_alive()) {
            // Another caller reconnected it meanwhile: keep that one.
            let conn = conn.clone();
            drop(c);
            fresh.kill();
            return Ok(conn);
        }
        let (had, conn) = (c.is_some(), fresh);
        if had {
            self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "upstream {} export {:?}: reconnected",
                self.target,
                self.export
            );
        }
        *c = Some(conn.clone());
        Ok(conn)
    }

    /// Reconnects slot `i` on a thread of its own (at most one per slot).
    fn reconnect_in_background(&self, i: usize) {
        if self.slots[i].reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        let spawned = std::thread::Builder::new()
            .name("weir-upstream-reconnect".into())
            .spawn(move || {
                let _ = me.reconnect(i, Instant::now() + CONNECT_TIMEOUT);
                me.slots[i].reconnecting.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.slots[i].reconnecting.store(false, Ordering::Release);
        }
    }

    /// The first live connection with fewer than [`SPILL_IN_FLIGHT`] requests in
    /// flight, else the least loaded live one; a slot found closed (or never
    /// opened) on the way is (re)opened in the background. `None`: none is live.
    fn choose(&self) -> Option<Arc<Conn>> {
        let mut least: Option<(Arc<Conn>, usize)> = None;
        let mut closed = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            match slot.live_depth() {
                None => closed.push(i),
                Some((conn, depth)) if depth < SPILL_IN_FLIGHT => {
                    least = Some((conn, 0));
                    break;
                }
                Some((conn, depth)) => {
                    if least.as_ref().is_none_or(|(_, d)| depth < *d) {
                        least = Some((conn, depth));
                    }
                }
            }
        }
        // With none live, the caller reconnects in the foreground (backing off).
        let (conn, _) = least?;
        for i in closed {
            self.reconnect_in_background(i);
        }
        Some(conn)
    }

    /// A live connection ([`Self::choose`]), or a new one in slot 0 (backing off
    /// until `deadline`).
    fn pick(&self, deadline: Instant) -> io::Result<Arc<Conn>> {
        if let Some(c) = self.choose() {
            return Ok(c);
        }
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.reconnect(0, deadline) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    let now = Instant::now();
                    if now + backoff >= deadline {
                        // Logged by `reconnect`.
                        self.stats.unreachable.fetch_add(1, Ordering::Relaxed);
                        return Err(eio(format!(
                            "upstream {} export {:?} unreachable: {e}",
                            self.target, self.export
                        )));
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Sends one request (encoded by `encode` on a live connection) and waits
    /// for its reply, failing over to another connection when its own breaks,
    /// for up to `upstream_timeout_s`.
    fn call(
        &self,
        retry: bool,
        encode: &dyn Fn(&mut ClientSession) -> u64,
    ) -> io::Result<ReplyData> {
        self.call_until(Instant::now() + self.timeout, retry, encode)
    }

    /// [`Self::call`] until `deadline`: every step (reconnecting, backing off,
    /// waiting for the reply) ends by then.
    fn call_until(
        &self,
        deadline: Instant,
        retry: bool,
        encode: &dyn Fn(&mut ClientSession) -> u64,
    ) -> io::Result<ReplyData> {
        let mut attempt = 0u32;
        let mut backoff = BACKOFF_MIN;
        loop {
            if attempt > 1 {
                // Lost again: the upstream may break every connection (a
                // protocol violation, a crash loop); not a reconnect storm.
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(BACKOFF_MAX);
                if Instant::now() >= deadline {
                    return Err(self.unanswered(format!(
                        "connections lost, no answer within {:?}",
                        self.timeout
                    )));
                }
            }
            let conn = self.pick(deadline)?;
            if attempt > 0 {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
            }
            attempt += 1;
            let (tx, rx) = sync_channel(1);
            let bytes = {
                let mut st = conn.lock();
                if !st.alive {
                    continue;
                }
                let handle = encode(&mut st.session);
                st.waiters.insert(
                    handle,
                    Waiter::Blocked {
                        since: Instant::now(),
                        tx,
                    },
                );
                st.session.take_output()
            };
            let written = conn.send(&bytes);
            drop(bytes);
            if written.is_err() {
                conn.kill();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Answer::Done(r)) => return r.map_err(nbd_to_io),
                Ok(Answer::Lost) | Err(RecvTimeoutError::Disconnected) => {
                    if !retry {
                        return Err(eio(format!(
                            "upstream {} export {:?}: connection lost (not retried)",
                            self.target, self.export
                        )));
                    }
                    if Instant::now() >= deadline {
                        return Err(self.unanswered(format!(
                            "connection lost, no answer within {:?}",
                            self.timeout
                        )));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    // A silent upstream: close the connection (its other requests
                    // fail over) and give up on this one.
                    conn.kill();
                    return Err(self.unanswered(format!("no answer within {:?}", self.timeout)));
                }
            }
        }
    }

    /// Flushes on every live connection (an upstream without multi-conn
    /// consistency covers only the writes of the connection flushed); with none
    /// live, on one opened for it: a FLUSH succeeds only once the upstream
    /// answered one.
    fn flush_each(&self) -> io::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut live: Vec<Arc<Conn>> = self.slots.iter().filter_map(Slot::live).collect();
        if live.is_empty() {
            live.push(self.pick(deadline)?);
        }
        for conn in live {
            self.flush_on(&conn, deadline)?;
        }
        Ok(())
    }

    /// One FLUSH on `conn`, answered by `deadline`, not retried elsewhere.
    fn flush_on(&self, conn: &Arc<Conn>, deadline: Instant) -> io::Result<()> {
        let (tx, rx) = sync_channel(1);
        let bytes = {
            let mut st = conn.lock();
            if !st.alive {
                return Err(eio("upstream connection lost during a flush".into()));
            }
            let h = st.session.flush();
            st.waiters.insert(
                h,
                Waiter::Blocked {
                    since: Instant::now(),
                    tx,
                },
            );
            st.session.take_output()
        };
        if conn.send(&bytes).is_err() {
            conn.kill();
        }
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Answer::Done(r)) => r.map(|_| ()).map_err(nbd_to_io),
            Err(RecvTimeoutError::Timeout) => {
                conn.kill();
                Err(self.unanswered(format!("no answer to a flush within {:?}", self.timeout)))
            }
            Ok(Answer::Lost) | Err(RecvTimeoutError::Disconnected) => {
                conn.kill();
                Err(eio(
                    "upstream connection lost during a flush (the upstream has no \
                     multi-conn: not retried)"
                        .into(),
                ))
            }
        }
    }

    /// In requests of at most the upstream's maximum payload (each with FUA if
    /// asked: the whole is durable when the last is answered).
    fn write_flags(&self, data: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let max = self.max_request();
        for (k, part) in data.chunks(max).enumerate() {
            let at = offset + (k * max) as u64;
            self.call(true, &|s| s.write(at, part, fua))?;
        }
        Ok(())
    }

    /// Splits a long range into requests of at most [`MAX_RANGE`].
    fn each_range(
        &self,
        offset: u64,
        length: u64,
        mut f: impl FnMut(u64, u32) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let n = (end - at).min(MAX_RANGE);
            f(at, n as u32)?;
            at += n;
        }
        Ok(())
    }

    /// Makes sure the flags are known (a first connection), for the decisions
    /// that depend on what the upstream advertises.
    fn ensure_negotiated(&self) -> io::Result<()> {
        if self.negotiated().is_none() {
            self.pick(Instant::now() + self.timeout)?;
        }
        Ok(())
    }
}

/// Encodes an [`AsyncOp`] on `session`: its handle.
fn encode_async(session: &mut ClientSession, op: &AsyncOp) -> u64 {
    match *op {
        AsyncOp::Read { offset, length } => session.read(offset, length),
        AsyncOp::Write {
            offset,
            ref data,
            fua,
        } => session.write(offset, data.bytes(), fua),
    }
}

/// An answer as an [`AsyncDone`] takes it (a WRITE's: no data).
fn async_result(r: io::Result<ReplyData>) -> io::Result<Vec<u8>> {
    r.map(|reply| match reply {
        ReplyData::Read(data) => data,
        _ => Vec::new(),
    })
}

impl UpstreamBackend {
    /// The waiter of an [`AsyncOp`] sent at `since`: it hands the answer to
    /// `done`; a lost one is sent again ([`Self::resend`]).
    fn async_waiter(
        &self,
        op: AsyncOp,
        since: Instant,
        runtime: tokio::runtime::Handle,
        done: AsyncDone,
    ) -> Waiter {
        let me = self.me.clone();
        Waiter::Callback {
            since,
            done: Box::new(move |answer| {
                let _in_runtime = runtime.enter();
                match answer {
                    Answer::Done(r) => done(Some(async_result(r.map_err(nbd_to_io)))),
                    Answer::Lost => match me.upgrade() {
                        Some(me) => me.resend(op, since, done),
                        None => done(Some(Err(eio("upstream volume closed".into())))),
                    },
                }
            }),
        }
    }

    /// An [`AsyncOp`] first sent at `since` whose connection was lost (or closed
    /// for its silence): sent again the blocking way, on a thread of the
    /// runtime's blocking pool, until `upstream_timeout_s` after `since`; failed
    /// at once past that. Its deadline is the first send's, not a new one: a
    /// stopped upstream holds a request about `upstream_timeout_s`, not twice.
    fn resend(self: Arc<Self>, op: AsyncOp, since: Instant, done: AsyncDone) {
        let deadline = since + self.timeout;
        if Instant::now() >= deadline {
            let e = self.unanswered(format!("no answer within {:?}", self.timeout));
            return done(Some(Err(e)));
        }
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        tokio::task::spawn_blocking(move || {
            let r = self.call_until(deadline, true, &|s| encode_async(s, &op));
            done(Some(async_result(r)));
        });
    }
}

impl Drop for UpstreamBackend {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(c) = slot.conn.lock().unwrap_or_else(|e| e.into_inner()).take() {
                c.kill();
            }
        }
    }
}

impl Backend for UpstreamBackend {
    /// Under the volume's lease: exclusive while it was confirmed within
    /// [`LEASE_FRESH`] (a request sent that long ago was answered on a
    /// connection holding it), in the generation of its last (re)grant. Without
    /// a lease asked (`upstream_exclusive = "assume"`): exclusive.
    fn ownership(&self) -> Ownership {
        let Some(f) = &self.lease else {
            return Ownership::Exclusive { generation: 0 };
        };
        let age = match f.age() {
            Some(age) if age <= LEASE_FRESH && !f.refused.load(Ordering::Acquire) => age,
            _ => return Ownership::Unsure,
        };
        if age > LEASE_FRESH / 2 {
            // Confirm it before it lapses, so a load of hits never stalls on it.
            self.renew(f);
        }
        Ownership::Exclusive {
            generation: f.generation.load(Ordering::Acquire),
        }
    }

    fn confirm_ownership(&self) -> Ownership {
        let now = self.ownership();
        let Some(f) = &self.lease else { return now };
        let held = f.live.load(Ordering::Acquire) > 0 && !f.refused.load(Ordering::Acquire);
        if matches!(now, Ownership::Exclusive { .. }) || !held {
            return now;
        }
        // Held, but nothing confirmed it within LEASE_FRESH (the volume was
        // idle): one renewal, waited for here (the caller blocks anyway, and
        // would otherwise wait for the upstream's read), polled because this is
        // rare: once per idle spell of a volume.
        self.renew(f);
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        while start.elapsed() < CONFIRM_WAIT {
            std::thread::sleep(pause);
            if f.age().is_some_and(|age| age <= LEASE_FRESH / 2) {
                break;
            }
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        self.ownership()
    }

    /// READ and WRITE on a live connection, answered by its reader thread; on a
    /// broken connection (or none live, or a FUA the upstream lacks) the caller
    /// falls back to the blocking calls, which reconnect and retry.
    fn start_async(&self, op: AsyncOp, done: AsyncDone) -> Result<(), AsyncDone> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(done);
        };
        match op {
            AsyncOp::Write { fua: true, .. } if !self.has(FLAG_SEND_FUA) => return Err(done),
            // Written by the calling (runtime) thread: only small payloads, which
            // the socket buffer takes at once.
            AsyncOp::Write { ref data, .. } if data.bytes().len() > ASYNC_MAX_WRITE_BYTES => {
                return Err(done);
            }
            // Larger than the upstream takes: split by the blocking calls.
            AsyncOp::Read { length, .. } if length as usize > self.max_request() => {
                return Err(done);
            }
            AsyncOp::Write { ref data, .. } if data.bytes().len() > self.max_request() => {
                return Err(done);
            }
            _ => {}
        }
        let Some(conn) = self.choose() else {
            return Err(done);
        };
        let since = Instant::now();
        let first = {
            let mut st = conn.lock();
            if !st.alive {
                drop(st);
                // Answered like a lost request: sent again the blocking way.
                self.async_waiter(op, since, runtime, done)
                    .answer(Answer::Lost);
                return Ok(());
            }
            let handle = encode_async(&mut st.session, &op);
            let waiter = self.async_waiter(op, since, runtime, done);
            st.waiters.insert(handle, waiter);
            !std::mem::replace(&mut st.flush_scheduled, true)
        };
        if first {
            conn.schedule_flush();
        }
        Ok(())
    }

    /// In requests of at most the upstream's maximum payload.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let max = self.max_request();
        for (k, part) in buf.chunks_mut(max).enumerate() {
            let at = offset + (k * max) as u64;
            let len = part.len() as u32;
            match self.call(true, &|s| s.read(at, len))? {
                ReplyData::Read(data) if data.len() == part.len() => part.copy_from_slice(&data),
                _ => return Err(eio("upstream: a read reply of the wrong length".into())),
            }
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_flags(data, offset, false)
    }

    fn write_fua(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.ensure_negotiated()?;
        if self.has(FLAG_SEND_FUA) {
            self.write_flags(data, offset, true)
        } else {
            self.write(offset, data)?;
            self.flush()
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.ensure_negotiated()?;
        if !self.has(FLAG_SEND_FLUSH) {
            return Ok(());
        }
        if self.has(FLAG_CAN_MULTI_CONN) {
            self.call(true, &|s| s.flush()).map(|_| ())
        } else {
            self.flush_each()
        }
    }

    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        self.ensure_negotiated()?;
        if !self.has(FLAG_SEND_TRIM) {
            return Ok(());
        }
        self.each_range(offset, length, |at, n| {
            self.call(true, &|s| s.trim(at, n)).map(|_| ())
        })
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> io::Result<()> {
        self.ensure_negotiated()?;
        if self.has(FLAG_SEND_WRITE_ZEROES) {
            if fast_only && !self.has(FLAG_SEND_FAST_ZERO) {
                return Err(io::Error::from(io::ErrorKind::Unsupported));
            }
            let mut flags = 0;
            if !may_punch {
                flags |= CMD_FLAG_NO_HOLE;
            }
            if fast_only {
                flags |= CMD_FLAG_FAST_ZERO;
            }
            return self.each_range(offset, length, |at, n| {
                self.call(true, &|s| s.send_raw(CMD_WRITE_ZEROES, flags, at, n, &[]))
                    .map(|_| ())
            });
        }
        if fast_only {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let zeroes = vec![0u8; length.min(1 << 20) as usize];
        let mut at = offset;
        while at < offset + length {
            let n = (offset + length - at).min(zeroes.len() as u64) as usize;
            self.write(at, &zeroes[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        self.ensure_negotiated()?;
        let all = |length: u64| {
            vec![Extent {
                length: length.min(u32::MAX as u64 & !4095).max(1) as u32,
                flags: 0,
            }]
        };
        let Some(id) = self.negotiated().and_then(|n| n.base_allocation) else {
            return Ok(all(length));
        };
        let n = length.min(MAX_RANGE) as u32;
        match self.call(true, &|s| s.block_status(offset, n, false))? {
            ReplyData::BlockStatus(contexts) => Ok(contexts
                .into_iter()
                .find(|(c, _)| *c == id)
                .map(|(_, e)| e)
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| all(length))),
            _ => Ok(all(length)),
        }
    }

    fn cache(&self, offset: u64, length: u64) -> io::Result<()> {
        self.ensure_negotiated()?;
        if !self.has(FLAG_SEND_CACHE) {
            return Ok(());
        }
        self.each_range(offset, length, |at, n| {
            self.call(true, &|s| s.cache(at, n)).map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name server that does not answer holds a reconnect only until the
    /// request's deadline; a lookup that answers is used.
    #[test]
    fn a_name_lookup_ends_by_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(100);
        let start = Instant::now();
        let hung = look_up_by(deadline, || {
            std::thread::sleep(Duration::from_secs(3));
            Ok(Vec::new())
        });
        let took = start.elapsed();
        assert_eq!(hung.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(took < Duration::from_secs(1), "{took:?}");
        let addr: SocketAddr = "192.0.2.1:10809".parse().unwrap();
        let answered = look_up_by(Instant::now() + Duration::from_secs(5), move || {
            Ok(vec![addr])
        });
        assert_eq!(answered.unwrap(), vec![addr]);
    }

    #[test]
    fn targets_parse_with_clear_errors() {
        let t = UpstreamTarget::parse("nbd://storage:10900").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("storage", 10900));
        assert_eq!(UpstreamTarget::parse("nbd://s").unwrap().port, 10809);
        assert_eq!(UpstreamTarget::parse("nbd://[::1]:7").unwrap().host, "::1");
        assert_eq!(
            UpstreamTarget::parse("nbd://[::1]:7").unwrap().to_string(),
            "nbd://[::1]:7"
        );
        let e = UpstreamTarget::parse("nbd://s/vol").unwrap_err();
        assert!(e.contains("no export"), "{e}");
        let t = UpstreamTarget::parse("NBDS://s:7").unwrap();
        assert!(
            t.secure && t.tls.is_none(),
            "TLS settings come from the pool"
        );
        assert_eq!(t.to_string(), "nbds://s:7");
        let e = UpstreamTarget::parse("nbd+unix:///s").unwrap_err();
        assert!(e.contains("only nbd:// and nbds://"), "{e}");
        let e = UpstreamTarget::parse("http://s").unwrap_err();
        assert!(e.contains("scheme"), "{e}");
        let e = UpstreamTarget::parse("nbds://s/vol").unwrap_err();
        assert!(e.contains("no export") && e.contains("nbds://s/vol"), "{e}");
        let e = UpstreamTarget::parse("nbd://s:0").unwrap_err();
        assert!(e.contains("port"), "{e}");
        assert!(validate_export_name("").is_err());
    }

    /// Segments with data this socket has sent (Linux `tcp_info.tcpi_data_segs_out`,
    /// at byte 156 since 4.19; the libc crate's struct stops before it).
    fn data_segments_sent(socket: &TcpStream) -> u32 {
        use std::os::fd::AsRawFd;
        let mut info = [0u8; 256];
        let mut len = info.len() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `info`.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert!(rc == 0 && len >= 160, "TCP_INFO: rc {rc}, {len} bytes");
        u32::from_ne_bytes(info[156..160].try_into().unwrap())
    }

    /// A client's batch of requests, started by one task without yielding, goes
    /// upstream in one write (one segment), not one write each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn requests_started_together_go_upstream_in_one_write() {
        let dir = weir_testkit::TempDir::new("upstream-coalesce");
        let toml = "[[pools]]\nname = \"default\"\n[[volumes]]\nname = \"vol\"\n\
                    size = \"1MiB\"\npolicy = \"mission-critical\"\n";
        let mut config = crate::config::WeirConfig::from_toml_str(toml, "test").unwrap();
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.admin_listen = "127.0.0.1:0".parse().unwrap();
        config.data_dir = dir.path().to_path_buf();
        let upstream = crate::RunningServer::start(config).await.unwrap();
        let t = UpstreamTarget::parse(&format!("nbd://{}", upstream.nbd_addr())).unwrap();
        let b = tokio::task::spawn_blocking(move || {
            let b = UpstreamBackend::open(
                &t,
                "vol",
                1,
                Duration::from_secs(5),
                None,
                LeasePolicy::Assume,
            )
            .unwrap();
            let mut buf = vec![0u8; 4096];
            b.read(0, &mut buf).unwrap(); // connected, and answered once
            b
        })
        .await
        .unwrap();
        let conn = b.slots[0].live().expect("connected");
        let before = data_segments_sent(&conn.socket);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Started by a task on the runtime's one worker, as `weir serve` starts
        // them (the test's own body runs on another thread, where the worker could
        // run the flush task while the batch is still being started).
        let b = Arc::new(b);
        let starter = b.clone();
        tokio::spawn(async move {
            for i in 0..32u64 {
                let tx = tx.clone();
                let op = AsyncOp::Read {
                    offset: i * 4096,
                    length: 4096,
                };
                let started = starter.start_async(op, Box::new(move |r| drop(tx.send(r))));
                assert!(started.is_ok(), "request {i} not started");
            }
        })
        .await
        .unwrap();
        for _ in 0..32 {
            let r = rx.recv().await.expect("answered");
            assert!(matches!(r, Some(Ok(ref d)) if d.len() == 4096), "{r:?}");
        }
        let segments = data_segments_sent(&conn.socket) - before;
        assert!(segments <= 2, "32 requests took {segments} segments");
        drop(conn);
        tokio::task::spawn_blocking(move || drop(b)).await.unwrap();
        upstream.shutdown().await.unwrap();
    }

    #[test]
    fn an_unreachable_upstream_without_a_known_size_is_an_error() {
        // A port nothing listens on: connection refused at once.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let t = UpstreamTarget::parse(&format!("nbd://127.0.0.1:{port}")).unwrap();
        let e = UpstreamBackend::open(
            &t,
            "vol",
            2,
            Duration::from_secs(1),
            None,
            LeasePolicy::Assume,
        )
        .err()
        .unwrap();
        assert!(e.contains("must exist upstream"), "{e}");
        // With a known size the volume opens, and I/O fails with EIO after the
        // timeout (backing off between attempts).
        let b = UpstreamBackend::open(
            &t,
            "vol",
            2,
            Duration::from_millis(300),
            Some(1 << 20),
            LeasePolicy::Assume,
        )
        .unwrap();
        assert_eq!(b.size_bytes(), 1 << 20);
        let mut buf = [0u8; 512];
        let e = b.read(0, &mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), None, "sent as EIO");
        assert!(e.to_string().contains("unreachable"), "{e}");
        assert!(b.stats.unreachable.load(Ordering::Relaxed) >= 1);
    }
}
