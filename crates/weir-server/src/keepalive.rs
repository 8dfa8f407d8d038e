//! TCP keepalive, so that a peer that vanished without closing (a client host
//! that lost power or its network, a storage server that crashed) does not keep
//! its connections for ever: what they hold — connection slots, data budgets,
//! an exclusive lease (whose holder blocks every other writer of the volume), a
//! write that blocks a lease grant — comes back once the peer stops answering.
//!
//! [`enable`] with an idle time `T`: the first probe after `T` with nothing
//! received, then [`PROBES`] probes `T / PROBES` apart, so an idle connection
//! fails about `2 T` after its peer last answered. A live peer answers probes
//! from its kernel, so an idle but live connection (a VM's data disk untouched
//! for hours) is never closed.
//!
//! Probes go only on a connection with nothing unacknowledged and its peer's
//! window open. A peer that died with data on its way to it (replies the
//! server was sending: a busy VM's host) or after closing its window would be
//! given up by the kernel only after `net.ipv4.tcp_retries2` unanswered
//! retransmissions or window probes (about 15 minutes or more by default),
//! holding its exclusive lease all that time. [`PeerWatch`] bounds that case
//! alike: it reads the connection's `TCP_INFO` every probe interval and aborts
//! the connection once its peer has acknowledged nothing for
//! [`give_up_after`] (as long as keepalive lets an idle peer be silent) and
//! left its last [`UNANSWERED`] retransmissions or window probes in a row
//! unanswered. A live peer that stops reading (a zero window) answers every
//! window probe, which starts the kernel's count again, so it is never taken
//! for gone however long it reads nothing; the time alone could not tell, as
//! the probes back off and its answers come up to 2 minutes apart.
//! `TCP_USER_TIMEOUT` is not set: Linux applies it to a zero window as well
//! (since 5.11), probes answered or not, and would close such a live client;
//! the data budgets bound what it holds (docs/HARDENING.md).
//!
//! Like nbdkit's `--keepalive` and QEMU's NBD client (`keep-alive`, on by
//! default).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Keepalive probes before the connection is given up.
pub const PROBES: u32 = 6;
/// Largest idle time (Linux's bound on `TCP_KEEPIDLE`).
pub const MAX_IDLE_S: u32 = 32_767;
/// Retransmissions or window probes in a row that a peer must leave
/// unanswered (besides acknowledging nothing for [`give_up_after`]) to be
/// taken for gone. A live peer's answer starts the kernel's count again (an
/// ACK of new data, or of a window probe), so a live peer with its window
/// closed is at 1 at most, for the round trip of a probe.
pub const UNANSWERED: u8 = 2;

/// The idle time and the probe interval, in seconds, for `idle`.
fn timing(idle: Duration) -> (u32, u32) {
    let idle_s = idle.as_secs().clamp(1, MAX_IDLE_S as u64) as u32;
    (idle_s, idle_s.div_ceil(PROBES))
}

/// How long keepalive with idle time `idle` lets a peer answer nothing before
/// the connection fails: the idle time, then [`PROBES`] probe intervals.
pub fn give_up_after(idle: Duration) -> Duration {
    let (idle_s, interval_s) = timing(idle);
    Duration::from_secs(u64::from(idle_s + PROBES * interval_s))
}

fn set(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Turns keepalive on for the TCP socket `fd`: idle, it fails about `2 idle`
/// after its peer last answered (`idle` in whole seconds, 1 to [`MAX_IDLE_S`]).
pub fn enable(fd: RawFd, idle: Duration) -> io::Result<()> {
    let (idle_s, interval_s) = timing(idle);
    set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s as i32)?;
    set(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPINTVL,
        interval_s as i32,
    )?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, PROBES as i32)
}

/// What a connection's kernel knows of its peer's answers (`TCP_INFO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSilence {
    /// Since the peer's last acknowledgement (`tcpi_last_ack_recv`).
    pub since_ack: Duration,
    /// Retransmission timeouts in a row with nothing acknowledged
    /// (`tcpi_retransmits`).
    pub retransmits: u8,
    /// Window or keepalive probes in a row left unanswered (`tcpi_probes`).
    pub probes: u8,
    /// Segments sent and not acknowledged (`tcpi_unacked`).
    pub unacked_segments: u32,
}

impl PeerSilence {
    /// Reads it from the TCP socket `fd`.
    pub fn of(fd: RawFd) -> io::Result<PeerSilence> {
        // SAFETY: tcp_info is plain integers; all zeroes is a valid value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `info`, a live local.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PeerSilence {
            since_ack: Duration::from_millis(info.tcpi_last_ack_recv.into()),
            retransmits: info.tcpi_retransmits,
            probes: info.tcpi_probes,
            unacked_segments: info.tcpi_unacked,
        })
    }

    /// Whether the peer is gone: nothing acknowledged for `after`, and its
    /// last [`UNANSWERED`] retransmissions or window probes unanswered.
    pub fn gone(&self, after: Duration) -> bool {
        self.since_ack >= after && (self.retransmits >= UNANSWERED || self.probes >= UNANSWERED)
    }
}

