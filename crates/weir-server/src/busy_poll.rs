//! Adaptive busy polling of a connection's socket while a client waits on its own
//! last reply (queue depth 1).
//!
//! A client with one request in flight (a database's log writer, `fio --iodepth=1`)
//! sends its next request a few microseconds after our reply reaches it. If the
//! server's thread has gone to sleep in the meantime, that request must wake it: on a
//! virtual machine an idle vCPU has halted, and the wake-up (an inter-processor
//! interrupt through the hypervisor) costs tens of microseconds — as much as the
//! I/O itself. Measured on the 2-vCPU test VM (A/B, interleaved): 4 KiB QD1 writes
//! 11.3–11.8 k IOPS sleeping, 21.2–23.8 k polling for up to 50 µs (docs/PERFORMANCE.md).
//!
//! So, as KVM's halt polling does for a vCPU, the reader keeps polling its socket for
//! a short window before it sleeps, and adapts the window to what waiting has paid:
//! - it polls only for a client at queue depth 1: the last [`QD1_STREAK`] waits each
//!   followed exactly one request, and at most one request is unanswered (the one
//!   whose reply is going out). A client with more in flight is not waiting on us,
//!   and polling would take a CPU from it (measured: QD32 and 1 MiB cells 15-45 %
//!   slower when polling after every request);
//! - a wait that ends within a few windows grows the window (doubling, up to the
//!   configured `busy_poll_us`); a longer one (an idle or slow client) halves it,
//!   down to zero, so an idle connection costs nothing.
//!
//! Polling is cooperative: the reader's task yields to the runtime, which runs every
//! other ready task and polls its I/O driver without sleeping ([`poll_until`]).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Default polling window (`busy_poll_us` in the server configuration): 200 µs,
/// KVM's default `halt_poll_ns`. 50 µs (until session 28) covered a client's turn
/// around on the machine it was measured on, but not on a VM whose idle vCPUs
/// wake slower: there (fio's nbd engine, 4 KiB QD1, 2026-12-07) 50 µs polled in
/// vain and slept anyway, 7,498 read IOPS at 78 µs of server CPU per I/O, against
/// 16,086 at 62 µs with 200 (nbdkit: 8,909-9,130).
pub const DEFAULT_BUSY_POLL_US: u32 = 200;
/// Largest accepted `busy_poll_us`.
pub const MAX_BUSY_POLL_US: u32 = 1000;
/// Consecutive waits that each followed exactly one request before polling starts.
pub const QD1_STREAK: u32 = 8;
/// A wait longer than this many maximal windows halves the window.
const SHRINK_AFTER_WINDOWS: u32 = 4;
/// Windows below `max / MIN_WINDOW_DIVISOR` become zero; growth restarts there.
const MIN_WINDOW_DIVISOR: u32 = 8;

/// The busy-poll state of one connection: is its client at queue depth 1, and how
/// long has waiting for it lasted.
#[derive(Clone, Debug, PartialEq)]
pub struct BusyPoll {
    max: Duration,
    window: Duration,
    /// Requests read since the socket last had nothing to read.
    since_wait: u32,
    /// Consecutive waits that each followed exactly one request.
    streak: u32,
}

impl BusyPoll {
    /// `max` zero: never poll.
    pub fn new(max: Duration) -> BusyPoll {
        BusyPoll {
            max,
            window: max,
            since_wait: 0,
            streak: 0,
        }
    }

    /// How long to poll before sleeping if the next read must wait, with `unanswered`
    /// requests of the connection not yet replied to. `None`: not a client waiting on
    /// its last reply (deeper queue, or not yet [`QD1_STREAK`] waits in a row after
    /// one request each), or polling is off.
    pub fn window(&self, unanswered: usize) -> Option<Duration> {
        (unanswered <= 1 && self.streak >= QD1_STREAK && !self.max.is_zero()).then_some(self.window)
    }

    /// A request header was read; `waited`: how long the read had to wait for it
    /// (`None`: it was already there), `polled`: whether [`BusyPoll::window`] allowed
    /// polling for it.
    pub fn request_read(&mut self, waited: Option<Duration>, polled: bool) {
        if let Some(waited) = waited {
            self.streak = if self.since_wait == 1 {
                self.streak.saturating_add(1)
            } else {
                0
            };
            self.since_wait = 0;
            if polled {
                self.learn(waited);
            }
        }
        self.since_wait = self.since_wait.saturating_add(1);
    }

    /// Grows the window after a wait that a few windows would cover, halves it after
    /// a longer one.
    fn learn(&mut self, waited: Duration) {
        let floor = self.max / MIN_WINDOW_DIVISOR;
        if waited > self.max * SHRINK_AFTER_WINDOWS {
            self.window /= 2;
            if self.window < floor {
                self.window = Duration::ZERO;
            }
        } else if waited > self.window {
            self.window = (self.window * 2).max(floor).min(self.max);
        }
    }
}

