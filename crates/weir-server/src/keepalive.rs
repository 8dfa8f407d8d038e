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
//! Probes go only on a connection with nothing unacknowledged. A peer that died
//! with data on its way to it (replies the server was sending) is given up by
//! the kernel's retransmission limit instead (`net.ipv4.tcp_retries2`, about
//! 15 minutes by default). `TCP_USER_TIMEOUT` would shorten that, but Linux
//! applies it to a zero window as well (since 5.11): it would also close a
//! live client that stops reading its replies for that long, which the data
//! budgets already bound (docs/HARDENING.md), so it is not set.
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
    let idle_s = idle.as_secs().clamp(1, MAX_IDLE_S as u64) as u32;
    let interval_s = idle_s.div_ceil(PROBES);
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
}
