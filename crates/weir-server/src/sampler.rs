//! The sampler: a thread that looks at every volume's scheduler queue five times
//! a second and, each wall-clock second, turns the counters' deltas into one
//! [`Sample`] per volume (IOPS, MB/s, p50/p99 latency, queue, time throttled,
//! reservation and latency target met) and per-host rates. The samples go to the
//! history store ([`crate::history`]) and to [`LiveStats`], which `GET /v1/stats`
//! (`weir top`, the dashboard) serves as they are: polling costs a clone of an
//! `Arc` and the JSON, whatever the number of pollers.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use weir_http::Response;
use weir_qos::{Policy, ServiceLevel, VolumeId};

use crate::history::{History, Sample};
use crate::metrics::{CounterSnapshot, LATENCY_BUCKETS_US};
use crate::server::ServerState;

/// Looks at the queues per second.
const LOOKS_PER_SECOND: u32 = 5;

/// Every volume and host over the last second (`GET /v1/stats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveStats {
    /// Unix time of the second the figures end with (0: no second yet).
    pub time: u64,
    /// The length of the window, seconds.
    pub interval_s: f64,
    pub volumes: Vec<VolumeLive>,
    pub hosts: Vec<HostLive>,
}

/// One volume, its policy's targets and its last second.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeLive {
    pub name: String,
    pub pool: String,
    pub policy: String,
    #[serde(default)]
    pub service_level: Option<ServiceLevel>,
    pub size_bytes: u64,
    #[serde(default)]
    pub access_groups: Vec<String>,
    #[serde(default)]
    pub reservation_iops: Option<f64>,
    #[serde(default)]
    pub limit_iops: Option<f64>,
    #[serde(default)]
    pub latency_target_ms: Option<f64>,
    #[serde(flatten)]
    pub sample: Sample,
}

/// One client host's last second (all its volumes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostLive {
    pub host: String,
    pub iops: f32,
    pub mbps: f32,
    pub mean_ms: f32,
}

/// The history store and the latest second, shared with the admin API.
#[derive(Default)]
pub struct Recorder {
    /// `None`: the store could not be opened (warned at start; live figures still work).
    pub history: Option<History>,
    live: Mutex<Arc<LiveStats>>,
}

impl Recorder {
    pub fn open(data_dir: &std::path::Path) -> Recorder {
        let history = History::open(data_dir)
            .map_err(|e| {
                let dir = data_dir.join("history");
                tracing::warn!("history store {} unavailable: {e}", dir.display())
            })
            .ok();
        Recorder {
            history,
            live: Mutex::default(),
        }
    }

    /// The latest second.
    pub fn live(&self) -> Arc<LiveStats> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_live(&self, live: LiveStats) {
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(live);
    }
}

