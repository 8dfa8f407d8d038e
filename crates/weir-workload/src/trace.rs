//! Request traces of generators: several generators (one per volume or VM) driven
//! together against storage of a fixed latency, every request handed out in the
//! order it was issued. For trace-driven studies that need the models' address
//! streams, not their timing (cache replacement policies: a cache changes the
//! latency, which here only shifts when the closed-loop models issue).

use crate::{IoGenerator, IoRequest, Issue, Nanos};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One request of a trace.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TracedIo {
    /// When it was issued.
    pub at_ns: Nanos,
    /// Which generator (index in the slice given to [`drive_fixed_latency`]).
    pub source: u32,
    pub worker: u32,
    /// [`IoGenerator::clone_of`] the worker when it issued the request.
    pub clone: u32,
    /// [`IoGenerator::host_cacheable`] of its offset.
    pub host_cacheable: bool,
    pub io: IoRequest,
}

/// (time, seq, source, worker, in-flight slot or `NO_REQ` for a wake-up).
type Event = (Nanos, u64, u32, u32, u32);

/// Drives `generators` until `end_ns`, each request completing `latency_ns`
/// after it was issued, and calls `f` with every request in issue order (ties:
/// the order the driver polled them). Deterministic.
pub fn drive_fixed_latency(
    generators: &mut [Box<dyn IoGenerator + Send>],
    latency_ns: Nanos,
    end_ns: Nanos,
    mut f: impl FnMut(&TracedIo),
) {
    const NO_REQ: u32 = u32::MAX;
    let mut heap: BinaryHeap<Reverse<Event>> = BinaryHeap::new();
    let mut wake: Vec<Vec<Option<Nanos>>> = Vec::new();
    let mut outstanding: Vec<Vec<u32>> = Vec::new();
    let mut in_flight: Vec<IoRequest> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut seq = 0u64;
    for (s, g) in generators.iter().enumerate() {
        let n = g.workers();
        wake.push(vec![None; n as usize]);
        outstanding.push(vec![0; n as usize]);
        for w in 0..n {
            heap.push(Reverse((0, seq, s as u32, w, NO_REQ)));
            seq += 1;
        }
    }
    while let Some(Reverse((now, _, s, w, req))) = heap.pop() {
        if now > end_ns {
            break;
        }
        let (si, wi) = (s as usize, w as usize);
        let g = &mut generators[si];
        if req != NO_REQ {
            let r = in_flight[req as usize];
            free.push(req);
            outstanding[si][wi] -= 1;
            g.on_complete(now, w, &r, latency_ns);
        } else if wake[si][wi].is_some_and(|t| t != now) {
            continue;
        }
        loop {
            match g.poll(now, w, outstanding[si][wi]) {
                Issue::Io(io) => {
                    outstanding[si][wi] += 1;
                    f(&TracedIo {
                        at_ns: now,
                        source: s,
                        worker: w,
                        clone: g.clone_of(w),
                        host_cacheable: g.host_cacheable(io.offset_bytes),
                        io,
                    });
                    let slot = match free.pop() {
                        Some(i) => {
                            in_flight[i as usize] = io;
                            i
                        }
                        None => {
                            in_flight.push(io);
                            (in_flight.len() - 1) as u32
                        }
                    };
                    heap.push(Reverse((now + latency_ns, seq, s, w, slot)));
                    seq += 1;
                }
                Issue::At(t) => {
                    let t = t.max(now + 1);
                    if wake[si][wi] != Some(t) {
                        wake[si][wi] = Some(t);
                        heap.push(Reverse((t, seq, s, w, NO_REQ)));
                        seq += 1;
                    }
                    break;
                }
                Issue::Blocked => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AccessGenerator, AccessSpec, Direction, ModelSpec};

    fn oltp(seed: u64) -> Box<dyn IoGenerator + Send> {
        let spec: ModelSpec =
            toml::from_str("kind = \"oltp\"\nname = \"sql\"\nthink_ms = 0\ndatabase_gib = 1")
                .unwrap();
        spec.build(4 << 30, seed, 0, 1).unwrap()
    }

    fn trace(seeds: &[u64], end_ns: Nanos) -> Vec<TracedIo> {
        let mut gens: Vec<_> = seeds.iter().map(|&s| oltp(s)).collect();
        let mut out = Vec::new();
        drive_fixed_latency(&mut gens, 500_000, end_ns, |t| out.push(*t));
        out
    }

    #[test]
    fn merges_generators_in_time_order_deterministically() {
        let a = trace(&[1, 2], 2_000_000_000);
        assert_eq!(a, trace(&[1, 2], 2_000_000_000));
        assert!(a.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert!(a.iter().any(|t| t.source == 0) && a.iter().any(|t| t.source == 1));
        // Each source alone issues what it issues beside the other.
        let alone: Vec<IoRequest> = trace(&[2], 2_000_000_000).iter().map(|t| t.io).collect();
        let beside: Vec<IoRequest> = a.iter().filter(|t| t.source == 1).map(|t| t.io).collect();
        assert_eq!(alone, beside);
        // The OLTP model's log is not host-cacheable, its database is.
        assert!(
            a.iter()
                .any(|t| !t.host_cacheable && t.io.dir == Direction::Write)
        );
        assert!(
            a.iter()
                .filter(|t| t.io.dir == Direction::Read)
                .all(|t| t.host_cacheable)
        );
    }

    #[test]
    fn a_closed_loop_issues_one_request_per_latency_per_outstanding_slot() {
        let spec = AccessSpec::simple(4096, 100.0, 100.0, 4);
        let mut gens: Vec<Box<dyn IoGenerator + Send>> =
            vec![Box::new(AccessGenerator::new(&spec, 1 << 30, 7).unwrap())];
        let mut n = 0u64;
        drive_fixed_latency(&mut gens, 1_000_000, 1_000_000_000, |_| n += 1);
        // 4 in flight, 1 ms each, for 1 s (both ends included).
        assert!((4000..=4004).contains(&n), "{n}");
    }
}
