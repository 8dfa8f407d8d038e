//! `weir volume …` and `weir policy …`: clients of a running server's admin API.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::path::PathBuf;
use weir_qos::{Policy, ServiceLevel, Shares};
use weir_report::{Column, Table};
use weir_server::VolumeCreate;
use weir_server::admin::{Client, ClientError, CloneRequest};
use weir_server::admin_auth::{TOKEN_ENV, read_token_file, token_path};
use weir_server::config::AccessGroupConfig;
use weir_server::thin::SnapshotRecord;

use crate::target::{AdminEndpoint, confirm, parse_admin, parse_size_arg};

/// Where the admin API listens unless `--admin` or `WEIR_ADMIN` says otherwise.
const DEFAULT_ADMIN: &str = "127.0.0.1:10810";

#[derive(clap::Args)]
pub struct AdminTarget {
    /// Admin API of the running server: HOST[:PORT], http://HOST[:PORT] or [IPv6]:PORT
    /// (port 10810 if absent; host names are resolved and sent as Host, see admin_hosts)
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "WEIR_ADMIN",
        default_value = DEFAULT_ADMIN
    )]
    admin: String,
    /// Print JSON instead of tables (and no "server:" line on standard error)
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Set from [`Confirm`] by the commands that have destructive subcommands.
    #[arg(skip)]
    yes: bool,
    /// File holding the admin token (default: $WEIR_ADMIN_TOKEN, else the admin-token file of
    /// --data-dir)
    #[arg(long, global = true, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// The server's data directory, whose admin-token file the CLI reads (default: the
    /// server's default, $XDG_DATA_HOME/weir or ~/.local/share/weir)
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl AdminTarget {
    pub fn json(&self) -> bool {
        self.json
    }
    pub fn yes(&self) -> bool {
        self.yes
    }
    /// The target with the answer of `--yes` (only `volume`, `policy` and
    /// `access-group` take it: `top` and `pool` delete nothing).
    pub fn confirmed(mut self, confirm: Confirm) -> AdminTarget {
        self.yes = confirm.yes;
        self
    }
}

/// `--yes`, for the commands with destructive subcommands.
#[derive(clap::Args)]
pub struct Confirm {
    /// Answer yes to the confirmation of destructive commands (volume, policy and
    /// access-group delete, delete-snapshot, rollback, takeover, break-lease);
    /// without it they ask on a terminal and refuse otherwise
    #[arg(long, short = 'y', global = true)]
    yes: bool,
}

/// A client of the endpoint `--admin` names, with the token from
/// `--admin-token-file`, `$WEIR_ADMIN_TOKEN`, or the `admin-token` file of
/// `--data-dir` (default: the server's default data directory).
pub(crate) fn admin_client(target: &AdminTarget) -> Result<(Client, AdminEndpoint)> {
    let endpoint = parse_admin(&target.admin)?;
    let client = Client::new(endpoint.addr).with_host(endpoint.host_header.clone());
    if let Some(file) = &target.admin_token_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("--admin-token-file {}", file.display()))?;
        let token = text.trim();
        if token.is_empty() {
            bail!("--admin-token-file {} is empty", file.display());
        }
        check_token(token, &format!("--admin-token-file {}", file.display()))?;
        return Ok((client.with_token(token), endpoint));
    }
    if let Some(token) = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        check_token(token.trim(), &format!("${TOKEN_ENV}"))?;
        return Ok((client.with_token(token.trim()), endpoint));
    }
    let dir = target
        .data_dir
        .clone()
        .unwrap_or_else(weir_server::config::default_data_dir);
    match read_token_file(&dir) {
        Ok(token) => Ok((client.with_token(token), endpoint)),
        // Explicitly named: say why it cannot be read.
        Err(e) if target.data_dir.is_some() => Err(anyhow::anyhow!(
            "reading the admin token {}: {e}",
            token_path(&dir).display()
        )),
        // The server may run elsewhere: try without (a refusal explains itself).
        Err(_) => Ok((client, endpoint)),
    }
}

/// A token goes into an HTTP header: one word of visible ASCII. Anything else
/// (a second line, a space) is this side's mistake, said as such, not a
/// "malformed answer" from the server.
fn check_token(token: &str, source: &str) -> Result<()> {
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        bail!(
            "{source}: the token is one word of visible ASCII (the server's admin-token file \
             holds one line); this holds spaces, more lines or other characters"
        );
    }
    Ok(())
}

/// Says on standard error which server answers (unless `--json`): its URL,
/// version, commit, host name and uptime. A server that cannot be reached or
/// refuses the token fails the command here, before anything is changed.
pub(crate) async fn announce(client: &Client, endpoint: &AdminEndpoint, json: bool) -> Result<()> {
    match client.server_info().await {
        Ok(info) => {
            if !json {
                errln!(
                    "server: {} (weir {}, commit {}, host {}, up {:.0} s, {} volumes)",
                    endpoint.url,
                    info.version,
                    info.commit,
                    info.hostname,
                    info.uptime_seconds,
                    info.volumes
                );
            }
            Ok(())
        }
        // A server older than /v1/server: it cannot say more.
        Err(ClientError::Api { status: 404, .. }) => {
            if !json {
                errln!("server: {} (an older weir)", endpoint.url);
            }
            Ok(())
        }
        Err(e) => Err(explain(e)),
    }
}

