//! A budget of units (request slots, 4 KiB units of data) that tasks take and
//! give back: what bounds a connection, a host and the server whatever clients
//! send. Taking and giving back are one atomic operation each when the budget is
//! not exhausted (no lock: a request takes from four budgets and gives them
//! back from another task, so a semaphore's lock on release cost measurably
//! more); a task that finds too few units waits until units are given back.
//!
//! Waiters are not served in order: each retries when units come back. A
//! connection's own budgets have one waiter at most (its reader); on a host's
//! or the server's budget, exhausted only under a flood, a large request may
//! wait longer than smaller ones taken meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug)]
struct Inner {
    free: AtomicUsize,
    waiters: AtomicUsize,
    returned: Notify,
    /// Give-backs so far: a waiter that sees none for a while knows the budget
    /// is stuck, not merely busy.
    give_backs: AtomicU64,
}

/// A budget of `whole` units, shared by clones.
#[derive(Clone, Debug)]
pub struct Budget {
    inner: Arc<Inner>,
    whole: usize,
}

/// Units taken from a budget, given back when dropped.
#[derive(Debug)]
#[must_use = "the units are given back when this is dropped"]
pub struct Taken {
    inner: Arc<Inner>,
    units: usize,
}

impl Taken {
    /// Units held.
    pub fn units(&self) -> usize {
        self.units
    }

    /// Holds `more`'s units too (both from the same budget), given back together.
    pub fn absorb(&mut self, mut more: Taken) {
        assert!(
            Arc::ptr_eq(&self.inner, &more.inner),
            "units of another budget"
        );
        self.units += std::mem::take(&mut more.units);
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.units == 0 {
            return;
        }
        self.inner.give_backs.fetch_add(1, Ordering::SeqCst);
        self.inner.free.fetch_add(self.units, Ordering::SeqCst);
        if self.inner.waiters.load(Ordering::SeqCst) > 0 {
            self.inner.returned.notify_waiters();
        }
    }
}

impl Budget {
    pub fn new(whole: usize) -> Budget {
        let whole = whole.max(1);
        Budget {
            inner: Arc::new(Inner {
                free: AtomicUsize::new(whole),
                waiters: AtomicUsize::new(0),
                returned: Notify::new(),
                give_backs: AtomicU64::new(0),
            }),
            whole,
        }
    }

    /// Units it has in all.
    pub fn whole(&self) -> usize {
        self.whole
    }

    /// Units free now.
    pub fn free(&self) -> usize {
        self.inner.free.load(Ordering::SeqCst)
    }

    /// `units` (at most all of it) if they are free now.
    #[inline]
    pub fn try_take(&self, units: usize) -> Option<Taken> {
        let n = units.min(self.whole);
        self.inner
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| {
                free.checked_sub(n)
            })
            .ok()
            .map(|_| Taken {
                inner: self.inner.clone(),
                units: n,
            })
    }

    /// Whether nothing was given back to it during `stall` while a task waited
    /// for units (checked at the end of `stall`): whoever holds it is stuck.
    pub async fn stuck_for(&self, stall: Duration) -> bool {
        let seen = self.inner.give_backs.load(Ordering::SeqCst);
        tokio::time::sleep(stall).await;
        self.inner.waiters.load(Ordering::SeqCst) > 0
            && self.inner.give_backs.load(Ordering::SeqCst) == seen
    }

    /// `units` (at most all of it), once they are free; `None` if nothing at all
    /// was given back to the budget for `stall` while waiting (whoever holds it
    /// is stuck: a caller holding some of it lets go, so that the rest go on).
    pub async fn take_unless_stuck(&self, units: usize, stall: Duration) -> Option<Taken> {
        loop {
            if let Some(t) = self.try_take(units) {
                return Some(t);
            }
            let seen = self.inner.give_backs.load(Ordering::SeqCst);
            if let Ok(t) = tokio::time::timeout(stall, self.take(units)).await {
                return Some(t);
            }
            if self.inner.give_backs.load(Ordering::SeqCst) == seen {
                return None;
            }
        }
    }

    /// `units` (at most all of it), once they are free.
    pub async fn take(&self, units: usize) -> Taken {
        loop {
            if let Some(t) = self.try_take(units) {
                return t;
            }
            let returned = self.inner.returned.notified();
            let mut returned = std::pin::pin!(returned);
            // Registered before the second look, so units given back after it
            // wake this task.
            returned.as_mut().enable();
            self.inner.waiters.fetch_add(1, Ordering::SeqCst);
            let taken = self.try_take(units);
            if taken.is_none() {
                returned.await;
            }
            self.inner.waiters.fetch_sub(1, Ordering::SeqCst);
            if let Some(t) = taken {
                return t;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absorbed_units_are_given_back_together() {
        let b = Budget::new(10);
        let mut a = b.try_take(3).unwrap();
        a.absorb(b.try_take(4).unwrap());
        assert_eq!((a.units(), b.free()), (7, 3));
        drop(a);
        assert_eq!(b.free(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_only_when_nothing_comes_back() {
        let b = Budget::new(12);
        let held = b.try_take(10).unwrap();
        // Busy: units come and go (another holder's) but never enough.
        let churn = b.clone();
        let busy = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(400)).await;
                drop(churn.try_take(1));
            }
        });
        let t = tokio::time::Instant::now();
        assert!(
            b.take_unless_stuck(5, Duration::from_secs(1))
                .await
                .is_none()
        );
        // It waited through the churn, then a whole second with no give-back.
        assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
        busy.await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.take_unless_stuck(5, Duration::from_secs(1)).await })
        };
        tokio::time::sleep(Duration::from_millis(900)).await;
        drop(held);
        assert_eq!(waiter.await.unwrap().map(|t| t.units()), Some(5));
    }

    #[test]
    fn units_are_taken_and_given_back_and_capped_at_the_whole() {
        let b = Budget::new(10);
        let a = b.try_take(7).unwrap();
        assert!(b.try_take(4).is_none());
        let c = b.try_take(3).unwrap();
        assert_eq!(b.free(), 0);
        drop(a);
        assert_eq!(b.free(), 7);
        // A request larger than the whole budget takes all of it.
        drop(c);
        let all = b.try_take(1000).unwrap();
        assert_eq!(b.free(), 0);
        drop(all);
        assert_eq!(b.free(), 10);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn waiters_get_units_given_back_and_the_budget_is_never_exceeded() {
        let b = Budget::new(16);
        let in_use = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (b, in_use, most) = (b.clone(), in_use.clone(), most.clone());
                tokio::spawn(async move {
                    for k in 0..200 {
                        let n = 1 + (i + k) % 5;
                        let t = b.take(n).await;
                        let now = in_use.fetch_add(n, Ordering::SeqCst) + n;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        in_use.fetch_sub(n, Ordering::SeqCst);
                        drop(t);
                    }
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("a waiter was never woken")
                .unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 16);
        assert_eq!(b.free(), 16);
    }
}
