//! One NBD connection: handshake with weir-nbd (STARTTLS when configured; exports
//! filtered by the client's host and TLS identity), then transmission with many
//! requests in flight. A reader loop decodes and validates requests and submits
//! them to the pool's QoS gate, each charged what it costs ([`charge`]); this
//! module also performs what the gate releases ([`Io`], the pool's [`Perform`]): a
//! whole request inline when the page cache allows, else on the blocking pool (or
//! beside the emulated device), and a request paced in pieces piece by piece,
//! replying once its last piece is done. Replies go to a writer task, so they go
//! out in completion order; what a request holds of its connection's budgets
//! ([`Held`]) is given back once its reply is written, so memory stays bounded
//! when a client does not read.

use std::cell::Cell;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use weir_model::IoDir;
use weir_nbd::consts::{CMD_READ, CMD_WRITE, REQUEST_HEADER_LEN};
use weir_nbd::{
    Command, ErrorCode, ExportCatalog, ExportDescription, ExportInfo, ExportListing,
    HandshakeEvent, NbdError, Request, RequestHeader, ServerHandshake, ValidRequest, reply,
    validate,
};
use weir_qos::{ClientId, Finished, GateRequest, IoKind, Piece, Release, Ticket};

use crate::access::{Peer, canonical};
use crate::budget::{Budget, Taken};
use crate::busy_poll::{BusyPoll, poll_until};
use crate::connections::{DATA_UNIT_BYTES as BUFFER_UNIT_BYTES, Slot};
use crate::device::EmulatedDevice;
use crate::lease::{LeaseHeld, Leases, Refused, WriterMark};
use crate::metrics::{IoCounters, OpKind};
use crate::qos::{Buffers, Perform, Performed, QosPool};
use crate::server::ServerState;
use crate::store::OpenVolume;
use crate::tls::{Conn as Stream, ConnRead, ConnWrite};

/// Requests one connection may have unanswered (in flight, or replied to but the
/// reply not yet written to its socket) before the server stops reading from it.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 256;
/// READ/WRITE data one connection may have buffered at once, payloads read and
/// replies not yet written (requests beyond it wait before their payload is
/// read): bounds memory whatever the client sends.
pub const MAX_BUFFERED_BYTES_PER_CONNECTION: usize = 128 << 20;

/// A WRITE payload's share of the server's data budget is taken this much at a
/// time, as the payload arrives.
pub const PAYLOAD_CHUNK_BYTES: usize = 1 << 20;

/// How long a WRITE payload waits for the server's data budget while nothing at
/// all is given back to it, before its connection is closed.
pub const PAYLOAD_STALL: Duration = Duration::from_secs(10);

/// How long a reply may wait to be taken by its client while the server's data
/// budget is stuck, before the connection is closed.
pub const REPLY_STALL: Duration = Duration::from_secs(10);
/// On shutdown, how long a connection keeps answering new requests with ESHUTDOWN.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);
/// … and how long the client may stay silent before the connection is closed.
pub const SHUTDOWN_QUIET: Duration = Duration::from_millis(200);
/// A client must finish option haggling within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// A validated request travelling through QoS to the backend.
pub struct Job {
    pub handle: u64,
    pub command: Command,
    pub payload: Option<Vec<u8>>,
    pub volume: Arc<OpenVolume>,
    pub export: Arc<ExportInfo>,
    pub reply: mpsc::UnboundedSender<Outgoing>,
    /// The connection's recycled reply buffers (large READs).
    pub buffers: Arc<ReplyBuffers>,
    pub volume_counters: Arc<IoCounters>,
    pub host_counters: Arc<IoCounters>,
    pub received_at: Instant,
    /// The QoS client (host) that sent it.
    pub client: ClientId,
    /// A large READ from the page cache may go out with `sendfile(2)`
    /// (`zero_copy_reads`: by default, the client is on another machine).
    pub zero_copy: bool,
    /// Its share of the connection's budgets, handed to the writer with the reply.
    held: Mutex<Option<Held>>,
}

/// What a request holds of its connection's budgets: a request slot and, for a
/// READ or WRITE, its data. Given back once its reply is written to the socket,
/// not when the reply is queued: a client that pipelines requests and never
/// reads the replies stops being read from after
/// [`MAX_IN_FLIGHT_PER_CONNECTION`] requests or
/// [`MAX_BUFFERED_BYTES_PER_CONNECTION`] of data, whatever it sends.
pub struct Held {
    _request: Taken,
    _data: Option<DataHeld>,
}

/// A READ's or WRITE's data, counted against its connection's budget, its host's
/// (`max_buffered_mib_per_host`) and the server's (`max_buffered_mib`).
pub struct DataHeld {
    _connection: Taken,
    /// The pool's share of the host's budget, then the host's.
    _pool_host: Taken,
    _host: Taken,
    /// Grows as a WRITE payload arrives (`Session::read_payload`).
    server: Taken,
}

/// A reply on its way to the connection's writer, with what its request holds.
pub struct Outgoing {
    pub reply: Reply,
    held: Option<Held>,
}

/// Large READ reply buffers of one connection, handed back by the writer once
/// sent. A recycled buffer keeps its length (its bytes stay initialised), so a
/// READ that reuses one is read straight into it: no zero-fill of 1 MiB per
/// request. Bounded: at most [`RECYCLED_BUFFERS`] idle buffers of at most
/// [`RECYCLE_MAX_BYTES`] each per connection.
#[derive(Default)]
pub struct ReplyBuffers(Mutex<Vec<Vec<u8>>>);

/// Replies smaller than this are not recycled (allocation is cheap there).
pub const RECYCLE_MIN_BYTES: usize = 64 * 1024;
/// Replies larger than this are not kept (idle memory per connection).
pub const RECYCLE_MAX_BYTES: usize = 2 << 20;
/// Idle buffers one connection keeps.
pub const RECYCLED_BUFFERS: usize = 4;