/// Warns on standard error when `pool` promises more than its disk can still hold.
async fn warn_overcommit(client: &Client, pool: &str) {
    let Ok(pools) = client.capacity().await else {
        return;
    };
    for p in pools.iter().filter(|p| p.name == pool && p.overcommitted) {
        errln!(
            "warning: pool {:?} is overcommitted: its volumes total {}, {} of it allocated, {} free on its file system (writing them full would fail; see `weir pool list`)",
            p.name,
            human_size(p.provisioned_bytes),
            human_size(p.allocated_bytes),
            human_size(p.free_bytes)
        );
    }
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a volume (a sparse file in a pool, or an RBD image in an RBD pool)
    Create {
        /// The volume's name (letters, digits, '-', '_', '.')
        name: String,
        /// Size with a unit: 20G or 20GiB (2^30 bytes), 20GB (10^9), 512M, 4K, 1T; 4096B for
        /// bytes (a bare number is refused)
        #[arg(long, value_parser = parse_size_arg)]
        size: u64,
        /// Policy name (built-in: mission-critical, business-critical, business-critical-2,
        /// non-critical, non-critical-2; or a user-defined one)
        #[arg(long, default_value = "non-critical")]
        policy: String,
        /// Hosts allowed to see and open it: addresses or CIDRs, comma-separated (default:
        /// any). Kept in the access group NAME-hosts, made for it (an existing one is used
        /// only if it has the same members)
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// TLS client identities (certificate subject CNs) it also requires, comma-separated
        /// (the server needs tls_client_ca); without --hosts, from any host
        #[arg(long, value_delimiter = ',')]
        identities: Vec<String>,
        /// Pool (default: the server's first pool)
        #[arg(long, value_name = "POOL")]
        pool: Option<String>,
        /// Export it read-only
        #[arg(long)]
        read_only: bool,
        /// `flash`: read through the pool's flash cache (the pool needs flash_cache)
        #[arg(long, value_parser = parse_cache_arg, default_value = "none")]
        cache: weir_server::flash_cache::VolumeCache,
    },
    /// List volumes
    List,
    /// Show one volume
    Show {
        /// The volume (or VOLUME@SNAPSHOT)
        name: String,
    },
    /// Grow a volume (shrinking is refused)
    Resize {
        /// The volume
        name: String,
        /// New size with a unit: 40G (GiB), 40GB (10^9 bytes), … (a bare number is refused)
        #[arg(long, value_parser = parse_size_arg)]
        size: u64,
    },
    /// Delete a volume and its data (asks first; --yes does not), and the access
    /// group `create --hosts` made for it (NAME-hosts) if no other volume is in it
    Delete {
        /// The volume
        name: String,
    },
    /// Change a volume's policy (applies to queued and new I/O at once)
    SetPolicy {
        /// The volume
        name: String,
        /// The policy (built-in or user-defined)
        policy: String,
    },
    /// Switch a volume's flash read cache on (`flash`) or off (`none`), at once
    SetCache {
        /// The volume
        name: String,
        /// `flash` or `none`
        #[arg(value_parser = parse_cache_arg)]
        cache: weir_server::flash_cache::VolumeCache,
    },
    /// I/O counters since start; with --interval, the rates over each interval,
    /// repeated until Ctrl-C (or --count reports)
    Stats {
        /// The volume
        name: String,
        /// Report the rates over this many seconds (0.1-86400), again and again
        #[arg(long, value_name = "SECONDS", conflicts_with = "since", value_parser = parse_refresh_seconds)]
        interval: Option<f64>,
        /// With --interval: stop after this many reports
        #[arg(long, value_name = "N", requires = "interval")]
        count: Option<u64>,
        /// History instead: the last DURATION (90s, 15m, 1h, 7d; at most 30d) from the
        /// server's history store, about 60 rows
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
    },
    /// Take a snapshot of a thin or RBD volume (read-only, exported as VOLUME@SNAPSHOT)
    Snapshot {
        /// A volume in a pool with format = "thin"
        volume: String,
        /// The snapshot's name
        snapshot: String,
    },
    /// List snapshots (of one volume, or of all)
    Snapshots {
        /// Only this volume's
        volume: Option<String>,
    },
    /// Delete a snapshot (refused while linked clones read from it; asks first)
    DeleteSnapshot {
        /// The volume
        volume: String,
        /// The snapshot
        snapshot: String,
    },
    /// Return a volume to a snapshot (writes since the snapshot are lost; asks first)
    Rollback {
        /// The volume
        volume: String,
        /// The snapshot
        snapshot: String,
    },
    /// Create linked clones of a snapshot (writable volumes sharing its data)
    Clone {
        /// The snapshot, as VOLUME@SNAPSHOT
        source: String,
        /// The clone's name; with --count, the prefix of NAME-1 … NAME-N
        name: String,
        /// How many clones (named NAME-1 … NAME-N, zero-padded)
        #[arg(long)]
        count: Option<u32>,
        /// Policy (default: the source volume's)
        #[arg(long)]
        policy: Option<String>,
    },
    /// Copy what a clone reads from its snapshot into it (it becomes independent)
    Flatten {
        /// The linked clone
        volume: String,
    },
    /// Failover of an RBD volume to this server: break the RBD lock another gateway holds (it is fenced: blocklisted on the cluster, its further writes fail; asks first)
    Takeover {
        /// The volume (in a pool with backend = "rbd")
        volume: String,
    },
    /// Break the exclusive lease a caching gateway holds on this server's volume: its connections close, it may not take the lease again (its cache reads through), and other writers wait 2 s (asks first)
    BreakLease {
        /// The volume
        volume: String,
    },
    /// Verify every thin pool's maps, files and references
    Check,
    /// Replicate a thin volume to an NBD target: each cycle snapshots it and
    /// ships only the grains changed since the last replicated snapshot
    #[command(group(clap::ArgGroup::new("mode").required(true).args(["every", "once", "stop"])))]
    Replicate {
        /// A volume in a pool with format = "thin"
        name: String,
        /// nbd://HOST[:PORT]/EXPORT (another weir serve, nbdkit, qemu-nbd; at least the volume's size)
        #[arg(long, value_name = "URL", required_unless_present = "stop")]
        to: Option<String>,
        /// A cycle this often: 30s, 5m, 1h30m (again with the same --to: a new interval)
        #[arg(long, value_name = "DURATION")]
        every: Option<String>,
        /// One cycle now, waiting for it (the first is a full copy, later ones ship changes)
        #[arg(long)]
        once: bool,
        /// With --once: return without waiting for the cycle
        #[arg(long, requires = "once")]
        no_wait: bool,
        /// Stop replicating (the target keeps the last replicated snapshot's copy)
        #[arg(long, conflicts_with_all = ["to", "every", "once"])]
        stop: bool,
        /// The target holds data the first full copy may write over (without it,
        /// a target found holding data is refused before anything is written)
        #[arg(long, conflicts_with = "stop")]
        overwrite: bool,
    },
    /// Replications: target, lag (RPO), last cycle (of one volume, or all)
    Replications {
        /// Only this volume's
        volume: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Create a user-defined policy (refused if one has the name: `policy update` changes it)
    Create {
        /// The policy's name
        name: String,
        /// mission-critical, business-critical or non-critical (serves first under overload)
        #[arg(long, value_parser = parse_level)]
        service_level: Option<ServiceLevel>,
        /// IOPS guaranteed to each volume with the policy
        #[arg(long, value_name = "IOPS")]
        reservation_iops: Option<f64>,
        /// Bandwidth guaranteed to each volume, MB/s (10^6 bytes)
        #[arg(long, value_name = "MBPS")]
        reservation_mbps: Option<f64>,
        /// IOPS ceiling: 16 to 2147483647 (the top means unlimited)
        #[arg(long, value_name = "IOPS")]
        limit_iops: Option<f64>,
        /// Bandwidth ceiling, MB/s (10^6 bytes)
        #[arg(long, value_name = "MBPS")]
        limit_mbps: Option<f64>,
        /// low (500), normal (1000), high (2000) or 200-4000
        #[arg(long, default_value = "normal", value_parser = parse_shares)]
        shares: Shares,
        /// Latency the volume should see, ms (protection under contention)
        #[arg(long, value_name = "MS")]
        latency_target_ms: Option<f64>,
        /// Credit an idle volume may bank, in seconds of its rate
        #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
        burst_seconds: f64,
    },
    /// Change a user-defined policy live: every volume with it follows at once;
    /// figures not given stay, `none` removes one
    Update {
        /// The policy's name
        name: String,
        /// mission-critical, business-critical, non-critical or none
        #[arg(long, value_name = "LEVEL")]
        service_level: Option<String>,
        /// IOPS guaranteed to each volume, or none
        #[arg(long, value_name = "IOPS", value_parser = parse_setting)]
        reservation_iops: Option<Setting>,
        /// Bandwidth guaranteed to each volume, MB/s, or none
        #[arg(long, value_name = "MBPS", value_parser = parse_setting)]
        reservation_mbps: Option<Setting>,
        /// IOPS ceiling (16 to 2147483647), or none
        #[arg(long, value_name = "IOPS", value_parser = parse_setting)]
        limit_iops: Option<Setting>,
        /// Bandwidth ceiling, MB/s, or none
        #[arg(long, value_name = "MBPS", value_parser = parse_setting)]
        limit_mbps: Option<Setting>,
        /// low (500), normal (1000), high (2000) or 200-4000
        #[arg(long, value_parser = parse_shares)]
        shares: Option<Shares>,
        /// Latency target, ms, or none
        #[arg(long, value_name = "MS", value_parser = parse_setting)]
        latency_target_ms: Option<Setting>,
        /// Credit an idle volume may bank, in seconds of its rate
        #[arg(long, value_name = "SECONDS")]
        burst_seconds: Option<f64>,
    },
    /// List policies (built-in and user-defined)
    List,
    /// Show one policy
    Show {
        /// The policy's name
        name: String,
    },
    /// Delete a user-defined policy (built-ins cannot be deleted; asks first)
    Delete {
        /// The policy's name
        name: String,
    },
}

/// A figure of `policy update`: a number, or `none` to remove it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setting(Option<f64>);

fn parse_setting(text: &str) -> Result<Setting, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Setting(None));
    }
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| Setting(Some(v)))
        .ok_or_else(|| format!("expected a number or none, not {text:?}"))
}