/// The running sampler thread; dropping it stops the thread.
pub struct Sampler {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the sampler of `state`.
pub fn start(state: Arc<ServerState>) -> Sampler {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("weir-sampler".into())
        .spawn(move || run(&state, &flag))
        .map_err(|e| tracing::warn!("history sampler not started: {e}"))
        .ok();
    Sampler { stop, thread }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Waits until the next fifth of a wall-clock second; `false`: stop.
fn wait_tick(stop: &(Mutex<bool>, Condvar)) -> bool {
    let tick = 1_000_000_000 / LOOKS_PER_SECOND;
    let pause = Duration::from_nanos(u64::from(tick - unix_now().subsec_nanos() % tick));
    let deadline = Instant::now() + pause;
    let mut stopped = stop.0.lock().unwrap_or_else(|e| e.into_inner());
    while !*stopped {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        stopped = stop
            .1
            .wait_timeout(stopped, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    false
}

/// What the sampler keeps between seconds.
#[derive(Default)]
struct State {
    volumes: Vec<(crate::store::VolumeRecord, Policy)>,
    counters: HashMap<String, CounterSnapshot>,
    hosts: HashMap<String, CounterSnapshot>,
    /// Per volume: sum of queue lengths seen, looks with a queue, looks.
    looks: HashMap<String, (u64, u32, u32)>,
    at: Option<Instant>,
    second: u64,
    /// Failed history writes (a full disk fails every second).
    record_failed: Option<crate::connections::RateLimited>,
}

fn run(state: &ServerState, stop: &(Mutex<bool>, Condvar)) {
    let mut s = State::default();
    while wait_tick(stop) {
        look_at_queues(state, &mut s);
        let second = unix_now().as_secs();
        if second != s.second {
            s.second = second;
            sample_second(state, &mut s, second);
        }
    }
}

fn look_at_queues(state: &ServerState, s: &mut State) {
    for (r, _) in &s.volumes {
        let queued = state
            .pool(&r.pool)
            .and_then(|p| p.volume_stats(VolumeId(r.id)))
            .map_or(0, |v| v.queued as u64);
        let e = s.looks.entry(r.name.clone()).or_default();
        e.0 += queued;
        e.1 += u32::from(queued > 0);
        e.2 += 1;
    }
}

fn sample_second(state: &ServerState, s: &mut State, second: u64) {
    let now = Instant::now();
    let interval = s.at.map(|a| now.duration_since(a).as_secs_f64());
    s.at = Some(now);
    let mut volumes = Vec::with_capacity(s.volumes.len());
    for (r, policy) in &s.volumes {
        let current = state.metrics.volume(&r.name).snapshot();
        let previous = s.counters.insert(r.name.clone(), current.clone());
        let (Some(dt), Some(previous)) = (interval, previous) else {
            continue;
        };
        let looks = s.looks.remove(&r.name).unwrap_or_default();
        let sample = volume_sample(&delta(&previous, &current), dt, looks, policy);
        volumes.push(live_volume(r, policy, sample));
    }
    let hosts = host_rates(state, s, interval);
    if let Some(history) = &state.recorder.history
        && interval.is_some()
    {
        let samples: Vec<(String, Sample)> =
            volumes.iter().map(|v| (v.name.clone(), v.sample)).collect();
        if let Err(e) = history.record(second, &samples) {
            let limit = s.record_failed.get_or_insert_with(|| {
                crate::connections::RateLimited::new(crate::connections::WARN_EVERY)
            });
            if let Some(n) = limit.allow(now) {
                let more = crate::connections::suppressed_note(n);
                tracing::warn!("history: recording second {second} failed: {e}{more}");
            }
        }
    }
    state.recorder.set_live(LiveStats {
        time: second,
        interval_s: interval.unwrap_or(0.0),
        volumes,
        hosts,
    });
    s.volumes = state.store().volume_policies();
    s.looks.clear();
    let names: std::collections::HashSet<&str> =
        s.volumes.iter().map(|(r, _)| r.name.as_str()).collect();
    s.counters.retain(|n, _| names.contains(n.as_str()));
}

fn host_rates(state: &ServerState, s: &mut State, interval: Option<f64>) -> Vec<HostLive> {
    let mut hosts = Vec::new();
    let now = state.metrics.host_snapshots();
    // Forget what the server forgot (the table is bounded: `hosts`).
    let names: std::collections::HashSet<&str> = now.iter().map(|(h, _)| h.as_str()).collect();
    s.hosts.retain(|h, _| names.contains(h.as_str()));
    for (host, current) in &now {
        let previous = s.hosts.insert(host.clone(), current.clone());
        if let (Some(dt), Some(previous)) = (interval, previous) {
            let d = delta(&previous, current);
            hosts.push(HostLive {
                host: host.clone(),
                iops: (d.ios() as f64 / dt) as f32,
                mbps: ((d.read_bytes + d.write_bytes) as f64 / dt / 1e6) as f32,
                mean_ms: d.mean_latency_ms() as f32,
            });
        }
    }
    hosts
}

fn live_volume(r: &crate::store::VolumeRecord, p: &Policy, sample: Sample) -> VolumeLive {
    VolumeLive {
        name: r.name.clone(),
        pool: r.pool.clone(),
        policy: r.policy.clone(),
        service_level: p.service_level,
        size_bytes: r.size_bytes,
        access_groups: r.access_groups.clone(),
        reservation_iops: p.reservation_iops,
        limit_iops: p.limit_iops,
        latency_target_ms: p.latency_target_ms,
        sample,
    }
}

/// `b - a`, counter by counter (a reset counts as 0).
pub fn delta(a: &CounterSnapshot, b: &CounterSnapshot) -> CounterSnapshot {
    CounterSnapshot {
        read_ios: b.read_ios.saturating_sub(a.read_ios),
        write_ios: b.write_ios.saturating_sub(a.write_ios),
        other_ios: b.other_ios.saturating_sub(a.other_ios),
        read_bytes: b.read_bytes.saturating_sub(a.read_bytes),
        write_bytes: b.write_bytes.saturating_sub(a.write_bytes),
        errors: b.errors.saturating_sub(a.errors),
        latency_sum_ns: b.latency_sum_ns.saturating_sub(a.latency_sum_ns),
        qos_wait_ns: b.qos_wait_ns.saturating_sub(a.qos_wait_ns),
        latency_buckets: b
            .latency_buckets
            .iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(a.latency_buckets.get(i).copied().unwrap_or(0)))
            .collect(),
    }
}

/// One second of one volume: `d` the counters' delta over `dt` seconds, `looks`
/// the queue looks (sum, non-empty, count).
pub fn volume_sample(d: &CounterSnapshot, dt: f64, looks: (u64, u32, u32), p: &Policy) -> Sample {
    let dt = dt.max(1e-3);
    let iops = d.ios() as f64 / dt;
    let mbps = (d.read_bytes + d.write_bytes) as f64 / dt / 1e6;
    let (p50, p99) = (quantile_ms(d, 0.5), quantile_ms(d, 0.99));
    let (queued, throttled) = match looks.2 {
        0 => (0.0, 0.0),
        n => (
            looks.0 as f64 / f64::from(n),
            f64::from(looks.1) / f64::from(n),
        ),
    };
    let reserved = p.reservation_iops.is_some() || p.reservation_mbps.is_some();
    let got = p.reservation_iops.is_none_or(|r| iops >= r * 0.95)
        && p.reservation_mbps.is_none_or(|r| mbps >= r * 0.95);
    let reservation_met = !reserved || throttled == 0.0 || got;
    let target_met = d.ios() == 0 || p.latency_target_ms.is_none_or(|t| p99 <= t);
    Sample {
        iops: iops as f32,
        mbps: mbps as f32,
        p50_ms: p50 as f32,
        p99_ms: p99 as f32,
        queued: queued as f32,
        throttled: throttled as f32,
        reservation_met: f32::from(u8::from(reservation_met)),
        target_met: f32::from(u8::from(target_met)),
    }
}

/// The `q` quantile of the latencies counted in `d`'s histogram, ms, interpolated
/// linearly within its bucket (the last, open bucket: its lower bound).
pub fn quantile_ms(d: &CounterSnapshot, q: f64) -> f64 {
    let total: u64 = d.latency_buckets.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, &n) in d.latency_buckets.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let lo = if i == 0 { 0 } else { LATENCY_BUCKETS_US[i - 1] } as f64;
            let Some(&hi) = LATENCY_BUCKETS_US.get(i) else {
                return lo / 1000.0;
            };
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return (lo + (hi as f64 - lo) * within) / 1000.0;
        }
        below += n;
    }
    0.0
}