impl ReplyBuffers {
    fn pool(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of exactly `len` bytes (contents unspecified: the caller
    /// overwrites them all).
    fn take(&self, len: usize) -> Vec<u8> {
        if len >= RECYCLE_MIN_BYTES {
            let mut pool = self.pool();
            if let Some(i) = pool.iter().position(|b| b.len() >= len) {
                let mut buf = pool.swap_remove(i);
                buf.truncate(len);
                return buf;
            }
        }
        vec![0; len]
    }

    /// A sent reply: kept for reuse when it is worth it and there is room.
    pub fn give_back(&self, buf: Vec<u8>) {
        if (RECYCLE_MIN_BYTES..=RECYCLE_MAX_BYTES).contains(&buf.len()) {
            let mut pool = self.pool();
            if pool.len() < RECYCLED_BUFFERS {
                pool.push(buf);
            }
        }
    }

    /// Idle buffers held (tests).
    pub fn idle(&self) -> usize {
        self.pool().len()
    }
}

/// A READ reply of `length` data bytes with its header written and the data
/// still to fill: `(buffer, where the data starts)`.
fn read_reply_buffer(job: &Job, offset: u64, length: u32) -> (Vec<u8>, usize) {
    let mut head = Vec::with_capacity(32);
    reply::read_reply_header(&mut head, &job.export, job.handle, offset, length);
    let mut out = job.buffers.take(head.len() + length as usize);
    out[..head.len()].copy_from_slice(&head);
    (out, head.len())
}

/// An encoded reply on its way to the connection's writer.
pub enum Reply {
    Bytes(Vec<u8>),
    /// A large READ whose data is in the page cache: the header, then the data
    /// sent from the file with `sendfile(2)`, with no copy through user space
    /// (half of the CPU a 1 MiB read costs otherwise: one copy out of the page
    /// cache, one into the socket). `volume` keeps the descriptor open.
    FromFile {
        head: Vec<u8>,
        volume: Arc<OpenVolume>,
        fd: std::os::fd::RawFd,
        offset: u64,
        length: usize,
    },
}

impl From<Vec<u8>> for Reply {
    fn from(bytes: Vec<u8>) -> Reply {
        Reply::Bytes(bytes)
    }
}

fn op_kind(c: &Command) -> (OpKind, u64) {
    match *c {
        Command::Read { length, .. } => (OpKind::Read, length as u64),
        Command::Write { length, .. } => (OpKind::Write, length as u64),
        _ => (OpKind::Other, 0),
    }
}

/// Records metrics and hands the reply to the connection's writer.
pub fn deliver(job: &Job, reply: Reply, ok: bool) {
    let bytes = op_kind(&job.command).1;
    send_reply(job, reply, ok, bytes);
}

/// [`deliver`] counting `bytes` as moved (none for a request that never ran).
fn send_reply(job: &Job, reply: Reply, ok: bool, bytes: u64) {
    let kind = op_kind(&job.command).0;
    let latency = job.received_at.elapsed().as_nanos() as u64;
    job.volume_counters.record(kind, bytes, latency, ok);
    job.host_counters.record(kind, bytes, latency, ok);
    let held = job.held.lock().unwrap_or_else(|e| e.into_inner()).take();
    let _ = job.reply.send(Outgoing { reply, held });
}

/// The NBD error for a request of `job` its backend failed. The operator is told
/// too (a warning, at most one per [`crate::connections::WARN_EVERY`] for the
/// whole server): a failing disk, a full file system or an exhausted open-files
/// limit reached only the clients before.
fn io_error(job: &Job, e: &io::Error, what: &str) -> NbdError {
    if e.kind() == io::ErrorKind::Unsupported {
        return NbdError::new(ErrorCode::NotSup, format!("{what}: {e}"));
    }
    let code = e
        .raw_os_error()
        .map_or(ErrorCode::Io, ErrorCode::from_errno);
    warn_limited(&BACKEND_WARNINGS, || {
        format!("volume {:?}: {what} failed: {e}", job.volume.name)
    });
    NbdError::new(code, format!("{what}: {e}"))
}

static BACKEND_WARNINGS: std::sync::Mutex<crate::connections::RateLimited> = std::sync::Mutex::new(
    crate::connections::RateLimited::new(crate::connections::WARN_EVERY),
);

/// Logs `message` as a warning unless `limiter` had one in its period (then at
/// debug level); the next warning says how many were held back.
fn warn_limited(
    limiter: &std::sync::Mutex<crate::connections::RateLimited>,
    message: impl FnOnce() -> String,
) {
    let allowed = limiter
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .allow(std::time::Instant::now());
    match allowed {
        Some(n) => tracing::warn!("{}{}", message(), crate::connections::suppressed_note(n)),
        None => tracing::debug!("{}", message()),
    }
}

fn deleted() -> NbdError {
    NbdError::new(ErrorCode::Shutdown, "volume was deleted")
}

/// The reply to a request that failed with `error`.
fn error_reply(job: &Job, error: &NbdError) -> Reply {
    let mut out = Vec::new();
    reply::error_reply(&mut out, &job.export, job.handle, error);
    out.into()
}

fn ok_reply(job: &Job) -> Reply {
    let mut out = Vec::with_capacity(16);
    reply::ok_reply(&mut out, job.handle);
    out.into()
}

/// What the gate charges for a command, and the range it may pace it over:
/// READ, WRITE, CACHE, TRIM and WRITE_ZEROES their range (TRIM and WRITE_ZEROES
/// at the pool's cost factors), FLUSH one operation, BLOCK_STATUS one other
/// operation.
pub fn charge(command: &Command) -> (IoKind, u64, u32) {
    match *command {
        Command::Read { offset, length, .. } => (IoKind::Read, offset, length),
        Command::Write { offset, length, .. } => (IoKind::Write, offset, length),
        Command::Cache { offset, length } => (IoKind::Cache, offset, length),
        Command::Trim { offset, length, .. } => (IoKind::Trim, offset, length),
        Command::WriteZeroes { offset, length, .. } => (IoKind::WriteZeroes, offset, length),
        Command::Flush => (IoKind::Flush, 0, 0),
        Command::BlockStatus { offset, length, .. } => (IoKind::Other, offset, length),
        Command::Disconnect => (IoKind::Other, 0, 0),
    }
}

/// Largest READ tried inline without blocking ([`try_perform_inline`]); larger
/// reads run in parallel on the blocking pool (measured faster for 1 MiB).
pub const INLINE_MAX_READ_BYTES: u32 = 128 * 1024;
/// Smallest READ sent from the page cache with `sendfile(2)` when it is all
/// cached ([`Reply::FromFile`]); smaller ones are copied (cheaper than the
/// page-cache check and the extra system call).
pub const ZERO_COPY_MIN_READ_BYTES: u32 = 64 * 1024;
/// Largest plain WRITE tried inline (1 MiB measured faster inline).
pub const INLINE_MAX_WRITE_BYTES: u32 = 1 << 20;

/// Runs a READ or a plain WRITE (no FUA) on the calling thread if the backend can
/// do it without blocking (page cache: small reads are copied, large ones sent
/// with `sendfile(2)` by the writer); `None`: run [`perform`] on a blocking
/// thread. Saves the hand-off on the common path.
pub fn try_perform_inline(job: &Job) -> Option<(Reply, bool)> {
    if job.volume.is_deleted() {
        return None;
    }
    match job.command {
        Command::Read { offset, length, .. }
            if length >= ZERO_COPY_MIN_READ_BYTES
                && let Some(reply) = zero_copy_reply(job, offset, length) =>
        {
            Some((reply, true))
        }
        // Not sent from the page cache (partly cached, or no cachestat(2) before
        // Linux 6.5): small enough reads are still tried without blocking.
        Command::Read { offset, length, .. } if length <= INLINE_MAX_READ_BYTES => {
            let (mut out, start) = read_reply_buffer(job, offset, length);
            match job.volume.backend.read_nowait(offset, &mut out[start..]) {
                Ok(true) => Some((out.into(), true)),
                _ => None,
            }
        }
        Command::Write {
            offset,
            length,
            fua: false,
        } if length <= INLINE_MAX_WRITE_BYTES => {
            let data = job.payload.as_deref().unwrap_or_default();
            match job.volume.backend.write_nowait(offset, data) {
                Ok(true) => Some((ok_reply(job), true)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether the client runs on this machine (a loopback address, or the address
/// it reached us on). Its large READs are then read into a buffer on a blocking
/// thread and copied into the socket, not sent with `sendfile(2)`: on loopback
/// the client's kernel receives what ours sends, and page-cache pages handed over
/// by `sendfile` cost the receiving client far more system time than copied data
/// (Linux 6.18, fio's nbd engine, 1 MiB reads at QD4: fio 3.14-3.32 s of system
/// time in 4 s at 926-1,144 MB/s, against 1.39-1.62 s at 1,728-2,258 MB/s;
/// docs/PERFORMANCE.md). Across a network the receiver is another machine.
fn same_host(stream: &TcpStream, peer: std::net::IpAddr) -> bool {
    peer.is_loopback()
        || stream
            .local_addr()
            .is_ok_and(|local| canonical(local.ip()) == peer)
}

/// A READ reply sent from the page cache by `sendfile(2)`, if the connection may
/// (`zero_copy_reads`) and the range is all cached now (a page-cache check, no
/// data copied: cheap enough to run inline).
fn zero_copy_reply(job: &Job, offset: u64, length: u32) -> Option<Reply> {
    if !job.zero_copy {
        return None;
    }
    let fd = job.volume.backend.cached_source(offset, length as u64)?;
    let mut head = Vec::with_capacity(32);
    reply::read_reply_header(&mut head, &job.export, job.handle, offset, length);
    Some(Reply::FromFile {
        head,
        volume: job.volume.clone(),
        fd,
        offset,
        length: length as usize,
    })
}

/// Runs a whole request against its volume's backend (blocking) and encodes the
/// reply; `true`: it succeeded.
pub fn perform(job: &Job) -> (Reply, bool) {
    let b = &job.volume.backend;
    let handle = job.handle;
    if job.volume.is_deleted() {
        return (error_reply(job, &deleted()), false);
    }
    let result: Result<(), NbdError> = match job.command {
        Command::Read { offset, length, .. } => {
            // Checked here too: the emulated-device path comes straight here.
            if length >= ZERO_COPY_MIN_READ_BYTES
                && let Some(reply) = zero_copy_reply(job, offset, length)
            {
                return (reply, true);
            }
            let (mut out, start) = read_reply_buffer(job, offset, length);
            match b.read(offset, &mut out[start..]) {
                Ok(()) => return (out.into(), true),
                Err(e) => Err(io_error(job, &e, "read")),
            }
        }
        Command::Write { offset, fua, .. } => {
            let data = job.payload.as_deref().unwrap_or_default();
            if fua {
                b.write_fua(offset, data)
            } else {
                b.write(offset, data)
            }
            .map_err(|e| io_error(job, &e, "write"))
        }
        Command::Flush => b.flush().map_err(|e| io_error(job, &e, "flush")),
        // proto.md leaves a zero-length TRIM unspecified: nothing to discard, so
        // answered like a zero-length WRITE_ZEROES (fallocate would say EINVAL).
        Command::Trim { length: 0, .. } => Ok(()),
        Command::Trim {
            offset,
            length,
            fua,
        } => b
            .trim(offset, length as u64)
            .and_then(|()| if fua { b.flush() } else { Ok(()) })
            .map_err(|e| io_error(job, &e, "trim")),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
            fast_zero,
        } => b
            .write_zeroes(offset, length as u64, !no_hole, fast_zero)
            .and_then(|()| if fua { b.flush() } else { Ok(()) })
            .map_err(|e| io_error(job, &e, "write zeroes")),
        Command::Cache { offset, length } => b
            .cache(offset, length as u64)
            .map_err(|e| io_error(job, &e, "cache")),
        Command::BlockStatus {
            offset,
            length,
            req_one,
            context_id,
        } => {
            // base:allocation's extents, if it was selected.
            let extents = match context_id {
                Some(id) => match b.block_status(offset, length as u64) {
                    Ok(extents) => Some((id, extents)),
                    Err(e) => return (error_reply(job, &io_error(job, &e, "block status")), false),
                },
                None => None,
            };
            let mut out = Vec::new();
            if job.export.exclusive_lease.is_some() {
                // The lease context: one extent, status 0.
                let whole = [weir_nbd::Extent { length, flags: 0 }];
                reply::block_status_chunk(
                    &mut out,
                    handle,
                    weir_nbd::LEASE_CONTEXT_ID,
                    &whole,
                    req_one,
                    length,
                    extents.is_none(),
                );
            }
            if let Some((id, extents)) = extents {
                reply::block_status_chunk(&mut out, handle, id, &extents, req_one, length, true);
            }
            return (out.into(), true);
        }
        Command::Disconnect => Ok(()),
    };
    match result {
        Ok(()) => (ok_reply(job), true),
        Err(e) => (error_reply(job, &e), false),
    }
}

/// A request on its way through the gate: the job, and what its pieces produced
/// when the gate releases it in pieces (a large request under a limit).
pub struct Task {
    pub job: Job,
    pieces: Mutex<Pieces>,
}

#[derive(Default)]
struct Pieces {
    /// READ: the reply (header, then the data, filled piece by piece) and where
    /// the data starts.
    reply: Option<(Vec<u8>, usize)>,
    /// The first error of any piece: the request fails with it.
    error: Option<NbdError>,
}

impl Task {
    pub fn new(job: Job) -> Arc<Task> {
        Arc::new(Task {
            job,
            pieces: Mutex::new(Pieces::default()),
        })
    }

    fn pieces(&self) -> std::sync::MutexGuard<'_, Pieces> {
        self.pieces.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request as the gate sees it.
    pub fn gate_request(&self) -> GateRequest {
        let (kind, offset, length) = charge(&self.job.command);
        GateRequest {
            volume: self.job.volume.id,
            client: self.job.client,
            kind,
            offset,
            length,
        }
    }

    /// Whether `piece` is the whole request (released in one go).
    fn is_whole(&self, piece: &Piece) -> bool {
        piece.last && piece.offset == charge(&self.job.command).1
    }

    fn fail_piece(&self, error: NbdError) {
        let mut p = self.pieces();
        if p.error.is_none() {
            p.error = Some(error);
        }
    }
}

/// Performs one piece of a request released in pieces (blocking): a READ reads
/// its part of the reply, a WRITE writes its slice of the payload, TRIM,
/// WRITE_ZEROES and CACHE act on its sub-range. FUA is honoured once, after the
/// last piece ([`finish_pieces`]). Errors are kept for the one reply.
fn perform_piece(task: &Task, piece: Piece) {
    let job = &task.job;
    if job.volume.is_deleted() {
        task.fail_piece(deleted());
        return;
    }
    let b = &job.volume.backend;
    let (_, start, _) = charge(&job.command);
    let at = (piece.offset - start) as usize;
    let len = piece.length as usize;
    let result = match job.command {
        Command::Read { length, .. } => {
            let mut data = vec![0u8; len];
            match b.read(piece.offset, &mut data) {
                Ok(()) => {
                    let mut p = task.pieces();
                    let (out, head) = p
                        .reply
                        .get_or_insert_with(|| read_reply_buffer(job, start, length));
                    let from = *head + at;
                    out[from..from + len].copy_from_slice(&data);
                    Ok(())
                }
                Err(e) => Err(io_error(job, &e, "read")),
            }
        }
        Command::Write { .. } => {
            let data = job.payload.as_deref().unwrap_or_default();
            match data.get(at..at + len) {
                Some(slice) => b
                    .write(piece.offset, slice)
                    .map_err(|e| io_error(job, &e, "write")),
                None => Err(NbdError::new(
                    ErrorCode::Io,
                    "write piece outside its payload",
                )),
            }
        }
        Command::Trim { .. } => b
            .trim(piece.offset, len as u64)
            .map_err(|e| io_error(job, &e, "trim")),
        Command::WriteZeroes {
            no_hole, fast_zero, ..
        } => b
            .write_zeroes(piece.offset, len as u64, !no_hole, fast_zero)
            .map_err(|e| io_error(job, &e, "write zeroes")),
        Command::Cache { .. } => b
            .cache(piece.offset, len as u64)
            .map_err(|e| io_error(job, &e, "cache")),
        // Never released in pieces (no range); whole requests take `perform`.
        Command::Flush | Command::BlockStatus { .. } | Command::Disconnect => Ok(()),
    };
    if let Err(e) = result {
        task.fail_piece(e);
    }
}

/// Every piece of a request released in pieces is done: one reply (after one
/// flush if the request asked for FUA).
fn finish_pieces(task: Arc<Task>) {
    let fua = matches!(
        task.job.command,
        Command::Write { fua: true, .. }
            | Command::Trim { fua: true, .. }
            | Command::WriteZeroes { fua: true, .. }
    );
    if fua && task.pieces().error.is_none() {
        // `done` may run on a runtime thread: flush on the blocking pool.
        tokio::task::spawn_blocking(move || {
            if let Err(e) = task.job.volume.backend.flush() {
                task.fail_piece(io_error(&task.job, &e, "flush"));
            }
            reply_pieces(&task);
        });
    } else {
        reply_pieces(&task);
    }
}

fn reply_pieces(task: &Task) {
    let job = &task.job;
    let (reply, error) = {
        let mut p = task.pieces();
        (p.reply.take(), p.error.take())
    };
    match (error, &job.command, reply) {
        (Some(e), _, _) => deliver(job, error_reply(job, &e), false),
        (None, Command::Read { .. }, Some((out, _))) => deliver(job, out.into(), true),
        (None, Command::Read { .. }, None) => {
            let e = NbdError::new(ErrorCode::Io, "read produced no data");
            deliver(job, error_reply(job, &e), false)
        }
        (None, _, _) => deliver(job, ok_reply(job), true),
    }
}

/// What a performed piece reports back through the gate.
pub enum Outcome {
    /// A whole request: its reply.
    Whole(Reply, bool),
    /// A piece: its result is in the task.
    Piece,
}

/// The session's side of the QoS pool: performs what the gate releases.
pub struct Io;

/// A pool whose released pieces the session performs.
pub type Pool = QosPool<Io>;

/// What travels through a pool's gate: a client's request, or a background
/// I/O of the server's own (a hybrid tier's migration, `crate::tier`), charged
/// to a volume of the gate like any other so the scheduler orders it.
#[derive(Clone)]
pub enum Work {
    Client(Arc<Task>),
    Background(Arc<Background>),
}

impl Work {
    /// Answers a request that will not run (its volume was deleted while it
    /// was queued); a background I/O is cancelled.
    pub fn fail(&self, error: NbdError) {
        match self {
            Work::Client(task) => fail(task, error),
            Work::Background(bg) => bg.cancel(),
        }
    }

    /// Runs a request past the gate (shutdown); a background I/O is cancelled.
    pub fn execute_now(self, pool: &Arc<Pool>) {
        match self {
            Work::Client(task) => execute_now(pool, task),
            Work::Background(bg) => bg.cancel(),
        }
    }
}

/// A background I/O waiting for its pieces: the gate's releases are handed to
/// the thread that submitted it (`BackgroundQos for Arc<Pool>`), which performs
/// each and completes it at the gate.
pub struct Background {
    tx: std::sync::mpsc::Sender<Option<(Ticket, Piece)>>,
}

impl Background {
    fn released(&self, ticket: Ticket, piece: Piece) {
        let _ = self.tx.send(Some((ticket, piece)));
    }
    fn cancel(&self) {
        let _ = self.tx.send(None);
    }
}

impl crate::tier::BackgroundQos for Arc<Pool> {
    fn run(
        &self,
        volume: weir_qos::VolumeId,
        kind: IoKind,
        offset: u64,
        length: u32,
        io: &mut dyn FnMut(u64, u32) -> io::Result<()>,
    ) -> io::Result<()> {
        if !self.qos_enabled() {
            return io(offset, length);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let bg = Arc::new(Background { tx });
        let request = GateRequest {
            volume,
            client: ClientId(u32::MAX),
            kind,
            offset,
            length,
        };
        if let Err(r) = self.submit(request, Work::Background(bg.clone())) {
            return Err(io::Error::other(r.error.to_string()));
        }
        run_pieces(&rx, length, io, &mut |ticket| {
            self.complete(Performed {
                ticket,
                payload: Work::Background(bg.clone()),
                outcome: Outcome::Piece,
            })
        })
    }
}

/// Performs a background request's pieces as the gate releases them, completing
/// each, until they cover its `length` bytes. They may arrive in any order: the
/// gate releases them on whichever thread pumps it, and two threads' sends race,
/// so the last piece can come before an earlier one. (Ending at the piece marked
/// `last` instead left the earlier one unperformed and in flight at the gate for
/// good: four migrators beside a client load leaked five such pieces until the
/// adaptive depth, shrunk to five, stalled the pool.) `Err`: cancelled (its volume
/// removed, or shutdown), or the first failed piece's error.
fn run_pieces<T>(
    rx: &std::sync::mpsc::Receiver<Option<(T, Piece)>>,
    length: u32,
    io: &mut dyn FnMut(u64, u32) -> io::Result<()>,
    complete: &mut dyn FnMut(T),
) -> io::Result<()> {
    let mut left = u64::from(length);
    let mut result = Ok(());
    loop {
        let Ok(Some((ticket, piece))) = rx.recv() else {
            return Err(io::Error::other("background I/O cancelled"));
        };
        if result.is_ok() {
            result = io(piece.offset, piece.length);
        }
        complete(ticket);
        left = left.saturating_sub(piece.length.into());
        if left == 0 {
            return result;
        }
    }
}

thread_local! {
    /// The pool's per-thread buffers (released pieces, inline completions).
    static BUFFERS: Cell<Buffers<Io>> = const { Cell::new(Buffers::new()) };
}

/// The device direction a piece of `command` costs on an emulated device: READ and
/// CACHE read, WRITE and WRITE_ZEROES write; TRIM, FLUSH and BLOCK_STATUS cost the
/// gate an operation but the device nothing (the `weir-model` arrays have no
/// flush or discard cost).
fn device_dir(command: &Command) -> Option<IoDir> {
    match command {
        Command::Read { .. } | Command::Cache { .. } => Some(IoDir::Read),
        Command::Write { .. } | Command::WriteZeroes { .. } => Some(IoDir::Write),
        _ => None,
    }
}

/// Performs a piece on an emulated-device pool: the model serves the piece from
/// now, in parallel with the real file I/O; the completion waits for both. Each
/// piece of a paced request reaches the model separately. `ticket`: `None` when
/// the gate is bypassed (the reply goes straight out).
fn start_on_device(
    pool: &Arc<Pool>,
    device: &Arc<EmulatedDevice>,
    task: Arc<Task>,
    ticket: Option<Ticket>,
    piece: Piece,
    urgent: bool,
) {
    let whole = task.is_whole(&piece);
    let device_done = device_dir(&task.job.command).map(|dir| {
        device.submit(
            device
                .volume_base(task.job.volume.id.0)
                .wrapping_add(piece.offset),
            piece.length,
            dir,
            urgent,
        )
    });
    let pool = pool.clone();
    tokio::spawn(async move {
        let t = task.clone();
        let performed = tokio::task::spawn_blocking(move || {
            if whole {
                let (reply, ok) = perform(&t.job);
                Outcome::Whole(reply, ok)
            } else {
                perform_piece(&t, piece);
                Outcome::Piece
            }
        })
        .await;
        if let Some(done) = device_done {
            let _ = done.await;
        }
        let outcome = performed.unwrap_or_else(|_| {
            let e = NbdError::new(ErrorCode::Io, "internal error performing the request");
            if whole {
                Outcome::Whole(error_reply(&task.job, &e), false)
            } else {
                task.fail_piece(e);
                Outcome::Piece
            }
        });
        match (ticket, outcome) {
            (Some(ticket), outcome) => pool.complete(Performed {
                ticket,
                payload: Work::Client(task),
                outcome,
            }),
            (None, Outcome::Whole(reply, ok)) => deliver(&task.job, reply, ok),
            (None, Outcome::Piece) => {}
        }
    });
}

impl Perform for Io {
    type Payload = Work;
    type Outcome = Outcome;

    /// Inline when the backend can serve a whole request without blocking, else
    /// on the blocking pool (one hand-off), or in a task that also waits for the
    /// emulated device. Pieces of a paced request go to the blocking pool.
    fn start(pool: &Arc<Pool>, release: Release<Work>) -> Option<Performed<Io>> {
        let Release {
            ticket,
            piece,
            urgent,
            payload,
            ..
        } = release;
        let task = match payload {
            Work::Client(task) => task,
            Work::Background(bg) => {
                bg.released(ticket, piece);
                return None;
            }
        };
        if piece.offset == charge(&task.job.command).1 {
            // The request's first release: the time it waited in the gate.
            let wait = task.job.received_at.elapsed().as_nanos() as u64;
            task.job.volume_counters.record_qos_wait(wait);
        }
        if let Some(device) = pool.device() {
            start_on_device(pool, device, task, Some(ticket), piece, urgent);
            return None;
        }
        let pool = pool.clone();
        if task.is_whole(&piece) {
            if let Some((reply, ok)) = try_perform_inline(&task.job) {
                return Some(Performed {
                    ticket,
                    payload: Work::Client(task),
                    outcome: Outcome::Whole(reply, ok),
                });
            }
            if try_start_async(&pool, Some(ticket), &task) {
                return None;
            }
            tokio::task::spawn_blocking(move || {
                let (reply, ok) = perform(&task.job);
                pool.complete(Performed {
                    ticket,
                    payload: Work::Client(task),
                    outcome: Outcome::Whole(reply, ok),
                });
            });
        } else {
            tokio::task::spawn_blocking(move || {
                perform_piece(&task, piece);
                pool.complete(Performed {
                    ticket,
                    payload: Work::Client(task),
                    outcome: Outcome::Piece,
                });
            });
        }
        None
    }

    fn done(performed: Performed<Io>, finished: Option<Finished>) {
        let task = match performed.payload {
            Work::Client(task) => task,
            // The background thread performed it and waits for nothing more.
            Work::Background(_) => return,
        };
        match performed.outcome {
            // A whole request is never given back by the gate: always reply.
            Outcome::Whole(reply, ok) => deliver(&task.job, reply, ok),
            Outcome::Piece => {
                if finished.is_some() {
                    finish_pieces(task);
                }
            }
        }
    }

    fn buffers() -> &'static LocalKey<Cell<Buffers<Io>>> {
        &BUFFERS
    }
}

/// A whole request's reply: to the gate (`ticket`), or straight out.
fn finish_whole(pool: &Arc<Pool>, ticket: Option<Ticket>, task: Arc<Task>, reply: Reply, ok: bool) {
    match ticket {
        Some(ticket) => pool.complete(Performed {
            ticket,
            payload: Work::Client(task),
            outcome: Outcome::Whole(reply, ok),
        }),
        None => deliver(&task.job, reply, ok),
    }
}

/// A WRITE's payload, kept by its task (immutable once read from the socket).
struct TaskPayload(Arc<Task>);

impl AsRef<[u8]> for TaskPayload {
    fn as_ref(&self) -> &[u8] {
        self.0.job.payload.as_deref().unwrap_or_default()
    }
}

/// Starts a whole READ or WRITE on a backend that completes it from another
/// thread ([`crate::backend::Backend::start_async`]: an upstream NBD server),
/// so no blocking thread waits on it; `false`: perform it the usual way.
fn try_start_async(pool: &Arc<Pool>, ticket: Option<Ticket>, task: &Arc<Task>) -> bool {
    use crate::backend::{AsyncDone, AsyncOp, WriteData};
    let job = &task.job;
    if job.volume.is_deleted() {
        return false;
    }
    let op = match job.command {
        Command::Read { offset, length, .. } => AsyncOp::Read { offset, length },
        Command::Write { offset, fua, .. } => AsyncOp::Write {
            offset,
            data: WriteData::new(Arc::new(TaskPayload(task.clone()))),
            fua,
        },
        _ => return false,
    };
    let (t, p) = (task.clone(), pool.clone());
    let done: AsyncDone = Box::new(move |result| {
        let Some(result) = result else {
            tokio::task::spawn_blocking(move || {
                let (reply, ok) = perform(&t.job);
                finish_whole(&p, ticket, t, reply, ok);
            });
            return;
        };
        let (reply, ok) = match (result, &t.job.command) {
            (Ok(data), &Command::Read { offset, length, .. }) if data.len() == length as usize => {
                let (mut out, start) = read_reply_buffer(&t.job, offset, length);
                out[start..].copy_from_slice(&data);
                (out.into(), true)
            }
            (Ok(_), Command::Read { .. }) => {
                let e = NbdError::new(ErrorCode::Io, "read: a reply of the wrong length");
                (error_reply(&t.job, &e), false)
            }
            (Ok(_), _) => (ok_reply(&t.job), true),
            (Err(e), Command::Read { .. }) => {
                (error_reply(&t.job, &io_error(&t.job, &e, "read")), false)
            }
            (Err(e), _) => (error_reply(&t.job, &io_error(&t.job, &e, "write")), false),
        };
        finish_whole(&p, ticket, t, reply, ok);
    });
    job.volume.backend.start_async(op, done).is_ok()
}

/// Runs a request at once, past the gate (a pool with `qos = false`, or
/// shutdown), and replies.
pub fn execute_now(pool: &Arc<Pool>, task: Arc<Task>) {
    let (_, offset, length) = charge(&task.job.command);
    if let Some(device) = pool.device() {
        start_on_device(
            pool,
            device,
            task,
            None,
            Piece::whole(offset, length),
            false,
        );
        return;
    }
    if let Some((reply, ok)) = try_perform_inline(&task.job) {
        deliver(&task.job, reply, ok);
        return;
    }
    if try_start_async(pool, None, &task) {
        return;
    }
    pool.spawn_bypass(Box::new(move || {
        let (reply, ok) = perform(&task.job);
        deliver(&task.job, reply, ok);
    }));
}

/// Answers a request that will not run (its volume was deleted while it was
/// queued, or its connection is gone).
pub fn fail(task: &Task, error: NbdError) {
    // An I/O and an error in the counters, but no bytes: none moved (a gone
    // client's 32 MiB reads would otherwise show as GB read in a second).
    send_reply(&task.job, error_reply(&task.job, &error), false, 0);
}

/// The exports one client (host, TLS identity) may see.
struct SessionCatalog<'a> {
    state: &'a ServerState,
    peer: Peer<'a>,
}

impl ExportCatalog for SessionCatalog<'_> {
    fn list(&self) -> Vec<ExportListing> {
        let store = self.state.store();
        store
            .visible_to(self.peer)
            .into_iter()
            .map(|r| ExportListing {
                name: r.name,
                description: r.description,
            })
            .collect()
    }
    fn lookup(&self, name: &str) -> Option<ExportDescription> {
        let store = self.state.store();
        let r = store.get(name).ok()?;
        if !store.may_access(&r, self.peer) {
            return None;
        }
        let limits = store.upstream_limits(&r.name);
        let mut d = ExportDescription::new(r.name, r.size_bytes);
        d.description = r.description;
        d.read_only = r.read_only;
        if let Some(up) = limits {
            // Its clients get no more than the upstream gives: alignment, request
            // size (larger ones are split anyway), writability.
            let b = up.block_size;
            let max = b.max_payload_bytes.min(d.block_size.max_payload_bytes);
            d.block_size = weir_nbd::BlockSize {
                min_bytes: b.min_bytes,
                preferred_bytes: b.preferred_bytes.min(max),
                max_payload_bytes: max,
            };
            d.read_only |= up.read_only;
        }
        // One shared file per volume: FLUSH (fdatasync) covers every connection.
        d.can_multi_conn = true;
        Some(d)
    }
    fn lease_available(&self, export: &str, token: &str) -> bool {
        self.lookup(export)
            .is_some_and(|d| !d.read_only && self.state.leases.available(&d.name, token))
    }
}

/// Serves one connection until the client disconnects, breaks the protocol,
/// stays idle past `idle_timeout_s`, or the server shuts down (in-flight requests
/// are answered first). `slot` counts it against the connection caps until the
/// end, and gives it its host's and the server's data budgets.
pub async fn run_session(
    state: Arc<ServerState>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
    slot: Slot,
) {
    let host = canonical(peer.ip());
    let _ = stream.set_nodelay(true);
    let zero_copy = state.zero_copy_reads.applies(same_host(&stream, host));
    // The socket, for the writer to shut its read side when it gives up (it
    // stays open as long as either half of the stream, plain or TLS, does).
    let socket_fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    if let Some(Err(e)) = state
        .tcp_keepalive
        .map(|idle| crate::keepalive::enable(socket_fd, idle))
    {
        tracing::debug!(%peer, "TCP keepalive not set: {e}");
    }
    let Some((info, leftover, stream)) =
        negotiate(&state, host, peer, Stream::Plain(stream), &mut shutdown).await
    else {
        return;
    };
    let (rd, wr) = stream.split();
    let Some(volume) = state.store().open_volume(&info.name) else {
        return;
    };
    // A lease the handshake offered is taken now; lost to another client
    // meanwhile, the connection closes (the client believes it holds it).
    let lease = match &info.exclusive_lease {
        None => None,
        Some(token) => {
            let Some(held) = take_lease(&state, &volume.name, token, peer).await else {
                tracing::debug!(%peer, volume = %volume.name, "exclusive lease lost before transmission: closing");
                return;
            };
            Some(held)
        }
    };
    tracing::debug!(%peer, volume = %info.name, "transmission");
    let Some(pool) = state.pool(&volume.pool) else {
        return;
    };
    // The host stays remembered (id, counters) until the last reply is written.
    let host_session = state.metrics.attach_host(host);
    let client = host_session.id;
    pool.host_connection(client, volume.id, true);
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let (host_data, server_data) = slot.data_budgets();
    let pool_host_data = slot.pool_budget(&volume.pool);
    let conn = Conn {
        peer,
        volume_counters: state.metrics.volume(&volume.name),
        host_counters: host_session.counters.clone(),
        export: Arc::new(info),
        volume,
        pool,
        client,
        zero_copy,
        tx,
        buffers: Arc::new(ReplyBuffers::default()),
        permits: Budget::new(MAX_IN_FLIGHT_PER_CONNECTION),
        data_budget: Budget::new(MAX_BUFFERED_BYTES_PER_CONNECTION / BUFFER_UNIT_BYTES),
        host_data,
        server_data,
        pool_host_data,
        unanswered: Arc::new(AtomicUsize::new(0)),
        idle: state.idle_timeout,
        leases: state.leases.clone(),
        lease,
        writer_mark: Mutex::new(None),
    };
    let mut writer = tokio::spawn(write_replies(
        wr,
        socket_fd,
        rx,
        conn.buffers.clone(),
        conn.unanswered.clone(),
        peer,
        conn.idle,
        conn.server_data.clone(),
    ));
    let mut reader = BufReader::with_capacity(256 * 1024, std::io::Cursor::new(leftover).chain(rd));
    // A peer found gone with replies or window probes unanswered (which
    // keepalive does not cover) has its connection aborted. Declared after
    // `reader`, so dropped (the watch stopped) before the socket can close.
    let peer_watch = state
        .tcp_keepalive
        .map(|idle| crate::keepalive::PeerWatch::start(socket_fd, idle, peer));
    let ended = conn
        .serve_requests(&mut reader, BusyPoll::new(state.busy_poll), &mut shutdown)
        .await;
    let Conn {
        tx,
        pool,
        client,
        volume,
        lease,
        writer_mark,
        ..
    } = conn;
    if ended == Ended::Gone {
        cancel_queued(&pool, volume.id, &tx);
    }
    // Stop reading; the writer finishes once every in-flight job has replied.
    drop(tx);
    if lease.as_ref().is_some_and(LeaseHeld::is_revoked)
        && tokio::time::timeout(crate::lease::LEASE_GRACE, &mut writer)
            .await
            .is_err()
    {
        // A broken lease's holder that takes none of its replies is closed all
        // the same: its writer's blocked write fails.
        // SAFETY: shutdown(2) on the connection's socket, still open (the writer
        // task owns it until it ends); no memory passed.
        unsafe { libc::shutdown(socket_fd, libc::SHUT_RDWR) };
    }
    let _ = writer.await;
    drop(peer_watch);
    // Only now (no write of this connection is in flight any more) may another
    // client take the lease, or this one's end start the grace (a last release
    // records it: an fsync, so on a blocking thread).
    drop(writer_mark);
    if let Some(lease) = lease {
        let _ = tokio::task::spawn_blocking(move || drop(lease)).await;
    }
    if ended == Ended::Linger {
        // Our side is closed (FIN sent); read what the client still sends until it
        // closes too, so closing the socket does not reset replies in transit.
        let _ = tokio::time::timeout(SHUTDOWN_QUIET, async {
            let mut sink = [0u8; 16 * 1024];
            while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    }
    pool.host_connection(client, volume.id, false);
    drop(host_session);
    tracing::debug!(%peer, "connection closed");
}

/// Fails the requests of the connection replying on `tx` that its volume's gate
/// has not fully released (the client is gone): they give back their budgets
/// and the volume's limit now, not after they ran for nobody.
fn cancel_queued(
    pool: &Arc<Pool>,
    volume: weir_qos::VolumeId,
    tx: &mpsc::UnboundedSender<Outgoing>,
) {
    let ours = |w: &Work| matches!(w, Work::Client(t) if t.job.reply.same_channel(tx));
    for work in pool.cancel_where(volume, ours) {
        work.fail(NbdError::new(
            ErrorCode::Shutdown,
            "the connection closed before the request was served",
        ));
    }
}

/// Takes a connection's share of the volume's lease, on a blocking thread (a
/// first grant records it: an fsync).
async fn take_lease(
    state: &ServerState,
    volume: &str,
    token: &str,
    peer: SocketAddr,
) -> Option<LeaseHeld> {
    let (leases, volume, token) = (state.leases.clone(), volume.to_string(), token.to_string());
    tokio::task::spawn_blocking(move || leases.acquire(&volume, &token, &peer.ip().to_string()))
        .await
        .ok()
        .flatten()
}

/// Option haggling (within [`HANDSHAKE_TIMEOUT`]), STARTTLS included: the export
/// chosen, the bytes already received after it, and the stream (TLS after
/// STARTTLS), or `None` (the client left, aborted, or failed).
async fn negotiate(
    state: &ServerState,
    host: IpAddr,
    peer: SocketAddr,
    mut stream: Stream,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<(ExportInfo, Vec<u8>, Stream)> {
    let mut hs = ServerHandshake::with_tls(state.tls.policy());
    let negotiated = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut buf = vec![0u8; 16 * 1024];
        // The verified TLS client certificate's subject CN, once TLS is up.
        let mut identity: Option<String> = None;
        stream.write_all(&hs.take_output()).await.ok()?;
        loop {
            // Options already read are answered before more is read (the
            // handshake stops at a bounded amount of replies).
            let n = if hs.has_buffered_options() {
                0
            } else {
                let n = tokio::select! {
                    r = stream.read(&mut buf) => r.ok()?,
                    // Shutting down: drop connections still haggling.
                    _ = shutdown.changed() => return None,
                };
                if n == 0 {
                    return None;
                }
                n
            };
            let event = hs.input(
                &buf[..n],
                &SessionCatalog {
                    state,
                    peer: Peer {
                        host,
                        identity: identity.as_deref(),
                    },
                },
            );
            let out = hs.take_output();
            if !out.is_empty() {
                stream.write_all(&out).await.ok()?;
            }
            match event {
                Ok(None) => {}
                Ok(Some(HandshakeEvent::ExportChosen(info))) => return Some((info, stream)),
                Ok(Some(HandshakeEvent::Aborted)) => return None,
                Ok(Some(HandshakeEvent::StartTls)) => {
                    stream = match state.tls.accept(stream).await {
                        Ok(c) => c,
                        Err(e) => {
                            tls_failed(peer, &e);
                            return None;
                        }
                    };
                    identity = stream.identity();
                    tracing::debug!(%peer, ?identity, suite = ?stream.cipher_suite(), "TLS established");
                    hs.tls_started();
                }
                Err(e) => {
                    tracing::info!(%peer, "handshake failed: {e}");
                    return None;
                }
            }
        }
    })
    .await;
    let (info, stream) = negotiated.ok()??;
    Some((info, hs.take_leftover(), stream))
}

/// How a connection's request loop ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Ended {
    /// The client broke the protocol, went idle, sent DISC, or its lease was broken.
    Closed,
    /// The connection ended under the client (end of stream or an error, no DISC)
    /// or it stopped reading: no reply can reach it, so what it still has queued
    /// in the gate is taken out (it would hold its volume's limit, and its host's
    /// next requests, for nobody).
    Gone,
    /// We close while the client may still be sending (shutdown, a refused
    /// request): read and drop its bytes for a moment so our replies arrive.
    Linger,
}

/// What reading the next request header gave.
enum Next {
    Header([u8; REQUEST_HEADER_LEN]),
    /// The server began shutting down: answer what still comes with ESHUTDOWN.
    Drain,
    Stop,
    /// The stream ended or failed under the client (see [`Ended::Gone`]).
    Gone,
}

type ConnReader = BufReader<tokio::io::Chain<std::io::Cursor<Vec<u8>>, ConnRead>>;

/// One connection in transmission: what every request needs.
struct Conn {
    peer: SocketAddr,
    volume: Arc<OpenVolume>,
    export: Arc<ExportInfo>,
    pool: Arc<Pool>,
    client: ClientId,
    /// Large READs may use `sendfile(2)` (the client is on another machine).
    zero_copy: bool,
    volume_counters: Arc<IoCounters>,
    host_counters: Arc<IoCounters>,
    tx: mpsc::UnboundedSender<Outgoing>,
    buffers: Arc<ReplyBuffers>,
    /// Requests whose replies are not yet written ([`MAX_IN_FLIGHT_PER_CONNECTION`]).
    permits: Budget,
    /// READ/WRITE data of those requests, in [`BUFFER_UNIT_BYTES`] units …
    data_budget: Budget,
    /// … and their share of the host's and the server's budgets.
    host_data: Budget,
    server_data: Budget,
    /// This pool's share of the host's budget (`connections::Slot::pool_budget`).
    pool_host_data: Budget,
    /// Requests read and not yet answered (busy polling, idle detection).
    unanswered: Arc<AtomicUsize>,
    idle: Option<Duration>,
    leases: Arc<Leases>,
    /// This connection's share of the volume's exclusive lease, if it asked.
    lease: Option<LeaseHeld>,
    /// Set at this connection's first write without the lease.
    writer_mark: Mutex<Option<WriterMark>>,
}

/// Completes when the connection's lease is broken (never without one).
async fn lease_broken(lease: &Option<LeaseHeld>) {
    match lease {
        Some(held) => held.revoked().await,
        None => std::future::pending().await,
    }
}

/// Sleeps `d`, or forever.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// `f`, failing with `TimedOut` if it takes longer than `limit`.
async fn within<T>(
    limit: Option<Duration>,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match limit {
        None => f.await,
        Some(d) => tokio::time::timeout(d, f).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no progress for {} s (idle_timeout_s)", d.as_secs()),
            ))
        }),
    }
}

impl Conn {
    /// Reads, validates and submits requests until the connection ends.
    async fn serve_requests(
        &self,
        reader: &mut ConnReader,
        mut busy_poll: BusyPoll,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Ended {
        let max_payload = self.export.block_size.max_payload_bytes;
        // Shutting down: requests still arriving are read and answered ESHUTDOWN
        // (so the client sees a reply for everything it sent, not a reset), until
        // the client goes quiet or the drain time is up.
        let mut drain_until: Option<Instant> = None;
        let closed = |drain: Option<Instant>| match drain {
            Some(_) => Ended::Linger,
            None => Ended::Closed,
        };
        loop {
            // A request slot: held until its reply is written, so a client that
            // does not read its replies stops being read from.
            if self.tx.is_closed() {
                // The writer gave up (the client reads nothing) or the socket broke.
                return Ended::Gone;
            }
            let permit = match self.permits.try_take(1) {
                Some(p) => p,
                None => tokio::select! {
                    p = self.permits.take(1) => p,
                    _ = shutdown.changed(), if drain_until.is_none() => {
                        drain_until = Some(Instant::now() + SHUTDOWN_DRAIN);
                        continue;
                    }
                },
            };
            let h = match self
                .next_header(reader, &mut busy_poll, shutdown, drain_until)
                .await
            {
                Next::Header(h) => h,
                Next::Drain => {
                    drain_until = Some(Instant::now() + SHUTDOWN_DRAIN);
                    continue;
                }
                Next::Stop => return closed(drain_until),
                Next::Gone if drain_until.is_none() => return Ended::Gone,
                Next::Gone => return closed(drain_until),
            };
            let header = match RequestHeader::decode(&h) {
                Ok(h) => h,
                Err(e) => {
                    tracing::info!(peer = %self.peer, "closing connection: {e}");
                    return Ended::Closed;
                }
            };
            // Every request but DISC gets exactly one reply (the writer counts them out).
            self.unanswered.fetch_add(1, Ordering::Relaxed);
            if header.has_payload() && header.length > max_payload {
                self.refuse_payload(&header, permit);
                return Ended::Linger;
            }
            let mut data = self.data_permit(&header, max_payload).await;
            let received_at = Instant::now();
            let payload = if header.has_payload() {
                match self.read_payload(reader, header.length, &mut data).await {
                    Some(p) => Some(p),
                    None => return Ended::Gone,
                }
            } else {
                None
            };
            let held = Held {
                _request: permit,
                _data: data,
            };
            let request = Request { header, payload };
            let valid = match validate(&request, &self.export) {
                Ok(v) => v,
                Err(e) => {
                    self.reply_error(header.handle, &e, held);
                    continue;
                }
            };
            if valid.command == Command::Disconnect {
                return closed(drain_until);
            }
            // A deleted volume's connection ends as a shutdown does (its requests
            // failed with EIO for as long as the client kept it open).
            if self.volume.is_deleted() && drain_until.is_none() {
                drain_until = Some(Instant::now() + SHUTDOWN_DRAIN);
            }
            if drain_until.is_some() {
                let e = if self.volume.is_deleted() {
                    deleted()
                } else {
                    NbdError::new(ErrorCode::Shutdown, "the server is shutting down")
                };
                self.reply_error(valid.handle, &e, held);
                continue;
            }
            if let Err(e) = self.lease_check(&valid.command).await {
                self.reply_error(valid.handle, &e, held);
                continue;
            }
            self.submit(valid, request.payload, received_at, held);
        }
    }

    /// A write from a connection without the volume's lease: refused (EPERM)
    /// while another client holds it, delayed while a lease that just ended is
    /// in its grace (see `crate::lease`).
    async fn lease_check(&self, command: &Command) -> Result<(), NbdError> {
        let writes = matches!(
            command,
            Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
        );
        if let Some(held) = &self.lease {
            if writes && held.is_revoked() {
                return Err(NbdError::new(
                    ErrorCode::Perm,
                    "this connection's exclusive lease was broken (weir volume break-lease)",
                ));
            }
            return Ok(());
        }
        if !writes {
            return Ok(());
        }
        let wait = {
            let mut mark = self.writer_mark.lock().unwrap_or_else(|e| e.into_inner());
            self.leases.foreign_write(&self.volume.name, &mut mark)
        };
        match wait {
            Err(Refused(why)) => Err(NbdError::new(ErrorCode::Perm, why)),
            Ok(Some(until)) => {
                tokio::time::sleep_until(until.into()).await;
                Ok(())
            }
            Ok(None) => Ok(()),
        }
    }

    /// The next request header: waits for it (busy polling when the client waits
    /// on its last reply), at most `idle_timeout_s` when nothing is unanswered,
    /// and while draining at most [`SHUTDOWN_QUIET`].
    async fn next_header(
        &self,
        reader: &mut ConnReader,
        busy_poll: &mut BusyPoll,
        shutdown: &mut watch::Receiver<bool>,
        drain_until: Option<Instant>,
    ) -> Next {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        if let Some(until) = drain_until {
            let quiet = SHUTDOWN_QUIET.min(until.saturating_duration_since(Instant::now()));
            return match tokio::time::timeout(quiet, reader.read_exact(&mut h)).await {
                Ok(Ok(_)) => Next::Header(h),
                _ => Next::Stop,
            };
        }
        let unanswered = self.unanswered.load(Ordering::Relaxed);
        // A client waiting on its last reply: poll before sleeping (busy_poll).
        let window = busy_poll.window(unanswered);
        let idle = self.idle.filter(|_| unanswered == 0);
        let started = Instant::now();
        let read = std::pin::pin!(reader.read_exact(&mut h));
        let deadline = started + window.unwrap_or_default();
        // Shutdown first: once it is signalled, a request that arrives (even one
        // already waiting when this task wakes) is answered ESHUTDOWN, never run.
        tokio::select! {
            biased;
            _ = shutdown.changed() => Next::Drain,
            _ = lease_broken(&self.lease) => {
                tracing::info!(peer = %self.peer, "closing connection: its exclusive lease was broken");
                Next::Stop
            }
            (r, waited) = poll_until(read, deadline) => {
                if r.is_err() {
                    return Next::Gone;
                }
                busy_poll.request_read(waited.then(|| started.elapsed()), window.is_some());
                Next::Header(h)
            }
            _ = sleep_or_never(idle) => {
                tracing::info!(peer = %self.peer, "closing idle connection (idle_timeout_s)");
                Next::Stop
            }
        }
    }

    /// Budget for a READ's or WRITE's data, from the connection's, then the
    /// host's, then the server's budget (always in that order; a request takes at
    /// most a whole budget). A WRITE takes the server's only for its first
    /// [`PAYLOAD_CHUNK_BYTES`] here, the rest as its payload arrives
    /// ([`Self::read_payload`]): a client that declares large writes and never
    /// sends their data holds its own and its host's budgets, not the server's.
    /// `None`: the request carries no data.
    async fn data_permit(&self, header: &RequestHeader, max_payload: u32) -> Option<DataHeld> {
        if !(matches!(header.command, CMD_READ | CMD_WRITE) && header.length <= max_payload) {
            return None;
        }
        let units = (header.length as usize).div_ceil(BUFFER_UNIT_BYTES).max(1);
        let server_units = if header.command == CMD_WRITE {
            units.min(PAYLOAD_CHUNK_BYTES / BUFFER_UNIT_BYTES)
        } else {
            units
        };
        let connection = match self.data_budget.try_take(units) {
            Some(t) => t,
            None => self.data_budget.take(units).await,
        };
        // In this order everywhere: a request waiting for one budget holds only
        // the ones before it. The pool's share comes before the host budget it is
        // a share of, so a stalled pool's writers wait holding none of the host's.
        let take = |b: &Budget, units: usize| {
            let b = b.clone();
            async move {
                match b.try_take(units) {
                    Some(t) => t,
                    None => b.take(units).await,
                }
            }
        };
        let pool_host = take(&self.pool_host_data, units).await;
        let host = take(&self.host_data, units).await;
        let server = take(&self.server_data, server_units).await;
        Some(DataHeld {
            _connection: connection,
            _pool_host: pool_host,
            _host: host,
            server,
        })
    }

    /// A WRITE's payload, read straight into spare capacity (no zeroing first),
    /// [`PAYLOAD_CHUNK_BYTES`] at a time, each chunk's share of the server's data
    /// budget taken before it is read (the first came with `data`). If that
    /// budget gives nothing back for [`PAYLOAD_STALL`] while this waits, every
    /// holder may be a payload waiting like this one: the connection closes,
    /// dropping what it had read, so that the others go on.
    async fn read_payload(
        &self,
        reader: &mut ConnReader,
        length: u32,
        data: &mut Option<DataHeld>,
    ) -> Option<Vec<u8>> {
        let length = length as usize;
        // Bytes the payload's share of the server's budget covers so far.
        let covered = |d: &Option<DataHeld>| {
            d.as_ref()
                .map_or(length, |d| d.server.units() * BUFFER_UNIT_BYTES)
                .min(length)
        };
        let mut p = Vec::with_capacity(length);
        while p.len() < length {
            if p.len() >= covered(data) {
                let units = (length - p.len())
                    .min(PAYLOAD_CHUNK_BYTES)
                    .div_ceil(BUFFER_UNIT_BYTES);
                let Some(more) = self
                    .server_data
                    .take_unless_stuck(units, PAYLOAD_STALL)
                    .await
                else {
                    tracing::warn!(
                        peer = %self.peer,
                        "closing connection: the server's data buffers (max_buffered_mib) gave \
                         nothing back for {} s while its WRITE payload waited for them",
                        PAYLOAD_STALL.as_secs()
                    );
                    return None;
                };
                if let Some(d) = data.as_mut() {
                    d.server.absorb(more);
                }
            }
            let want = covered(data) - p.len();
            let mut take = (&mut *reader).take(want as u64);
            match within(self.idle, take.read_to_end(&mut p)).await {
                Ok(n) if n == want => {}
                Ok(_) => return None,
                Err(e) => {
                    tracing::info!(peer = %self.peer, "closing connection: reading a payload: {e}");
                    return None;
                }
            }
        }
        Some(p)
    }

    /// A WRITE declaring more than the maximum payload: answered EINVAL, then the
    /// connection closes (`proto.md` allows a hard disconnect for a payload deemed a
    /// denial of service; reading and discarding up to 4 GiB is not done).
    fn refuse_payload(&self, header: &RequestHeader, permit: Taken) {
        let max = self.export.block_size.max_payload_bytes;
        let e = NbdError::inval(format!(
            "write of {} bytes exceeds the maximum payload of {max} bytes; closing the connection",
            header.length
        ));
        tracing::info!(peer = %self.peer, "{e}");
        let held = Held {
            _request: permit,
            _data: None,
        };
        self.reply_error(header.handle, &e, held);
    }

    /// Answers a request that fails before it reaches the gate.
    fn reply_error(&self, handle: u64, e: &NbdError, held: Held) {
        let mut out = Vec::new();
        reply::error_reply(&mut out, &self.export, handle, e);
        self.host_counters.record(OpKind::Other, 0, 0, false);
        self.volume_counters.record(OpKind::Other, 0, 0, false);
        let _ = self.tx.send(Outgoing {
            reply: out.into(),
            held: Some(held),
        });
    }

    /// Hands a valid request to the pool's gate (or straight to the backend).
    fn submit(
        &self,
        valid: ValidRequest,
        payload: Option<Vec<u8>>,
        received_at: Instant,
        held: Held,
    ) {
        let job = Job {
            handle: valid.handle,
            command: valid.command,
            payload,
            volume: self.volume.clone(),
            export: self.export.clone(),
            reply: self.tx.clone(),
            buffers: self.buffers.clone(),
            volume_counters: self.volume_counters.clone(),
            host_counters: self.host_counters.clone(),
            received_at,
            client: self.client,
            zero_copy: self.zero_copy,
            held: Mutex::new(Some(held)),
        };
        let task = Task::new(job);
        if !self.pool.qos_enabled() {
            // QoS off on this pool: straight to the backend.
            execute_now(&self.pool, task);
            return;
        }
        let request = task.gate_request();
        if let Err(rejected) = self.pool.submit(request, Work::Client(task)) {
            rejected
                .payload
                .fail(NbdError::new(ErrorCode::Io, rejected.error.to_string()));
        }
    }
}

/// The connection's writer: sends replies in the order they complete and, once
/// each is written, gives back what its request held. With `idle_timeout_s`, a
/// client that reads nothing for that long is disconnected; so is one whose
/// reply waits [`REPLY_STALL`] while the server's data budget (`server_data`) is
/// stuck: others wait for it and nothing comes back (clients that read no
/// replies, from enough addresses, would otherwise hold it all).
#[allow(clippy::too_many_arguments)]
async fn write_replies(
    wr: ConnWrite,
    socket: std::os::fd::RawFd,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    recycle: Arc<ReplyBuffers>,
    answered: Arc<AtomicUsize>,
    peer: SocketAddr,
    idle: Option<Duration>,
    server_data: Budget,
) {
    // Small replies that are ready together go out in one write.
    let mut wr = tokio::io::BufWriter::with_capacity(64 * 1024, wr);
    while let Some(out) = rx.recv().await {
        let mut next = Some(out);
        while let Some(Outgoing { reply, held }) = next.take() {
            let write = write_reply(&mut wr, reply, &recycle, idle);
            if let Err(e) = unless_stuck(write, &server_data).await {
                // Part of a reply may be out: the stream cannot go on.
                tracing::info!(%peer, "closing connection: sending a reply: {e}");
                return give_up(wr, socket, rx);
            }
            drop(held);
            answered.fetch_sub(1, Ordering::Relaxed);
            next = rx.try_recv().ok();
        }
        if let Err(e) = within(idle, wr.flush()).await {
            tracing::info!(%peer, "closing connection: sending replies: {e}");
            return give_up(wr, socket, rx);
        }
    }
    let _ = within(idle, wr.shutdown()).await;
}

/// Runs a reply's write; fails it if the server's data budget is stuck
/// ([`Budget::stuck_for`] [`REPLY_STALL`]) before it is done. The watch is
/// armed only if the write does not finish at once.
async fn unless_stuck(
    write: impl std::future::Future<Output = io::Result<()>>,
    server_data: &Budget,
) -> io::Result<()> {
    let mut write = std::pin::pin!(write);
    loop {
        tokio::select! {
            biased;
            r = &mut write => return r,
            stuck = server_data.stuck_for(REPLY_STALL) => if stuck {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the client took none of its replies for {} s while the server's \
                         data buffers (max_buffered_mib) were full and others waited",
                        REPLY_STALL.as_secs()
                    ),
                ));
            },
        }
    }
}