fn parse_level(text: &str) -> Result<ServiceLevel, String> {
    ServiceLevel::ALL
        .into_iter()
        .find(|l| l.name() == text)
        .ok_or_else(|| format!("service level must be mission-critical, business-critical or non-critical, not {text:?}"))
}

fn parse_shares(text: &str) -> Result<Shares, String> {
    match text.to_ascii_lowercase().as_str() {
        "low" => Ok(Shares::LOW),
        "normal" => Ok(Shares::NORMAL),
        "high" => Ok(Shares::HIGH),
        n => n
            .parse::<u32>()
            .map_err(|_| format!("shares must be low, normal, high or 200-4000, not {text:?}"))
            .and_then(|v| Shares::new(v).map_err(|e| e.to_string())),
    }
}

pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A policy figure: whole numbers without decimals (`200`, `2,000`), others
/// as the reports write them.
fn opt(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.fract() == 0.0 => weir_report::fmt_thousands(x, 0),
        Some(x) => weir_report::fmt_number(x),
    }
}

/// Turns an admin client error into what a person needs to read.
pub fn explain(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Connect { .. } => {
            anyhow::anyhow!(
                "{e} (is `weir serve` running there? --admin URL or WEIR_ADMIN names another server)"
            )
        }
        ClientError::Api { status: 401, .. } => anyhow::anyhow!(
            "the admin API refused the token (or its absence): run the CLI where it can read the server's \
             data directory (--data-dir DIR if not the default), or give --admin-token-file FILE or \
             ${TOKEN_ENV}"
        ),
        ClientError::Api { message, .. } => anyhow::anyhow!(message),
        ClientError::Protocol(_) => anyhow::anyhow!(e),
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Seconds between refreshes (`top --delay`, `volume stats --interval`): 0.1 s
/// (faster only spins) to a day.
pub(crate) fn parse_refresh_seconds(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if (0.1..=86_400.0).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!("must be 0.1-86400 seconds, not {text}"))
    }
}

