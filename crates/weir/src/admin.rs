//! `weir volume …` and `weir policy …`: clients of a running server's admin API.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::net::SocketAddr;
use std::path::PathBuf;
use weir_qos::{Policy, ServiceLevel, Shares};
use weir_report::{Column, Table};
use weir_server::admin::{Client, ClientError, CloneRequest};
use weir_server::admin_auth::{TOKEN_ENV, read_token_file, token_path};
use weir_server::config::AccessGroupConfig;
use weir_server::thin::SnapshotRecord;
use weir_server::{VolumeCreate, parse_size};

/// Where the admin API listens unless `--admin` says otherwise.
const DEFAULT_ADMIN: &str = "127.0.0.1:10810";

#[derive(clap::Args)]
pub struct AdminTarget {
    /// Admin API address of the running server
    #[arg(long, global = true, value_name = "ADDR", default_value = DEFAULT_ADMIN)]
    admin: SocketAddr,
    /// Print JSON instead of tables
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// File holding the admin token (default: $WEIR_ADMIN_TOKEN, else the admin-token file of
    /// --data-dir)
    #[arg(long, global = true, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// The server's data directory, whose admin-token file the CLI reads (default: the
    /// server's default, $XDG_DATA_HOME/weir or ~/.local/share/weir)
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

/// Where the token comes from: `--admin-token-file`, `$WEIR_ADMIN_TOKEN`, or the
/// `admin-token` file of `--data-dir` (default: the server's default data directory).
pub(crate) fn admin_client(target: &AdminTarget) -> Result<Client> {
    let client = Client::new(target.admin);
    if let Some(file) = &target.admin_token_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("--admin-token-file {}", file.display()))?;
        let token = text.trim();
        if token.is_empty() {
            bail!("--admin-token-file {} is empty", file.display());
        }
        return Ok(client.with_token(token));
    }
    if let Some(token) = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(client.with_token(token.trim()));
    }
    let dir = target
        .data_dir
        .clone()
        .unwrap_or_else(weir_server::config::default_data_dir);
    match read_token_file(&dir) {
        Ok(token) => Ok(client.with_token(token)),
        // Explicitly named: say why it cannot be read.
        Err(e) if target.data_dir.is_some() => Err(anyhow::anyhow!(
            "reading the admin token {}: {e}",
            token_path(&dir).display()
        )),
        // The server may run elsewhere: try without (a refusal explains itself).
        Err(_) => Ok(client),
    }
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a volume (a sparse file in a pool)
    Create {
        name: String,
        /// Size, e.g. 20G, 512MiB, 1T
        #[arg(long)]
        size: String,
        /// Policy name (built-in: mission-critical, business-critical, business-critical-2,
        /// non-critical, non-critical-2; or a user-defined one)
        #[arg(long, default_value = "non-critical")]
        policy: String,
        /// Hosts allowed to see and open it: addresses or CIDRs, comma-separated (default: any)
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// TLS client identities (certificate subject CNs) it also requires, comma-separated
        /// (the server needs tls_client_ca); without --hosts, from any host
        #[arg(long, value_delimiter = ',')]
        identities: Vec<String>,
        /// Pool (default: the server's first pool)
        #[arg(long)]
        pool: Option<String>,
        /// Export it read-only
        #[arg(long)]
        read_only: bool,
    },
    /// List volumes
    List,
    /// Show one volume
    Show { name: String },
    /// Grow a volume (shrinking is refused)
    Resize {
        name: String,
        #[arg(long)]
        size: String,
    },
    /// Delete a volume and its data
    Delete { name: String },
    /// Change a volume's policy (applies to queued and new I/O at once)
    SetPolicy { name: String, policy: String },
    /// I/O counters; with --interval, the rates over that many seconds
    Stats {
        name: String,
        #[arg(long, value_name = "SECONDS", conflicts_with = "since")]
        interval: Option<f64>,
        /// History instead: the last DURATION (90s, 15m, 1h, 7d; at most 30d) from the
        /// server's history store, about 60 rows
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
    },
    /// Take a snapshot of a thin volume (read-only, exported as VOLUME@SNAPSHOT)
    Snapshot {
        /// A volume in a pool with format = "thin"
        volume: String,
        /// The snapshot's name
        snapshot: String,
    },
    /// List snapshots (of one volume, or of all)
    Snapshots { volume: Option<String> },
    /// Delete a snapshot (refused while linked clones read from it)
    DeleteSnapshot { volume: String, snapshot: String },
    /// Return a volume to a snapshot (writes since the snapshot are lost)
    Rollback { volume: String, snapshot: String },
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
    Flatten { volume: String },
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
    },
    /// Replications: target, lag (RPO), last cycle (of one volume, or all)
    Replications { volume: Option<String> },
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Create (or replace) a user-defined policy
    Create {
        name: String,
        #[arg(long, value_parser = parse_level)]
        service_level: Option<ServiceLevel>,
        #[arg(long)]
        reservation_iops: Option<f64>,
        #[arg(long)]
        reservation_mbps: Option<f64>,
        /// 16 to 2147483647 (the top means unlimited)
        #[arg(long)]
        limit_iops: Option<f64>,
        #[arg(long)]
        limit_mbps: Option<f64>,
        /// low (500), normal (1000), high (2000) or 200-4000
        #[arg(long, default_value = "normal", value_parser = parse_shares)]
        shares: Shares,
        #[arg(long)]
        latency_target_ms: Option<f64>,
        /// Credit an idle volume may bank, in seconds of its rate
        #[arg(long, default_value_t = 0.0)]
        burst_seconds: f64,
    },
    /// List policies (built-in and user-defined)
    List,
    /// Show one policy
    Show { name: String },
    /// Delete a user-defined policy (built-ins cannot be deleted)
    Delete { name: String },
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

