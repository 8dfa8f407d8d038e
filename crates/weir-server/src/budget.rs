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
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

#[derive(Debug)]
struct Inner {
    free: AtomicUsize,
    waiters: AtomicUsize,
    returned: Notify,
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

impl Drop for Taken {
    fn drop(&mut self) {
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
    use std::time::Duration;

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