fn parse_cache_arg(
    text: &str,
) -> std::result::Result<weir_server::flash_cache::VolumeCache, String> {
    weir_server::flash_cache::VolumeCache::parse(text)
}

fn show_volume(json: bool, volume: weir_server::VolumeRecord) -> Result<()> {
    if json {
        print_json(&volume)
    } else {
        out!("{}", volume_table(&[volume]));
        Ok(())
    }
}

fn show_volumes(json: bool, volumes: &[weir_server::VolumeRecord]) -> Result<()> {
    if json {
        print_json(&volumes)
    } else {
        out!("{}", volume_table(volumes));
        Ok(())
    }
}

/// `NAME`, or `NAME-1` … `NAME-N` zero-padded to N's width.
fn clone_names(name: &str, count: Option<u32>) -> Result<Vec<String>> {
    match count {
        None => Ok(vec![name.to_string()]),
        Some(0) => bail!("--count must be at least 1"),
        Some(n) => {
            let width = n.to_string().len();
            Ok((1..=n).map(|i| format!("{name}-{i:0width$}")).collect())
        }
    }
}

fn show_snapshots(json: bool, snaps: &[SnapshotRecord]) -> Result<()> {
    if json {
        return print_json(&snaps);
    }
    let mut table = Table::new(vec![
        Column::left("snapshot"),
        Column::right("size"),
        Column::left("taken (UTC)"),
    ]);
    for s in snaps {
        table.add_row([
            s.export_name(),
            human_size(s.size_bytes),
            crate::history::utc(s.created_unix_s),
        ]);
    }
    out!("{table}");
    Ok(())
}

fn print_check(pools: &[weir_server::store::ThinPoolCheck]) {
    if pools.is_empty() {
        outln!("no thin pools");
    }
    for p in pools {
        outln!(
            "pool {}: {} layers, {} grains stored, {} zero grains, {} orphan files, {}",
            p.pool,
            p.layers,
            p.stored_grains,
            p.zero_grains,
            p.orphan_files.len(),
            if p.problems.is_empty() {
                "consistent".to_string()
            } else {
                format!("{} problems", p.problems.len())
            }
        );
        for problem in &p.problems {
            outln!("  problem: {problem}");
        }
    }
}

fn volume_table(volumes: &[weir_server::VolumeRecord]) -> Table {
    let mut table = Table::new(vec![
        Column::left("volume"),
        Column::left("pool"),
        Column::right("size"),
        Column::left("policy"),
        Column::left("access groups"),
        Column::left("mode"),
    ]);
    for v in volumes {
        let groups = if v.access_groups.is_empty() {
            "any host".to_string()
        } else {
            v.access_groups.join(",")
        };
        let mut mode = if v.read_only { "ro" } else { "rw" }.to_string();
        if v.cache == weir_server::flash_cache::VolumeCache::Flash {
            mode.push_str(", flash cache");
        }
        if let Some(l) = &v.exclusive_lease {
            let conns = if l.connections == 1 {
                "connection"
            } else {
                "connections"
            };
            mode.push_str(&format!(
                ", leased to {} ({} {conns})",
                l.holder, l.connections
            ));
        }
        table.add_row([
            v.name.clone(),
            v.pool.clone(),
            human_size(v.size_bytes),
            v.policy.clone(),
            groups,
            mode,
        ]);
    }
    table
}

/// `weir volume create`: with `--hosts`/`--identities`, first the access group
/// `NAME-hosts` the volume is then created in. An existing group of that name is
/// used only if it says the same (never rewritten: other volumes may be in it), and
/// a group made here is removed again if the volume cannot be created.
async fn create_volume(
    client: &Client,
    json: bool,
    mut req: VolumeCreate,
    hosts: Vec<String>,
    identities: Vec<String>,
) -> Result<()> {
    let mut made_group = None;
    if !hosts.is_empty() || !identities.is_empty() {
        let hosts = if hosts.is_empty() {
            vec!["*".to_string()]
        } else {
            hosts
        };
        let group = AccessGroupConfig {
            name: format!("{}-hosts", req.name),
            hosts,
            identities,
        };
        match client.show_access_group(&group.name).await {
            Ok(existing) if existing == group => {}
            Ok(existing) => bail!(
                "access group {:?} exists with other members (hosts {:?}, identities {:?}); \
                 change or delete it first (weir access-group …)",
                group.name,
                existing.hosts,
                existing.identities
            ),
            Err(ClientError::Api { status: 404, .. }) => {
                client.put_access_group(&group).await.map_err(explain)?;
                made_group = Some(group.name.clone());
            }
            Err(e) => return Err(explain(e)),
        }
        req.access_groups.push(group.name);
    }
    let v = match client.create_volume(&req).await {
        Ok(v) => v,
        Err(e) => {
            if let Some(group) = made_group {
                let _ = client.delete_access_group(&group).await;
            }
            return Err(explain(e));
        }
    };
    warn_overcommit(client, &v.pool).await;
    show_volume(json, v)
}

/// The access group `volume create --hosts` makes (`NAME-hosts`), deleted with
/// its volume when no other volume is in it; its name if it was.
async fn drop_implicit_group(client: &Client, v: &weir_server::VolumeRecord) -> Option<String> {
    let group = format!("{}-hosts", v.name);
    if !v.access_groups.contains(&group) {
        return None;
    }
    let volumes = client.list_volumes().await.ok()?;
    if volumes.iter().any(|o| o.access_groups.contains(&group)) {
        return None;
    }
    client.delete_access_group(&group).await.ok()?;
    Some(group)
}

