//! `weir serve`: the NBD storage server, on a config file or the embedded default.

use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use weir_server::WeirConfig;
use weir_server::config::TlsMode;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML config (listen addresses, data directory, connection and memory limits,
    /// pools, volumes, policies, access groups; see the README). Without it Weir
    /// serves an embedded default with five demo volumes.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (volumes and metadata); overrides the config's
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// NBD listen address; overrides the config's (default 127.0.0.1:10809)
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Admin API listen address; overrides the config's (default 127.0.0.1:10810)
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// NBD over TLS: off, on (offered) or require; overrides the config's `tls`
    #[arg(long, value_name = "MODE", value_parser = TlsMode::parse)]
    tls: Option<TlsMode>,
    /// PEM server certificate (chain); overrides `tls_cert`
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of the certificate; overrides `tls_key`
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// PEM CA whose client certificates are accepted (subject CN = identity); overrides `tls_client_ca`
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
}

/// Volumes listed at start (a pool of thousands of clones printed them all).
const STARTUP_VOLUMES_SHOWN: usize = 20;
pub fn run(args: ServeArgs) -> Result<()> {
    limit_malloc_arenas();
    let mut config = match &args.config {
        Some(path) => WeirConfig::load(path)?,
        None => WeirConfig::embedded_default(),
    };
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(addr) = args.listen {
        config.listen = addr;
    }
    if let Some(addr) = args.admin_listen {
        config.admin_listen = addr;
    }
    if let Some(mode) = args.tls {
        config.tls = mode;
    }
    if let Some(path) = args.tls_cert {
        config.tls_cert = Some(path);
    }
    if let Some(path) = args.tls_key {
        config.tls_key = Some(path);
    }
    if let Some(path) = args.tls_client_ca {
        config.tls_client_ca = Some(path);
    }
    config
        .check_tls()
        .map_err(|(_, message)| anyhow::anyhow!(message))?;
    let (nbd, admin) = (config.listen, config.admin_listen);
    let overlap =
        nbd.ip() == admin.ip() || nbd.ip().is_unspecified() || admin.ip().is_unspecified();
    // Under socket activation the configured addresses are not what is served.
    let activated = weir_server::systemd::socket_activated();
    if !activated && nbd.port() != 0 && nbd.port() == admin.port() && overlap {
        bail!(
            "listen ({nbd}) and admin_listen ({admin}) are the same port: NBD and the admin \
             API need one each (defaults 10809 and 10810)"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads())
        .max_blocking_threads(config.blocking_threads())
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        // Before the listeners exist: a SIGTERM from then on stops cleanly.
        let mut signals = weir_server::server::StopSignals::install()
            .context("installing the SIGINT/SIGTERM handlers")?;
        let data_dir = config.data_dir.clone();
        let scheme = if config.tls == TlsMode::Off {
            "nbd"
        } else {
            "nbds"
        };
        // Through a vtable: the server's futures are compiled in weir-server at full
        // optimisation, not here (this crate is built at opt-level 0).
        let server = weir_server::start_boxed(config).await?;
        let admin = weir_server::admin::Client::new(server.admin_addr())
            .with_token(server.admin_token());
        let volumes = admin.list_volumes().await.unwrap_or_default();
        outln!(
            "weir serving NBD on {}, admin API on http://{}",
            listening(server.nbd_addr()),
            listening(server.admin_addr())
        );
        // URLs that work from this machine (a wildcard address is no URL).
        let nbd = usable(server.nbd_addr());
        outln!("data directory: {}", data_dir.display());
        outln!(
            "admin token: {} (the weir CLI reads it; or WEIR_ADMIN_TOKEN)",
            weir_server::admin_auth::token_path(&data_dir).display()
        );
        if !volumes.is_empty() {
            outln!("volumes:");
            for v in volumes.iter().take(STARTUP_VOLUMES_SHOWN) {
                outln!(
                    "  {scheme}://{nbd}/{:<16} {:>10}  {}",
                    v.name,
                    crate::admin::human_size(v.size_bytes),
                    v.policy
                );
            }
            if let Some(more) = volumes.len().checked_sub(STARTUP_VOLUMES_SHOWN + 1) {
                outln!("  … and {} more (weir volume list)", more + 1);
            }
            if scheme == "nbd" {
                outln!(
                    "try: nbdinfo nbd://{nbd}/{}   or   qemu-img info nbd://{nbd}/{}",
                    volumes[0].name, volumes[0].name
                );
            } else {
                outln!(
                    "try: nbdinfo 'nbds://{nbd}/{}?tls-certificates=DIR' (DIR: ca-cert.pem, client-cert.pem, client-key.pem)",
                    volumes[0].name
                );
            }
        }
        outln!("Ctrl-C (or SIGTERM) stops cleanly.");
        use std::io::Write as _;
        std::io::stdout().flush().ok();
        // systemd (Type=notify): serving now.
        let status = format!("READY=1\nSTATUS=serving NBD on {nbd}, {} volumes", volumes.len());
        if let Err(e) = weir_server::systemd::notify(&status) {
            tracing::warn!("sd_notify READY: {e}");
        }
        let signal = signals.recv().await;
        let _ = weir_server::systemd::notify("STOPPING=1");
        errln!(
            "{signal}: stopping: finishing in-flight requests, syncing data… \
             (again to exit at once)"
        );
        tokio::select! {
            stopped = weir_server::shutdown_boxed(server) => stopped,
            again = signals.recv() => {
                // A backend that never answers (a stopped OSD, a hung disk) would
                // hold the clean stop for ever: the second signal ends it as a
                // crash would, which loses nothing a FLUSH acknowledged.
                errln!(
                    "{again} again: exiting now, without the requests still in progress \
                     (as after a crash: what a FLUSH acknowledged is on disk)"
                );
                std::process::exit(1)
            }
        }
    })
}