/// Awaits `inner`; while it is pending and `deadline` has not passed, yields to the
/// runtime (which runs every other ready task and polls its I/O driver without
/// sleeping) and polls it again, instead of letting the thread sleep. Also says
/// whether `inner` ever had to wait.
///
/// `tokio::task::yield_now`, not a self wake-up: a task that wakes itself is
/// re-queued as if new work had arrived, and the multi-threaded scheduler then
/// wakes an idle worker to steal it, at every poll (measured: 4 KiB QD32 reads 25 %
/// slower whenever polling kicked in). A yielded task is re-run by its own worker
/// after the driver poll, with no other worker woken.
pub async fn poll_until<F: Future>(mut inner: Pin<&mut F>, deadline: Instant) -> (F::Output, bool) {
    let mut waited = false;
    loop {
        let polled = std::future::poll_fn(|cx| match inner.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        if let Some(v) = polled {
            return (v, waited);
        }
        waited = true;
        if Instant::now() >= deadline {
            return (inner.await, true);
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::task::Context;

    const US: Duration = Duration::from_micros(1);

    /// `n` requests, each read after a wait of `waited` (polled when allowed).
    fn qd1(p: &mut BusyPoll, n: u32, waited: Duration) {
        for _ in 0..n {
            let polled = p.window(1).is_some();
            p.request_read(Some(waited), polled);
        }
    }

    #[test]
    fn polls_only_for_a_client_waiting_on_its_last_reply() {
        let mut p = BusyPoll::new(50 * US);
        // Queue depth 1: a wait before every request; polling after the streak.
        qd1(&mut p, QD1_STREAK, 20 * US);
        assert_eq!(p.window(1), None, "one wait short of the streak");
        qd1(&mut p, 1, 20 * US);
        assert_eq!(p.window(1), Some(50 * US));
        assert_eq!(p.window(0), Some(50 * US));
        assert_eq!(p.window(2), None, "more than one request unanswered");
        // A deeper queue: two requests read between waits break the streak.
        p.request_read(None, false);
        p.request_read(Some(20 * US), true);
        assert_eq!(p.window(1), None);
        let mut off = BusyPoll::new(Duration::ZERO);
        qd1(&mut off, 20, 20 * US);
        assert_eq!(off.window(1), None, "busy_poll_us = 0");
    }

    #[test]
    fn an_idle_client_turns_polling_off_and_a_busy_one_back_on() {
        let mut p = BusyPoll::new(50 * US);
        qd1(&mut p, QD1_STREAK + 1, 20 * US);
        // Short waits: the window stays at the maximum.
        qd1(&mut p, 5, 20 * US);
        assert_eq!(p.window(1), Some(50 * US));
        // Long waits halve it down to zero (25, 12.5, 6.25, then below 50/8 → 0).
        qd1(&mut p, 1, Duration::from_millis(5));
        assert_eq!(p.window(1), Some(25 * US));
        qd1(&mut p, 3, Duration::from_millis(5));
        assert_eq!(p.window(1), Some(Duration::ZERO));
        qd1(&mut p, 1, Duration::from_secs(1));
        assert_eq!(p.window(1), Some(Duration::ZERO));
        // A client that answers within a few windows (its wait inflated by the
        // wake-up polling would have saved) grows it back: 6.25, 12.5, 25, 50.
        qd1(&mut p, 1, 120 * US);
        assert_eq!(p.window(1), Some(Duration::from_nanos(6250)));
        qd1(&mut p, 3, 120 * US);
        assert_eq!(p.window(1), Some(50 * US));
        qd1(&mut p, 1, 120 * US);
        assert_eq!(p.window(1), Some(50 * US), "capped at the maximum");
    }

    /// Pending `n` times without arranging any wake-up, then ready; counts polls.
    struct ReadyAfter(u32, Arc<AtomicU32>);
    impl Future for ReadyAfter {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            if self.0 == 0 {
                return Poll::Ready(());
            }
            self.0 -= 1;
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn polls_again_until_the_deadline_then_sleeps() {
        let polls = Arc::new(AtomicU32::new(0));
        let far = Instant::now() + Duration::from_secs(60);
        let inner = std::pin::pin!(ReadyAfter(100, polls.clone()));
        let ((), waited) = tokio::time::timeout(Duration::from_secs(10), poll_until(inner, far))
            .await
            .expect("re-polled until ready");
        assert!(waited);
        assert_eq!(polls.load(Ordering::Relaxed), 101);
        let inner = std::pin::pin!(ReadyAfter(0, polls.clone()));
        assert_eq!(poll_until(inner, far).await, ((), false));
        // Polled over and over until the deadline, then left asleep: only the
        // timeout polls it again.
        for (window_ms, busy) in [(20, true), (0, false)] {
            polls.store(0, Ordering::Relaxed);
            let inner = std::pin::pin!(ReadyAfter(u32::MAX, polls.clone()));
            let deadline = Instant::now() + Duration::from_millis(window_ms);
            let r = tokio::time::timeout(Duration::from_millis(100), poll_until(inner, deadline));
            assert!(r.await.is_err());
            let n = polls.load(Ordering::Relaxed);
            assert_eq!(n > 100, busy, "{n} polls with a {window_ms} ms window");
            if !busy {
                assert!(n <= 3, "{n} polls past the deadline");
            }
        }
    }
}