impl std::fmt::Display for PeerSilence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its host acknowledged nothing for {:.1} s ({} retransmissions and {} probes \
             unanswered in a row, {} segments unacknowledged)",
            self.since_ack.as_secs_f64(),
            self.retransmits,
            self.probes,
            self.unacked_segments
        )
    }
}

/// Watches a connection's peer from a task of its own (nothing on the
/// connection's I/O path): looks every probe interval, and once the peer is
/// gone ([`PeerSilence::gone`] after [`give_up_after`]`(idle)`) aborts the
/// connection ([`abort`]), so that whatever waits on it ends and gives back
/// what it holds. Dropping it stops the watch, after which the socket is
/// never touched again: drop it before the socket can close.
#[derive(Debug)]
pub struct PeerWatch {
    socket: std::sync::Arc<std::sync::Mutex<Option<RawFd>>>,
    task: tokio::task::AbortHandle,
}

impl PeerWatch {
    /// Starts watching the TCP socket `fd` (keepalive idle time `idle`) of
    /// the connection from `peer` (for the log). Needs a tokio runtime.
    pub fn start(fd: RawFd, idle: Duration, peer: std::net::SocketAddr) -> PeerWatch {
        let socket = std::sync::Arc::new(std::sync::Mutex::new(Some(fd)));
        let watched = socket.clone();
        let after = give_up_after(idle);
        let every = Duration::from_secs(timing(idle).1.into());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let silence = {
                    let socket = watched.lock().unwrap_or_else(|e| e.into_inner());
                    let Some(fd) = *socket else { return };
                    match PeerSilence::of(fd) {
                        Ok(silence) if silence.gone(after) => {
                            // SAFETY: `fd` stays open while it is in `socket`,
                            // whose lock is held (see `Drop`).
                            unsafe { abort(fd) };
                            silence
                        }
                        Ok(_) => continue,
                        // Not a TCP socket: nothing to watch.
                        Err(_) => return,
                    }
                };
                tracing::info!(%peer, "closing connection: {silence}");
                return;
            }
        });
        PeerWatch {
            socket,
            task: task.abort_handle(),
        }
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        // Once taken (under the lock the watch holds while it uses the
        // socket), the socket is never used again, even by a watch still
        // running on another thread.
        self.socket.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.task.abort();
    }
}

/// Ends the connection of the TCP socket `fd` whose peer is gone: every read
/// and write on it ends now (both directions shut), and closing it resets it
/// (`SO_LINGER` 0) instead of leaving the kernel retransmitting to nobody.
///
/// # Safety
/// `fd` must be an open socket for the whole call.
pub unsafe fn abort(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads `size_of::<linger>()` bytes from a live local;
    // shutdown(2) passes no memory; the caller keeps `fd` open.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn get(fd: RawFd, level: libc::c_int, name: libc::c_int) -> i32 {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into a live local.
        let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut len) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        v
    }

    #[test]
    fn the_socket_gets_the_idle_time_and_probes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fd = s.as_raw_fd();
        assert_eq!(get(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        enable(fd, Duration::from_secs(60)).unwrap();
        assert_eq!(get(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 60);
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 10);
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 6);
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 0);
        // Out-of-range idle times are brought into the kernel's range.
        enable(fd, Duration::from_millis(10)).unwrap();
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 1);
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 1);
        enable(fd, Duration::from_secs(1 << 40)).unwrap();
        assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 32_767);
    }

    #[test]
    fn a_peer_is_given_as_long_as_keepalive_gives_an_idle_one() {
        assert_eq!(
            give_up_after(Duration::from_secs(60)),
            Duration::from_secs(120)
        );
        // 1 s idle, then 6 probes 1 s apart.
        assert_eq!(
            give_up_after(Duration::from_secs(1)),
            Duration::from_secs(7)
        );
        assert_eq!(
            give_up_after(Duration::from_millis(10)),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn a_peer_is_gone_only_when_silent_and_asked_twice_in_vain() {
        let after = Duration::from_secs(120);
        let s = |since_ack_s: u64, retransmits: u8, probes: u8| PeerSilence {
            since_ack: Duration::from_secs(since_ack_s),
            retransmits,
            probes,
            unacked_segments: 0,
        };
        // Retransmissions or window probes unanswered, for long enough.
        assert!(s(120, 2, 0).gone(after));
        assert!(s(300, 0, 2).gone(after));
        // A live client with its window closed: each probe answered (the
        // count starts again), however far apart its ACKs are.
        assert!(!s(300, 0, 0).gone(after));
        assert!(!s(300, 0, 1).gone(after));
        // Not silent for long enough.
        assert!(!s(119, 5, 0).gone(after));
        assert!(!s(119, 0, 5).gone(after));
    }

    #[test]
    fn a_live_connection_shows_its_peers_answers() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        use std::io::{Read as _, Write as _};
        s.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        peer.read_exact(&mut buf).unwrap();
        let silence = PeerSilence::of(s.as_raw_fd()).unwrap();
        assert!(silence.since_ack < Duration::from_secs(5), "{silence}");
        assert_eq!((silence.retransmits, silence.probes), (0, 0));
        assert!(!silence.gone(give_up_after(Duration::from_secs(1))));
        // Not a TCP socket: no TCP_INFO (the watch then never ends a connection).
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(PeerSilence::of(udp.as_raw_fd()).is_err());
    }
}
