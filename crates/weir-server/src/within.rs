//! Blocking calls that may never return (a name server, a Ceph OSD that does
//! not answer), waited for within a bound. Each runs on a thread of its own,
//! which outlives a call given up on until the call returns.

use std::io;
use std::time::Duration;

/// Runs `f` on a thread named `thread` and waits for it at most `wait`:
/// `Some(result)`, or `None` when it had not returned by then (it goes on).
/// An error only when no thread could be started.
pub fn run_within<T: Send + 'static>(
    thread: &str,
    wait: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<Option<T>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    Ok(rx.recv_timeout(wait).ok())
}