/// `GET /v1/stats` ([`LiveStats`]) and `GET /v1/volumes/{name}/history?since=
/// DURATION&step=DURATION` ([`crate::history::Series`]; durations as `90`, `15m`,
/// `1h`, `7d`; `since` at most 30 days, default 15 minutes). `None`: another route.
pub fn api(state: &ServerState, method: &str, path: &[&str], query: &str) -> Option<Response> {
    let answer = match path {
        ["v1", "stats"] => get(method).map(|()| json(200, &*state.recorder.live())),
        ["v1", "volumes", name, "history"] => {
            get(method).and_then(|()| history(state, name, query))
        }
        _ => return None,
    };
    Some(
        answer.unwrap_or_else(|(status, error)| json(status, &crate::admin::ErrorBody::new(error))),
    )
}

type Answer = Result<Response, (u16, String)>;

fn get(method: &str) -> Result<(), (u16, String)> {
    match method {
        "GET" => Ok(()),
        _ => Err((
            405,
            format!("method {method} is not allowed here (GET only)"),
        )),
    }
}

fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::new(status, "application/json", body)
}

fn history(state: &ServerState, name: &str, query: &str) -> Answer {
    let volume = state.store().get(name).map_err(|e| (404, e.to_string()))?;
    let (mut since, mut step) = (900, 1);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let field = match key {
            "since" => &mut since,
            "step" => &mut step,
            _ => {
                return Err((
                    400,
                    format!("unknown query parameter {key:?} (since, step)"),
                ));
            }
        };
        *field = parse_seconds(value).ok_or_else(|| {
            (
                400,
                format!("{key}={value:?}: expected a duration such as 90, 15m, 1h or 7d"),
            )
        })?;
    }
    let Some(store) = &state.recorder.history else {
        return Err((
            503,
            "the history store is unavailable (see the server log)".into(),
        ));
    };
    let now = unix_now().as_secs();
    let series = store
        .series(
            &volume.name,
            now,
            since,
            step.min(crate::history::TIERS[2].span_s()),
        )
        .map_err(|e| (500, format!("reading history: {e}")))?;
    let series = series.unwrap_or_else(|| crate::history::Series {
        volume: volume.name.clone(),
        tier: String::new(),
        step_s: step,
        from: now.saturating_sub(since),
        to: now,
        points: Vec::new(),
    });
    Ok(json(200, &series))
}

