//! How late a lease's lost signal fires after its validity deadline: with lockkit's runtime
//! thread idle, and with that thread busy (blocked in 50 ms slices, as by a renewal tick over
//! many leases or a backend parsing a large answer).
//!
//! ```sh
//! cargo run --release -p lockkit-core --example lost_signal_lag -- --leases 200
//! ```
//!
//! Each lease (memory backend, TTL 100 ms, no renewal) is watched by a task on a two-worker
//! application runtime, which notes when `lost()` resolves; the lag is that instant minus
//! `valid_until()`. Leases start 3 ms apart, so their deadlines spread over the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::backend::runtime;
use lockkit_core::{LockClient, LockOptions, MemoryBackend};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> lockkit_core::Result<()> {
    let mut leases = 200_usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--leases", Some(n)) => leases = n.parse().unwrap_or(leases),
            _ => {
                eprintln!("usage: lost_signal_lag [--leases N]");
                std::process::exit(2);
            }
        }
    }
    println!("| lockkit's thread | leases | min | median | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|");
    for busy in [false, true] {
        let stop = Arc::new(AtomicBool::new(false));
        if busy {
            let stop = stop.clone();
            runtime::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    tokio::task::yield_now().await;
                }
            });
        }
        let mut lags = measure(leases).await?;
        stop.store(true, Ordering::Relaxed);
        lags.sort();
        let at = |q: f64| lags[((lags.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            if busy { "busy" } else { "idle" },
            lags.len(),
            ms(at(0.0)),
            ms(at(0.5)),
            ms(at(0.99)),
            ms(at(1.0)),
        );
    }
    Ok(())
}

/// The lag of `n` leases' lost signals behind their deadlines.
async fn measure(n: usize) -> lockkit_core::Result<Vec<Duration>> {
    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(100))
        .with_auto_renew(false);
    let locks = LockClient::with_options(Arc::new(MemoryBackend::new()), "lag", options)?;
    let mut watchers = Vec::with_capacity(n);
    for i in 0..n {
        let guard = locks.mutex(&format!("lease-{i}"))?.lock().await?;
        watchers.push(tokio::spawn(async move {
            guard.lost().await;
            let fired = Instant::now();
            fired.saturating_duration_since(guard.valid_until())
        }));
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let mut lags = Vec::with_capacity(n);
    for watcher in watchers {
        if let Ok(lag) = watcher.await {
            lags.push(lag);
        }
    }
    Ok(lags)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
