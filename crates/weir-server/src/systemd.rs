//! systemd integration without libsystemd: socket activation (`LISTEN_FDS`, the
//! listeners systemd opened and passes as descriptors 3, 4, …) and readiness
//! notification (`sd_notify`: a datagram to `$NOTIFY_SOCKET`).

use std::net::TcpListener;
use std::os::fd::FromRawFd;

use anyhow::{Context, bail};

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// Listeners passed by systemd, by role.
#[derive(Debug, Default)]
pub struct Inherited {
    pub nbd: Option<TcpListener>,
    pub admin: Option<TcpListener>,
}

/// Takes the listening sockets systemd passed to this process: `LISTEN_PID`
/// must be ours; `LISTEN_FDNAMES` (`FileDescriptorName=` of the socket units)
/// says which is `nbd` and which `admin`; without names the first is NBD and
/// the second the admin API. None passed: both `None`.
pub fn inherited_listeners() -> anyhow::Result<Inherited> {
    // Once per process: a second server started here must not adopt them again.
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(count) = passed_fd_count()? else {
        return Ok(Inherited::default());
    };
    if TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Ok(Inherited::default());
    };
    let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
        .map(|n| n.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    let mut out = Inherited::default();
    for i in 0..count {
        let fd = LISTEN_FDS_START + i;
        let role = match names.get(i as usize).map(String::as_str) {
            Some(name) if !name.is_empty() && name != "unknown" => name.to_string(),
            _ => ["nbd", "admin"].get(i as usize).unwrap_or(&"?").to_string(),
        };
        let listener = listener_from_fd(fd)
            .with_context(|| format!("LISTEN_FDS: descriptor {fd} ({role})"))?;
        match role.as_str() {
            "nbd" if out.nbd.is_none() => out.nbd = Some(listener),
            "admin" if out.admin.is_none() => out.admin = Some(listener),
            _ => bail!(
                "LISTEN_FDS: descriptor {fd} is named {role:?}; expected one \"nbd\" and one \"admin\" (FileDescriptorName=)"
            ),
        }
    }
    Ok(out)
}

/// Whether systemd passed this process listening sockets (the configured
/// addresses of those it passed are not used).
pub fn socket_activated() -> bool {
    passed_fd_count().is_ok_and(|n| n.is_some_and(|n| n > 0))
}

/// `LISTEN_FDS` if `LISTEN_PID` is this process.
fn passed_fd_count() -> anyhow::Result<Option<i32>> {
    let (Ok(pid), Ok(fds)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let n = fds
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|n| (0..=2).contains(n))
        .with_context(|| {
            format!("LISTEN_FDS={fds:?}: weir takes at most 2 sockets (nbd, admin)")
        })?;
    Ok(Some(n))
}

/// A TCP listener from a passed descriptor (checked to be a listening stream
/// socket), close-on-exec and non-blocking.
fn listener_from_fd(fd: i32) -> anyhow::Result<TcpListener> {
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes an int into `kind`; a bad fd only fails.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || kind != libc::SOCK_STREAM {
        bail!("not a stream socket (ListenStream= in the socket unit)");
    }
    // SAFETY: systemd passed us this descriptor to own; nothing else uses it.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Sends `state` (e.g. `READY=1`) to the service manager if `$NOTIFY_SOCKET`
/// names one (a path, or `@name` for an abstract socket); otherwise nothing.
pub fn notify(state: &str) -> std::io::Result<()> {
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Ok(target) = std::env::var("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let addr = match target.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(&target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}