/// The writer cannot go on (the socket broke, or the client read nothing for
/// `idle_timeout_s`): replies still queued are dropped with what their requests
/// hold, and the socket's read side is shut so that the reader, wherever it
/// waits, sees the end and stops.
fn give_up(
    wr: tokio::io::BufWriter<ConnWrite>,
    socket: std::os::fd::RawFd,
    rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    drop(rx);
    // SAFETY: shutdown(2) on the connection's socket, open while `wr` (a half of
    // the stream that owns it, plain or TLS) is alive; no memory passed.
    unsafe { libc::shutdown(socket, libc::SHUT_RD) };
    drop(wr);
}

/// Writes one reply (within `idle`, when set: the client must take it in).
async fn write_reply(
    wr: &mut tokio::io::BufWriter<ConnWrite>,
    reply: Reply,
    recycle: &ReplyBuffers,
    idle: Option<Duration>,
) -> io::Result<()> {
    match idle {
        None => write_one(wr, reply, recycle).await,
        Some(_) => within(idle, write_one(wr, reply, recycle)).await,
    }
}

async fn write_one(
    wr: &mut tokio::io::BufWriter<ConnWrite>,
    reply: Reply,
    recycle: &ReplyBuffers,
) -> io::Result<()> {
    match reply {
        Reply::Bytes(buf) => {
            wr.write_all(&buf).await?;
            recycle.give_back(buf);
        }
        Reply::FromFile {
            head,
            volume: _volume,
            fd,
            offset,
            length,
        } => {
            wr.write_all(&head).await?;
            if wr.get_ref().tcp().is_none() {
                // TLS: the data is encrypted in user space.
                return copy_file(wr, fd, offset, length, recycle).await;
            }
            wr.flush().await?;
            if let Some(socket) = wr.get_ref().tcp() {
                send_file(socket, fd, offset, length).await?;
            }
        }
    }
    Ok(())
}