/// glibc gives each new thread (tokio's blocking pool starts and ends them) an
/// arena of its own, up to 8 per CPU, and each keeps the high-water mark of the
/// transient buffers it served: 1,000,000 fuzzed sessions left 14 arenas holding
/// 14-32 MB each on 2 CPUs (RSS 515 MB, `malloc_trim` gave back only 78 MB).
/// One arena per CPU (at least 2) bounds that, and still gives every thread that
/// can run at once an arena of its own, so allocation does not contend on a lock
/// more than with glibc's default (`MALLOC_ARENA_MAX` still wins when set). On 2
/// CPUs: 1,000,000 fuzzed sessions then peaked at 137 MB (docs/HARDENING.md).
/// A listening address as the banner says it: a wildcard one is every address.
fn listening(addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("{addr} (every address)")
    } else {
        addr.to_string()
    }
}

/// An address a URL on this machine can use: the loopback one for a wildcard.
fn usable(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let arenas = cpus.clamp(2, 256) as libc::c_int;
        // SAFETY: mallopt only sets an allocator parameter; called before the
        // server starts any thread.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

#[cfg(test)]
mod banner_tests {
    use super::*;

    #[test]
    fn wildcard_addresses_are_not_shown_as_urls() {
        let any4: std::net::SocketAddr = "0.0.0.0:10809".parse().unwrap();
        let any6: std::net::SocketAddr = "[::]:10809".parse().unwrap();
        let one: std::net::SocketAddr = "10.0.0.5:10809".parse().unwrap();
        assert_eq!(usable(any4).to_string(), "127.0.0.1:10809");
        assert_eq!(usable(any6).to_string(), "[::1]:10809");
        assert_eq!(usable(one), one);
        assert_eq!(listening(any4), "0.0.0.0:10809 (every address)");
        assert_eq!(listening(one), "10.0.0.5:10809");
    }
}
