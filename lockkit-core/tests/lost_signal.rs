//! The lost signal fires at the validity deadline, whatever lockkit's own thread is doing.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::runtime;
use lockkit_core::{LockClient, LockOptions, MemoryBackend};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_signal_fires_at_the_deadline_while_lockkits_thread_is_busy() {
    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_auto_renew(false);
    let locks = LockClient::with_options(Arc::new(MemoryBackend::new()), "lost", options).unwrap();
    let guard = locks.mutex("k").unwrap().lock().await.unwrap();
    let deadline = guard.valid_until();
    // lockkit's thread is busy from before the deadline until 2 s after it (a backend
    // parsing a large answer, say): the signal must not wait for it. The bound below leaves a
    // loaded machine's scheduling delays room and still fails a signal that waits.
    let busy_for = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
    let busy = runtime::spawn(async move { std::thread::sleep(busy_for) });
    guard.lost().await;
    let lag = Instant::now().saturating_duration_since(deadline);
    assert!(guard.is_lost());
    assert!(
        lag < Duration::from_secs(1),
        "the lost signal fired {lag:?} after the deadline"
    );
    busy.await.unwrap();
}