/// Writes `length` bytes of the file `fd` from `offset` to `out` through a
/// buffer (a TLS connection, where `sendfile(2)` cannot apply). The range was
/// in the page cache when the reply was made, so the reads do not wait on a
/// device.
async fn copy_file<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    fd: std::os::fd::RawFd,
    offset: u64,
    left: usize,
    recycle: &ReplyBuffers,
) -> io::Result<()> {
    // A recycled buffer: a fresh 256 KiB one is an mmap, 64 page faults and its
    // zeroing on every large reply.
    let mut buf = recycle.take(left.min(256 * 1024));
    let sent = copy_through(out, fd, offset, left, &mut buf).await;
    recycle.give_back(buf);
    sent
}

async fn copy_through<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    fd: std::os::fd::RawFd,
    mut offset: u64,
    mut left: usize,
    buf: &mut [u8],
) -> io::Result<()> {
    while left > 0 {
        let want = left.min(buf.len());
        // SAFETY: `fd` is kept open by the reply's volume; `buf` holds `want` bytes.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), want, offset as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the volume file ended before the requested range",
            ));
        }
        out.write_all(&buf[..n as usize]).await?;
        offset += n as u64;
        left -= n as usize;
    }
    Ok(())
}

/// Sends `length` bytes of the file `fd` from `offset` to the socket with
/// `sendfile(2)` (page cache to socket, no user-space copy), waiting for room in
/// the socket buffer as needed.
async fn send_file(
    socket: &TcpStream,
    fd: std::os::fd::RawFd,
    mut offset: u64,
    mut left: usize,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    while left > 0 {
        socket.writable().await?;
        let sent = socket.try_io(tokio::io::Interest::WRITABLE, || {
            let mut off = offset as libc::off_t;
            // SAFETY: both descriptors are open (the socket is borrowed, the file
            // is kept open by the reply's volume); `off` is a live local.
            let n = unsafe { libc::sendfile(socket.as_raw_fd(), fd, &mut off, left) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the volume file ended before the requested range",
                ));
            }
            Ok(n) => {
                offset += n as u64;
                left -= n;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A failed TLS handshake (a client certificate refused, an expired one, a
/// plaintext client on a TLS port): a warning, at most one per
/// [`crate::connections::WARN_EVERY`] for the whole server (it was logged at
/// info, which the default level hides: the client saw "TLS fatal alert", the
/// operator nothing).
fn tls_failed(peer: impl std::fmt::Display, e: &dyn std::fmt::Display) {
    static WARNINGS: std::sync::Mutex<crate::connections::RateLimited> = std::sync::Mutex::new(
        crate::connections::RateLimited::new(crate::connections::WARN_EVERY),
    );
    warn_limited(&WARNINGS, || {
        format!("TLS handshake with {peer} failed: {e}")
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection over loopback, or to the address the server listens on, is
    /// a client on this machine; `auto` then sends it no page-cache pages.
    #[tokio::test]
    async fn a_client_on_this_machine_is_the_same_host() {
        use crate::config::ZeroCopyReads;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, peer) = listener.accept().await.unwrap();
        let host = canonical(peer.ip());
        assert!(same_host(&accepted, host));
        // Not loopback, and not the address the connection reached: elsewhere.
        assert!(!same_host(&accepted, "192.0.2.7".parse().unwrap()));
        assert!(!ZeroCopyReads::Auto.applies(true));
        assert!(ZeroCopyReads::Auto.applies(false));
        assert!(ZeroCopyReads::On.applies(true));
        assert!(!ZeroCopyReads::Off.applies(false));
    }

    #[test]
    fn a_background_request_ends_when_its_pieces_cover_it_in_any_order() {
        let piece = |offset, length, last| Piece {
            offset,
            length,
            last,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // The last piece arrives first (two threads' releases raced).
        tx.send(Some((2, piece(1_000_000, 48_576, true)))).unwrap();
        tx.send(Some((1, piece(0, 1_000_000, false)))).unwrap();
        let (mut performed, mut completed) = (Vec::new(), Vec::new());
        let r = run_pieces(
            &rx,
            1 << 20,
            &mut |offset, length| {
                performed.push((offset, length));
                Ok(())
            },
            &mut |t| completed.push(t),
        );
        assert!(r.is_ok());
        assert_eq!(performed, [(1_000_000, 48_576), (0, 1_000_000)]);
        assert_eq!(completed, [2, 1], "every released piece is completed");
        // A whole request of no bytes is one piece; a failure is reported once
        // every piece is completed; a cancel ends it.
        tx.send(Some((3, piece(0, 0, true)))).unwrap();
        assert!(run_pieces(&rx, 0, &mut |_, _| Ok(()), &mut |_| ()).is_ok());
        tx.send(Some((4, piece(0, 10, false)))).unwrap();
        tx.send(Some((5, piece(10, 10, true)))).unwrap();
        let mut done = Vec::new();
        let r = run_pieces(
            &rx,
            20,
            &mut |_, _| Err(io::Error::other("EIO")),
            &mut |t| done.push(t),
        );
        assert!(r.is_err());
        assert_eq!(done, [4, 5]);
        tx.send(None).unwrap();
        assert!(run_pieces(&rx, 20, &mut |_, _| Ok(()), &mut |_| ()).is_err());
    }

    #[test]
    fn large_reply_buffers_are_reused_without_refill_and_bounded() {
        let pool = ReplyBuffers::default();
        let mut a = pool.take(1 << 20);
        a.fill(0xAB);
        let ptr = a.as_ptr();
        pool.give_back(a);
        assert_eq!(pool.idle(), 1);
        // A smaller request reuses the same allocation; its bytes are not re-zeroed.
        let b = pool.take((1 << 20) - 4096);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(b.len(), (1 << 20) - 4096);
        assert!(b.iter().all(|&x| x == 0xAB));
        assert_eq!(pool.idle(), 0);
        // A larger one cannot use it.
        pool.give_back(b);
        let c = pool.take(1 << 20);
        assert_ne!(c.as_ptr(), ptr);
        assert_eq!(c.len(), 1 << 20);
        // Small and huge replies are not kept; at most RECYCLED_BUFFERS are.
        pool.give_back(vec![0; 4096]);
        pool.give_back(vec![0; RECYCLE_MAX_BYTES + 1]);
        assert_eq!(pool.idle(), 1);
        for _ in 0..10 {
            pool.give_back(vec![0; RECYCLE_MIN_BYTES]);
        }
        assert_eq!(pool.idle(), RECYCLED_BUFFERS);
    }
}