/// `weir volume clone VOLUME@SNAPSHOT NAME [--count N]`: a long run of clones is
/// summed up in one line (all of them with `--json`).
async fn clone_volumes(
    client: &Client,
    json: bool,
    source: &str,
    name: &str,
    count: Option<u32>,
    policy: Option<String>,
) -> Result<()> {
    let Some((volume, snapshot)) = source.split_once('@') else {
        bail!("the source must be VOLUME@SNAPSHOT, not {source:?}");
    };
    // In requests the admin API's body limit (2 MiB) takes whatever the names'
    // length; each is one catalog write.
    const CLONES_PER_REQUEST: usize = 10_000;
    let names = clone_names(name, count)?;
    let mut vs = Vec::with_capacity(names.len());
    for chunk in names.chunks(CLONES_PER_REQUEST) {
        let req = CloneRequest {
            names: chunk.to_vec(),
            policy: policy.clone(),
        };
        match client.clone_snapshot(volume, snapshot, &req).await {
            Ok(mut made) => vs.append(&mut made),
            Err(e) if vs.is_empty() => return Err(explain(e)),
            Err(e) => {
                return Err(explain(e).context(format!(
                    "{} of the {} clones were created ({} … {}) before this",
                    vs.len(),
                    names.len(),
                    names[0],
                    names[vs.len() - 1]
                )));
            }
        }
    }
    if let Some(v) = vs.first() {
        warn_overcommit(client, &v.pool).await;
    }
    if json || vs.len() <= 20 {
        return show_volumes(json, &vs);
    }
    outln!(
        "created {} clones of {source}: {} … {}",
        vs.len(),
        vs[0].name,
        vs[vs.len() - 1].name
    );
    Ok(())
}

/// `weir volume takeover`: fences the gateway holding the RBD volume's lock.
async fn take_over(
    client: &Client,
    endpoint: &AdminEndpoint,
    target: &AdminTarget,
    volume: &str,
) -> Result<()> {
    confirm(
        target.yes,
        &format!(
            "Take volume {volume:?} over on {}? The gateway holding its RBD lock is fenced: its further writes fail.",
            endpoint.url
        ),
    )?;
    let t = client.takeover(volume).await.map_err(explain)?;
    if target.json {
        print_json(&t)?;
    } else if t.fenced.is_empty() {
        outln!("volume {volume}: no other gateway held its lock; served here");
    } else {
        outln!(
            "volume {volume}: taken over; fenced {}",
            t.fenced.join(", ")
        );
    }
    Ok(())
}

/// `weir volume break-lease`: disconnects the caching gateway holding the lease.
async fn break_lease(
    client: &Client,
    endpoint: &AdminEndpoint,
    target: &AdminTarget,
    volume: &str,
) -> Result<()> {
    confirm(
        target.yes,
        &format!(
            "Break the exclusive lease on volume {volume:?} at {}? The caching gateway holding it is disconnected and may not take it again.",
            endpoint.url
        ),
    )?;
    let b = client.break_lease(volume).await.map_err(explain)?;
    if target.json {
        print_json(&b)?;
    } else if let Some(holder) = &b.holder {
        outln!(
            "volume {volume}: lease broken; {holder} ({} connection(s)) disconnected",
            b.connections
        );
    } else {
        outln!("volume {volume}: nobody held its lease");
    }
    Ok(())
}