fn opt(v: Option<f64>) -> String {
    v.map(weir_report::fmt_number).unwrap_or_else(|| "-".into())
}

/// Turns an admin client error into what a person needs to read.
pub(crate) fn explain(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Connect { .. } => {
            anyhow::anyhow!("{e} (is `weir serve` running? --admin ADDR picks another address)")
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

fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn show_volume(json: bool, volume: weir_server::VolumeRecord) -> Result<()> {
    if json {
        print_json(&volume)
    } else {
        print!("{}", volume_table(&[volume]));
        Ok(())
    }
}

fn show_volumes(json: bool, volumes: &[weir_server::VolumeRecord]) -> Result<()> {
    if json {
        print_json(&volumes)
    } else {
        print!("{}", volume_table(volumes));
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
        Column::right("taken (unix s)"),
    ]);
    for s in snaps {
        table.add_row([
            s.export_name(),
            human_size(s.size_bytes),
            s.created_unix_s.to_string(),
        ]);
    }
    print!("{table}");
    Ok(())
}

fn print_check(pools: &[weir_server::store::ThinPoolCheck]) {
    if pools.is_empty() {
        println!("no thin pools");
    }
    for p in pools {
        println!(
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
            println!("  problem: {problem}");
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
        let mode = if v.read_only { "ro" } else { "rw" };
        table.add_row([
            v.name.clone(),
            v.pool.clone(),
            human_size(v.size_bytes),
            v.policy.clone(),
            groups,
            mode.into(),
        ]);
    }
    table
}

pub fn volume(target: AdminTarget, command: VolumeCommand) -> Result<()> {
    let client = admin_client(&target)?;
    runtime()?.block_on(async {
        match command {
            VolumeCommand::Create {
                name,
                size,
                policy,
                hosts,
                identities,
                pool,
                read_only,
            } => {
                let size_bytes = parse_size(&size)
                    .map_err(anyhow::Error::msg)
                    .context("--size")?;
                let mut access_groups = Vec::new();
                if !hosts.is_empty() || !identities.is_empty() {
                    let group = format!("{name}-hosts");
                    let hosts = if hosts.is_empty() {
                        vec!["*".to_string()]
                    } else {
                        hosts
                    };
                    client
                        .put_access_group(&AccessGroupConfig {
                            name: group.clone(),
                            hosts,
                            identities,
                        })
                        .await
                        .map_err(explain)?;
                    access_groups.push(group);
                }
                let req = VolumeCreate {
                    name,
                    size_bytes,
                    policy,
                    pool,
                    access_groups,
                    read_only,
                    description: String::new(),
                };
                let v = client.create_volume(&req).await.map_err(explain)?;
                show_volume(target.json, v)
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
                let size_bytes = parse_size(&size)
                    .map_err(anyhow::Error::msg)
                    .context("--size")?;
                let v = client
                    .resize_volume(&name, size_bytes)
                    .await
                    .map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::Delete { name } => {
                let v = client.delete_volume(&name).await.map_err(explain)?;
                if target.json {
                    print_json(&v)
                } else {
                    println!("deleted volume {}", v.name);
                    Ok(())
                }
            }
            VolumeCommand::Snapshot { volume, snapshot } => {
                let s = client.snapshot(&volume, &snapshot).await.map_err(explain)?;
                show_snapshots(target.json, &[s])
            }
            VolumeCommand::Snapshots { volume } => {
                let s = client.snapshots(volume.as_deref()).await.map_err(explain)?;
                show_snapshots(target.json, &s)
            }
            VolumeCommand::DeleteSnapshot { volume, snapshot } => {
                let s = client
                    .delete_snapshot(&volume, &snapshot)
                    .await
                    .map_err(explain)?;
                if target.json {
                    print_json(&s)
                } else {
                    println!("deleted snapshot {}", s.export_name());
                    Ok(())
                }
            }
            VolumeCommand::Rollback { volume, snapshot } => {
                let v = client.rollback(&volume, &snapshot).await.map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::Clone {
                source,
                name,
                count,
                policy,
            } => {
                let Some((volume, snapshot)) = source.split_once('@') else {
                    bail!("the source must be VOLUME@SNAPSHOT, not {source:?}");
                };
                let names = clone_names(&name, count)?;
                let req = CloneRequest { names, policy };
                let vs = client
                    .clone_snapshot(volume, snapshot, &req)
                    .await
                    .map_err(explain)?;
                if target.json || vs.len() <= 20 {
                    show_volumes(target.json, &vs)
                } else {
                    println!(
                        "created {} clones of {source}: {} … {}",
                        vs.len(),
                        vs[0].name,
                        vs[vs.len() - 1].name
                    );
                    Ok(())
                }
            }
            VolumeCommand::Flatten { volume } => {
                let v = client.flatten(&volume).await.map_err(explain)?;
                show_volume(target.json, v)
            }
            VolumeCommand::Check => {
                let pools = client.check().await.map_err(explain)?;
                let bad = pools.iter().any(|p| !p.problems.is_empty());
                if target.json {
                    print_json(&pools)?;
                } else {
                    print_check(&pools);
                }
                if bad {
                    bail!("thin pool check found problems");
                }
                Ok(())
            }
            VolumeCommand::Replicate {
                name,
                to,
                every,
                once,
                no_wait,
                stop,
            } => {
                let r = crate::replicate::Replicate {
                    name,
                    to,
                    every,
                    once,
                    no_wait,
                    stop,
                };
                crate::replicate::replicate(&client, target.json, r).await
            }
            VolumeCommand::Replications { volume } => {
                crate::replicate::list(&client, target.json, volume.as_deref()).await
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
            VolumeCommand::Stats { name, interval, .. } => {
                let first = client.volume_stats(&name).await.map_err(explain)?;
                let (stats, window_s, counters) = match interval {
                    Some(secs) if secs > 0.0 && secs.is_finite() => {
                        tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await;
                        let second = client.volume_stats(&name).await.map_err(explain)?;
                        let d = delta(&first.counters, &second.counters);
                        let w = second.uptime_seconds - first.uptime_seconds;
                        (second, w, d)
                    }
                    Some(secs) => {
                        bail!("--interval must be a positive number of seconds, not {secs}")
                    }
                    None => {
                        let c = first.counters.clone();
                        (first.clone(), first.uptime_seconds, c)
                    }
                };
                if target.json {
                    return print_json(&stats);
                }
                let per_s = |x: u64| {
                    if window_s > 0.0 {
                        x as f64 / window_s
                    } else {
                        0.0
                    }
                };
                let mut table = Table::new(vec![Column::left("metric"), Column::right("value")]);
                let label = if interval.is_some() {
                    format!("last {window_s:.1} s")
                } else {
                    format!("since start ({window_s:.0} s)")
                };
                table.add_row([
                    "volume".to_string(),
                    format!("{} ({})", stats.volume.name, stats.volume.policy),
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
                    weir_report::fmt_mbps(per_s(counters.read_bytes + counters.write_bytes) / 1e6),
                ]);
                table.add_row([
                    "mean latency ms".to_string(),
                    weir_report::fmt_ms(counters.mean_latency_ms()),
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
                for row in stats
                    .replication
                    .iter()
                    .flat_map(crate::replicate::stats_rows)
                {
                    table.add_row(row);
                }
                print!("{table}");
                Ok(())
            }
        }
    })
}

fn delta(
    a: &weir_server::metrics::CounterSnapshot,
    b: &weir_server::metrics::CounterSnapshot,
) -> weir_server::metrics::CounterSnapshot {
    weir_server::metrics::CounterSnapshot {
        read_ios: b.read_ios.saturating_sub(a.read_ios),
        write_ios: b.write_ios.saturating_sub(a.write_ios),
        other_ios: b.other_ios.saturating_sub(a.other_ios),
        read_bytes: b.read_bytes.saturating_sub(a.read_bytes),
        write_bytes: b.write_bytes.saturating_sub(a.write_bytes),
        errors: b.errors.saturating_sub(a.errors),
        latency_sum_ns: b.latency_sum_ns.saturating_sub(a.latency_sum_ns),
        latency_buckets: b
            .latency_buckets
            .iter()
            .zip(a.latency_buckets.iter().chain(std::iter::repeat(&0)))
            .map(|(y, x)| y.saturating_sub(*x))
            .collect(),
    }
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
    let client = admin_client(&target)?;
    runtime()?.block_on(async {
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
                vec![client.create_policy(&policy).await.map_err(explain)?]
            }
            PolicyCommand::List => client.list_policies().await.map_err(explain)?,
            PolicyCommand::Show { name } => vec![client.show_policy(&name).await.map_err(explain)?],
            PolicyCommand::Delete { name } => {
                let p = client.delete_policy(&name).await.map_err(explain)?;
                println!("deleted policy {}", p.name);
                return Ok(());
            }
        };
        if target.json {
            print_json(&shown)
        } else {
            print!("{}", policy_table(&shown));
            Ok(())
        }
    })
}