/// Seconds in `90`, `90s`, `15m`, `1h`, `7d` (`None`: anything else, or 0).
pub fn parse_seconds(text: &str) -> Option<u64> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    n.checked_mul(unit).filter(|&s| s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            reservation_iops: Some(100.0),
            latency_target_ms: Some(10.0),
            ..Policy::best_effort("p")
        }
    }

    fn counters(ios: u64, bucket: usize) -> CounterSnapshot {
        let mut c = CounterSnapshot {
            read_ios: ios,
            read_bytes: ios * 4096,
            latency_buckets: vec![0; LATENCY_BUCKETS_US.len() + 1],
            ..CounterSnapshot::default()
        };
        c.latency_buckets[bucket] = ios;
        c
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        // All in the bucket (50 µs, 100 µs], wherever it is in the layout.
        let i = LATENCY_BUCKETS_US.iter().position(|&b| b == 100).unwrap();
        assert_eq!(LATENCY_BUCKETS_US[i - 1], 50);
        let c = counters(100, i);
        assert!((quantile_ms(&c, 0.5) - 0.075).abs() < 1e-9);
        assert!((quantile_ms(&c, 0.99) - 0.0995).abs() < 1e-9);
        assert_eq!(quantile_ms(&counters(0, 0), 0.5), 0.0);
        let open = counters(3, LATENCY_BUCKETS_US.len());
        assert_eq!(
            quantile_ms(&open, 0.5),
            *LATENCY_BUCKETS_US.last().unwrap() as f64 / 1e3
        );
    }

    #[test]
    fn samples_judge_reservation_and_latency_target() {
        let slow = LATENCY_BUCKETS_US.iter().position(|&b| b > 10_000).unwrap() + 1;
        // 50 IOPS under a 100 IOPS reservation while requests wait: missed.
        let s = volume_sample(&counters(50, slow), 1.0, (10, 5, 5), &policy());
        assert_eq!((s.iops, s.queued, s.throttled), (50.0, 2.0, 1.0));
        assert_eq!((s.reservation_met, s.target_met), (0.0, 0.0));
        // The same rate with nothing waiting: it asked for less; fast: on target.
        let s = volume_sample(&counters(50, 1), 1.0, (0, 0, 5), &policy());
        assert_eq!((s.reservation_met, s.target_met), (1.0, 1.0));
        assert!((s.mbps - 0.2048).abs() < 1e-6);
        assert_eq!(parse_seconds("15m"), Some(900));
        assert_eq!(parse_seconds("90"), Some(90));
        assert_eq!(parse_seconds("7d"), Some(604_800));
        assert_eq!(parse_seconds("1w"), None);
        assert_eq!(parse_seconds("0"), None);
        let d = delta(&counters(50, 1), &counters(80, 1));
        assert_eq!((d.read_ios, d.latency_buckets[1]), (30, 30));
    }
}