pub fn volume(target: AdminTarget, command: VolumeCommand) -> Result<()> {
    let (client, endpoint) = admin_client(&target)?;
    runtime()?.block_on(async {
        announce(&client, &endpoint, target.json).await?;
        match command {
            VolumeCommand::Create {
                name,
                size,
                policy,
                hosts,
                identities,
                pool,
                read_only,
                cache,
            } => {
                let req = VolumeCreate {
                    name,
                    size_bytes: size,
                    policy,
                    pool,
                    access_groups: Vec::new(),
                    read_only,
                    description: String::new(),
                    cache,
                };
                create_volume(&client, target.json, req, hosts, identities).await
            }
            VolumeCommand::List => {
                let vs = client.list_volumes().await.map_err(explain)?;
                show_volumes(target.json, &vs)
            }
            VolumeCommand::Show { name } => {
                let v = client.show_volume(&name).await.map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::Resize { name, size } => {
                let v = client.resize_volume(&name, size).await.map_err(explain)?;
                warn_overcommit(&client, &v.pool).await;
                show_volume(target.json, v)
            }
            VolumeCommand::Delete { name } => delete(&client, &endpoint, &target, &name).await,
            VolumeCommand::Snapshot { volume, snapshot } => {
                let s = client.snapshot(&volume, &snapshot).await.map_err(explain)?;
                show_snapshots(target.json, &[s])
            }
            VolumeCommand::Snapshots { volume } => {
                let s = client.snapshots(volume.as_deref()).await.map_err(explain)?;
                show_snapshots(target.json, &s)
            }
            VolumeCommand::DeleteSnapshot { volume, snapshot } => {
                delete_snapshot(&client, &endpoint, &target, &volume, &snapshot).await
            }
            VolumeCommand::Rollback { volume, snapshot } => {
                rollback(&client, &endpoint, &target, &volume, &snapshot).await
            }
            VolumeCommand::Clone {
                source,
                name,
                count,
                policy,
            } => clone_volumes(&client, target.json, &source, &name, count, policy).await,
            VolumeCommand::Flatten { volume } => {
                let v = client.flatten(&volume).await.map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::Takeover { volume } => {
                take_over(&client, &endpoint, &target, &volume).await
            }
            VolumeCommand::BreakLease { volume } => {
                break_lease(&client, &endpoint, &target, &volume).await
            }
            VolumeCommand::Check => check(&client, target.json).await,
            VolumeCommand::Replicate {
                name,
                to,
                every,
                once,
                no_wait,
                stop,
                overwrite,
            } => {
                let r = crate::replicate::Replicate {
                    name,
                    to,
                    every,
                    once,
                    overwrite,
                    no_wait,
                    stop,
                };
                crate::replicate::replicate(&client, target.json, r).await
            }
            VolumeCommand::Replications { volume } => {
                crate::replicate::list(&client, target.json, volume.as_deref()).await
            }
            VolumeCommand::SetCache { name, cache } => {
                let change = weir_server::VolumeUpdate {
                    cache: Some(cache),
                    ..Default::default()
                };
                let v = client
                    .update_volume(&name, &change)
                    .await
                    .map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::SetPolicy { name, policy } => {
                let v = client
                    .set_volume_policy(&name, &policy)
                    .await
                    .map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::Stats {
                name,
                since: Some(since),
                ..
            } => crate::history::print(&client, &name, &since, target.json).await,
            VolumeCommand::Stats {
                name,
                interval,
                count,
                since: None,
            } => stats(&client, target.json, &name, interval, count).await,
        }
    })
}

/// `weir volume delete`: asks (naming its size and pool), deletes it and the
/// access group `create --hosts` made for it.
async fn delete(
    client: &Client,
    endpoint: &AdminEndpoint,
    target: &AdminTarget,
    name: &str,
) -> Result<()> {
    let v = client.show_volume(name).await.map_err(explain)?;
    confirm(
        target.yes,
        &format!(
            "Delete volume {:?} ({}, pool {}) and all its data on {}?",
            v.name,
            human_size(v.size_bytes),
            v.pool,
            endpoint.url
        ),
    )?;
    let v = client.delete_volume(name).await.map_err(explain)?;
    let group = drop_implicit_group(client, &v).await;
    if target.json {
        return print_json(&v);
    }
    match group {
        Some(g) => outln!("deleted volume {} and its access group {g}", v.name),
        None => outln!("deleted volume {}", v.name),
    }
    Ok(())
}

/// `weir volume delete-snapshot`, after asking.
async fn delete_snapshot(
    client: &Client,
    endpoint: &AdminEndpoint,
    target: &AdminTarget,
    volume: &str,
    snapshot: &str,
) -> Result<()> {
    confirm(
        target.yes,
        &format!("Delete snapshot {volume}@{snapshot} on {}?", endpoint.url),
    )?;
    let s = client
        .delete_snapshot(volume, snapshot)
        .await
        .map_err(explain)?;
    if target.json {
        return print_json(&s);
    }
    outln!("deleted snapshot {}", s.export_name());
    Ok(())
}

/// `weir volume rollback`, after asking.
async fn rollback(
    client: &Client,
    endpoint: &AdminEndpoint,
    target: &AdminTarget,
    volume: &str,
    snapshot: &str,
) -> Result<()> {
    confirm(
        target.yes,
        &format!(
            "Return volume {volume:?} to snapshot {snapshot:?} on {}? Writes since the snapshot are lost.",
            endpoint.url
        ),
    )?;
    let v = client.rollback(volume, snapshot).await.map_err(explain)?;
    show_volume(target.json, v)
}

/// `weir volume check`: fails when any pool has problems.
async fn check(client: &Client, json: bool) -> Result<()> {
    let pools = client.check().await.map_err(explain)?;
    if json {
        print_json(&pools)?;
    } else {
        print_check(&pools);
    }
    if pools.iter().any(|p| !p.problems.is_empty()) {
        bail!("thin pool check found problems");
    }
    Ok(())
}

/// `volume stats`: since start, or the rates over each `interval` seconds,
/// repeated (`count` times, or until interrupted).
async fn stats(
    client: &Client,
    json: bool,
    name: &str,
    interval: Option<f64>,
    count: Option<u64>,
) -> Result<()> {
    let mut last = client.volume_stats(name).await.map_err(explain)?;
    let Some(secs) = interval else {
        let counters = last.counters.clone();
        let window_s = last.uptime_seconds;
        return print_stats(json, &last, None, &counters, window_s);
    };
    if count == Some(0) {
        bail!("--count must be at least 1");
    }
    let mut reports = 0;
    while count.is_none_or(|n| reports < n) {
        tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await;
        let now = client.volume_stats(name).await.map_err(explain)?;
        let (d, w) = interval_counters(&last, &now);
        print_stats(json, &now, Some(&last), &d, w)?;
        use std::io::Write as _;
        std::io::stdout().flush().ok();
        last = now;
        reports += 1;
    }
    Ok(())
}

/// The counters of the interval from `last` to `now`, and its seconds. A server
/// that restarted meanwhile (its uptime went back) counts from its start: its
/// counters as they are, over its uptime (the difference was a negative window,
/// "last -41.0 s", of zeros).
fn interval_counters(
    last: &weir_server::admin::VolumeStatsReport,
    now: &weir_server::admin::VolumeStatsReport,
) -> (weir_server::metrics::CounterSnapshot, f64) {
    if now.uptime_seconds < last.uptime_seconds {
        return (now.counters.clone(), now.uptime_seconds);
    }
    let d = weir_server::sampler::delta(&last.counters, &now.counters);
    (d, now.uptime_seconds - last.uptime_seconds)
}

/// `previous`: the report before this one (`--interval`), whose counters
/// `counters` already subtracts.
fn print_stats(
    json: bool,
    stats: &weir_server::admin::VolumeStatsReport,
    previous: Option<&weir_server::admin::VolumeStatsReport>,
    counters: &weir_server::metrics::CounterSnapshot,
    window_s: f64,
) -> Result<()> {
    if json {
        // One line per report: a stream of JSON documents.
        outln!("{}", serde_json::to_string(stats)?);
        return Ok(());
    }
    out!("{}", stats_table(stats, previous, counters, window_s));
    Ok(())
}

/// The table `volume stats` prints (see [`print_stats`]); the server's names shown
/// with their control characters as U+FFFD.
fn stats_table(
    stats: &weir_server::admin::VolumeStatsReport,
    previous: Option<&weir_server::admin::VolumeStatsReport>,
    counters: &weir_server::metrics::CounterSnapshot,
    window_s: f64,
) -> Table {
    let interval = previous.is_some();
    let per_s = |x: u64| {
        if window_s > 0.0 {
            x as f64 / window_s
        } else {
            0.0
        }
    };
    let mut table = Table::new(vec![Column::left("metric"), Column::right("value")]);
    let label = if interval {
        format!("last {window_s:.1} s")
    } else {
        format!("since start ({window_s:.0} s)")
    };
    table.add_row([
        "volume".to_string(),
        crate::top::printable(&format!("{} ({})", stats.volume.name, stats.volume.policy)),
    ]);
    table.add_row(["window".to_string(), label]);
    table.add_row([
        "IOPS".to_string(),
        weir_report::fmt_iops(per_s(counters.ios())),
    ]);
    table.add_row([
        "read IOPS".to_string(),
        weir_report::fmt_iops(per_s(counters.read_ios)),
    ]);
    table.add_row([
        "write IOPS".to_string(),
        weir_report::fmt_iops(per_s(counters.write_ios)),
    ]);
    table.add_row([
        "MB/s".to_string(),
        weir_report::fmt_mbps(
            per_s(counters.read_bytes.saturating_add(counters.write_bytes)) / 1e6,
        ),
    ]);
    table.add_row([
        "mean latency ms".to_string(),
        weir_report::fmt_ms(counters.mean_latency_ms()),
    ]);
    table.add_row([
        "QoS wait ms / request".to_string(),
        weir_report::fmt_ms(if counters.ios() == 0 {
            0.0
        } else {
            counters.qos_wait_ns as f64 / counters.ios() as f64 / 1e6
        }),
    ]);
    table.add_row(["errors".to_string(), counters.errors.to_string()]);
    table.add_row(["queued now".to_string(), stats.queued.to_string()]);
    table.add_row([
        "pool in flight / depth".to_string(),
        format!(
            "{} / {} (max {})",
            stats.pool.in_flight, stats.pool.depth_limit, stats.pool.max_in_flight
        ),
    ]);
    if let Some(now) = &stats.flash_cache {
        let before = previous
            .and_then(|p| p.flash_cache.clone())
            .unwrap_or_default();
        for row in flash_cache_rows(now, &before) {
            table.add_row(row);
        }
    }
    for row in stats
        .replication
        .iter()
        .flat_map(crate::replicate::stats_rows)
    {
        table.add_row(row);
    }
    table
}

/// `volume stats` rows of a cached volume: its hit ratio over the window
/// (`now` less `before`), and its pool's cache now.
fn flash_cache_rows(
    now: &weir_server::admin::VolumeFlashCacheReport,
    before: &weir_server::admin::VolumeFlashCacheReport,
) -> Vec<[String; 2]> {
    let hits = now.read_hits.saturating_sub(before.read_hits);
    let misses = now.read_misses.saturating_sub(before.read_misses);
    let ratio = if hits + misses == 0 {
        "- (no reads)".to_string()
    } else {
        format!(
            "{:.1} % ({hits} hits, {misses} misses)",
            100.0 * hits as f64 / (hits + misses) as f64
        )
    };
    let unowned = now
        .pool_unowned_reads
        .saturating_sub(before.pool_unowned_reads);
    vec![
        ["flash cache hit ratio".to_string(), ratio],
        [
            "flash cache resident / size (pool)".to_string(),
            format!(
                "{} / {}",
                human_size(now.pool_resident_bytes),
                human_size(now.pool_capacity_bytes)
            ),
        ],
        [
            "reads past the cache, no lease (pool)".to_string(),
            unowned.to_string(),
        ],
    ]
}

fn policy_table(policies: &[Policy]) -> Table {
    let mut table = Table::new(vec![
        Column::left("policy"),
        Column::left("service level"),
        Column::right("res IOPS"),
        Column::right("res MB/s"),
        Column::right("limit IOPS"),
        Column::right("limit MB/s"),
        Column::right("shares"),
        Column::right("latency ms"),
    ]);
    for p in policies {
        table.add_row([
            p.name.clone(),
            p.service_level
                .map(|l| l.name().to_string())
                .unwrap_or_else(|| "-".into()),
            opt(p.reservation_iops),
            opt(p.reservation_mbps),
            opt(p.effective_limit_iops()),
            opt(p.limit_mbps),
            p.shares.get().to_string(),
            opt(p.latency_target_ms),
        ]);
    }
    table
}

pub fn policy(target: AdminTarget, command: PolicyCommand) -> Result<()> {
    let (client, endpoint) = admin_client(&target)?;
    runtime()?.block_on(async {
        announce(&client, &endpoint, target.json).await?;
        let shown = match command {
            PolicyCommand::Create {
                name,
                service_level,
                reservation_iops,
                reservation_mbps,
                limit_iops,
                limit_mbps,
                shares,
                latency_target_ms,
                burst_seconds,
            } => {
                let policy = Policy {
                    name,
                    service_level,
                    reservation_iops,
                    reservation_mbps,
                    limit_iops,
                    limit_mbps,
                    shares,
                    latency_target_ms,
                    burst_seconds,
                };
                policy.validate()?;
                match client.create_policy(&policy).await {
                    Ok(p) => vec![p],
                    Err(ClientError::Api {
                        status: 409,
                        message,
                    }) => bail!("{message} (`weir policy update` changes it live)"),
                    Err(e) => return Err(explain(e)),
                }
            }
            PolicyCommand::Update { ref name, .. } => {
                let current = client.show_policy(name).await.map_err(explain)?;
                if weir_qos::PolicyCatalog::is_builtin(&current.name) {
                    bail!(
                        "policy {:?} is built in and cannot be changed (create one of your own and `weir volume set-policy` to it)",
                        current.name
                    );
                }
                let policy = updated_policy(current, command_changes(command))?;
                vec![client.update_policy(&policy).await.map_err(explain)?]
            }
            PolicyCommand::List => client.list_policies().await.map_err(explain)?,
            PolicyCommand::Show { name } => vec![client.show_policy(&name).await.map_err(explain)?],
            PolicyCommand::Delete { name } => {
                let p = client.show_policy(&name).await.map_err(explain)?;
                confirm(
                    target.yes,
                    &format!("Delete policy {:?} on {}?", p.name, endpoint.url),
                )?;
                let p = client.delete_policy(&name).await.map_err(explain)?;
                outln!("deleted policy {}", p.name);
                return Ok(());
            }
        };
        if target.json {
            print_json(&shown)
        } else {
            out!("{}", policy_table(&shown));
            Ok(())
        }
    })
}

/// The figures `policy update` was given (`None`: unchanged).
#[derive(Default)]
struct PolicyChanges {
    service_level: Option<String>,
    reservation_iops: Option<Setting>,
    reservation_mbps: Option<Setting>,
    limit_iops: Option<Setting>,
    limit_mbps: Option<Setting>,
    shares: Option<Shares>,
    latency_target_ms: Option<Setting>,
    burst_seconds: Option<f64>,
}

fn command_changes(command: PolicyCommand) -> PolicyChanges {
    match command {
        PolicyCommand::Update {
            service_level,
            reservation_iops,
            reservation_mbps,
            limit_iops,
            limit_mbps,
            shares,
            latency_target_ms,
            burst_seconds,
            ..
        } => PolicyChanges {
            service_level,
            reservation_iops,
            reservation_mbps,
            limit_iops,
            limit_mbps,
            shares,
            latency_target_ms,
            burst_seconds,
        },
        _ => PolicyChanges::default(),
    }
}

/// `current` with the changes applied (refused when nothing changes or the
/// result is invalid).
fn updated_policy(current: Policy, c: PolicyChanges) -> Result<Policy> {
    let mut p = current.clone();
    if let Some(level) = c.service_level {
        p.service_level = if level.eq_ignore_ascii_case("none") {
            None
        } else {
            Some(parse_level(&level).map_err(anyhow::Error::msg)?)
        };
    }
    let set = |field: &mut Option<f64>, s: Option<Setting>| {
        if let Some(Setting(v)) = s {
            *field = v;
        }
    };
    set(&mut p.reservation_iops, c.reservation_iops);
    set(&mut p.reservation_mbps, c.reservation_mbps);
    set(&mut p.limit_iops, c.limit_iops);
    set(&mut p.limit_mbps, c.limit_mbps);
    set(&mut p.latency_target_ms, c.latency_target_ms);
    if let Some(s) = c.shares {
        p.shares = s;
    }
    if let Some(b) = c.burst_seconds {
        p.burst_seconds = b;
    }
    if p == current {
        bail!(
            "policy update {:?}: no change given (--limit-iops, --reservation-iops, --shares, …; `none` removes a figure)",
            current.name
        );
    }
    p.validate()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_server::admin::VolumeStatsReport;

    /// A stats answer as a server (or a hostile one) sends it.
    fn report(name: &str, uptime_s: f64, reads: u64, bytes: u64) -> VolumeStatsReport {
        serde_json::from_value(serde_json::json!({
            "volume": {"id": 1, "name": name, "pool": "p", "size_bytes": 1, "policy": "gold"},
            "uptime_seconds": uptime_s,
            "counters": {"read_ios": reads, "write_ios": reads, "other_ios": reads,
                "read_bytes": bytes, "write_bytes": bytes, "errors": 0,
                "latency_sum_ns": u64::MAX, "latency_buckets": []},
            "mean_latency_ms": 0.0, "queued": 0, "reservation_dispatches": 0,
            "dispatched_ios": 0
        }))
        .unwrap()
    }

    /// Counters at the top of `u64` add up without overflow (a debug build
    /// panicked, a release build showed wrapped sums) and names cannot steer the
    /// terminal.
    #[test]
    fn hostile_stats_are_shown_not_obeyed() {
        let r = report("db\u{1b}[2J", 10.0, u64::MAX, u64::MAX);
        let text = stats_table(&r, None, &r.counters, 10.0).to_string();
        assert!(text.contains("db\u{FFFD}[2J (gold)"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
        assert_eq!(r.counters.ios(), u64::MAX);
    }

    /// `--interval` across a server restart counts from the new start: the
    /// difference was a negative window ("last -95.0 s") of zeros.
    #[test]
    fn an_interval_across_a_restart_counts_from_the_new_start() {
        let before = report("db", 100.0, 1_000, 0);
        let after = report("db", 5.0, 50, 0);
        let (d, w) = interval_counters(&before, &after);
        assert_eq!((d.read_ios, w), (50, 5.0));
        let later = report("db", 7.0, 80, 0);
        let (d, w) = interval_counters(&after, &later);
        assert_eq!((d.read_ios, w), (30, 2.0));
        let text = stats_table(&later, Some(&after), &d, w).to_string();
        assert!(text.contains("last 2.0 s"), "{text}");
    }
}
