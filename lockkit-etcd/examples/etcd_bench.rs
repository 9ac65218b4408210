//! Benchmarks of the etcd backend against the cluster of `compose/up.sh etcd` (or
//! `LOCKKIT_TEST_ETCD_URL`):
//!
//! 1. uncontended `lock()` + `release()` with an established session, against the floor of
//!    the same work done raw with `etcd-client` (a `txn` that puts a key on a lease if it
//!    is absent, then a `delete`), the three paths taking turns cycle by cycle in one run;
//! 2. contended: 8 tasks (each with its own connection and session, as 8 processes) doing
//!    250 increments each of a shared value under one lock: throughput and wait percentiles.
//!
//! ```text
//! cargo run --release -p lockkit-etcd --example etcd_bench
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Lease, LockBackend, OwnerToken};
use lockkit_core::{LockClient, LockKey, LockOptions, testing};
use lockkit_etcd::etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

const ROUNDS: usize = 5;
const CYCLES_PER_ROUND: usize = 200;
const TASKS: usize = 8;
const INCREMENTS: usize = 250;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = testing::endpoint("LOCKKIT_TEST_ETCD_URL")
        .ok_or("no etcd: run compose/up.sh etcd or set LOCKKIT_TEST_ETCD_URL")?;
    let mut config = EtcdConfig::from_url(&url)?;
    config.prefix = "lockkit-bench".into();
    let namespace = format!("bench-{}", std::process::id());

    let backend = EtcdBackend::connect(config.clone()).await?;
    let locks = LockClient::with_options(
        Arc::new(backend.clone()),
        &namespace,
        LockOptions::default(),
    )?;
    let mutex = locks.mutex("uncontended")?;
    let mut raw = backend.client();
    let lease = raw.lease_grant(10, None).await?.id();
    let (mut keeper, mut keep_alive) = raw.lease_keep_alive(lease).await?;
    let raw_key = format!("lockkit-bench/{namespace}/raw/{lease:016x}");

    // Warm up both paths: the session, connections, allocator.
    for _ in 0..50 {
        mutex.lock().await?.release().await?;
        raw_cycle(&mut raw, &raw_key, lease).await?;
    }
    let mut lockkit_times = Vec::new();
    let mut primitive_times = Vec::new();
    let mut raw_times = Vec::new();
    let key = locks.key("primitives")?;
    for _ in 0..ROUNDS {
        keeper.keep_alive().await?;
        keep_alive.message().await?;
        // One cycle of each path in turn, so that all three see the same load.
        for _ in 0..CYCLES_PER_ROUND {
            let started = Instant::now();
            mutex.lock().await?.release().await?;
            lockkit_times.push(started.elapsed());
            let started = Instant::now();
            primitive_cycle(&backend, &key).await?;
            primitive_times.push(started.elapsed());
            let started = Instant::now();
            raw_cycle(&mut raw, &raw_key, lease).await?;
            raw_times.push(started.elapsed());
        }
    }
    raw.lease_revoke(lease).await?;
    lockkit_times.sort();
    primitive_times.sort();
    raw_times.sort();
    let (lk50, raw50) = (percentile(&lockkit_times, 0.5), percentile(&raw_times, 0.5));
    println!(
        "## Uncontended acquire + release ({} cycles per path, the paths taking turns)",
        ROUNDS * CYCLES_PER_ROUND
    );
    println!();
    println!("| path | p50 ms | p99 ms | cycles/s |");
    println!("|---|---|---|---|");
    for (name, times) in [
        ("lockkit lock() + release()", &lockkit_times),
        (
            "backend try_acquire() + release() (no core)",
            &primitive_times,
        ),
        ("raw etcd-client txn put + delete", &raw_times),
    ] {
        let total: Duration = times.iter().sum();
        println!(
            "| {name} | {:.3} | {:.3} | {:.0} |",
            ms(percentile(times, 0.5)),
            ms(percentile(times, 0.99)),
            times.len() as f64 / total.as_secs_f64()
        );
    }
    println!();
    println!(
        "median ratio lockkit / raw floor: {:.3}x (target <= 1.2x)",
        lk50.as_secs_f64() / raw50.as_secs_f64()
    );
    println!();

    contended(&config, &namespace).await?;
    Ok(())
}

/// The backend's primitives alone, as the core calls them for one uncontended cycle.
async fn primitive_cycle(backend: &EtcdBackend, key: &LockKey) -> lockkit_core::Result<()> {
    let ttl = Duration::from_secs(10);
    let request = AcquireRequest::new(key.clone(), OwnerToken::generate()?, ttl, true);
    let sent_at = Instant::now();
    let Attempt::Granted(grant) = backend.try_acquire(&request).await? else {
        return Err(lockkit_core::Error::new(
            lockkit_core::ErrorKind::Backend,
            "etcd",
            "the benchmark's own key is held",
        ));
    };
    let mut lease = Lease::new(
        key.clone(),
        request.owner,
        grant.fencing_token,
        ttl,
        sent_at,
    );
    if let Some(handle) = grant.handle {
        lease = lease.with_handle(handle);
    }
    backend.release(&lease).await?;
    Ok(())
}

/// The floor: what the lock's acquire and release cost on the wire, done by hand.
async fn raw_cycle(
    client: &mut lockkit_etcd::etcd_client::Client,
    key: &str,
    lease: i64,
) -> Result<(), lockkit_etcd::etcd_client::Error> {
    let put = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "owner",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    client.txn(put).await?;
    client.delete(key, None).await?;
    Ok(())
}

async fn contended(config: &EtcdConfig, namespace: &str) -> Result<(), Box<dyn std::error::Error>> {
    let value = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for _ in 0..TASKS {
        let backend = EtcdBackend::connect(config.clone()).await?;
        let locks = LockClient::with_options(Arc::new(backend), namespace, LockOptions::default())?;
        let value = value.clone();
        tasks.spawn(async move {
            let mutex = locks.mutex("contended")?;
            let mut waits = Vec::with_capacity(INCREMENTS);
            for _ in 0..INCREMENTS {
                let asked = Instant::now();
                let guard = mutex.lock().await?;
                waits.push(asked.elapsed());
                // A read-modify-write that loses updates if two holders overlap.
                let seen = value.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                value.store(seen + 1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, lockkit_core::Error>(waits)
        });
    }
    let mut waits = Vec::new();
    while let Some(done) = tasks.join_next().await {
        waits.extend(done??);
    }
    let elapsed = started.elapsed();
    waits.sort();
    let total = TASKS * INCREMENTS;
    let value = value.load(Ordering::SeqCst);
    println!(
        "## Contended: {TASKS} tasks (own connection and session each) x {INCREMENTS} increments under one lock"
    );
    println!();
    println!("| increments | lost updates | seconds | increments/s | wait p50 ms | wait p99 ms |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {total} | {} | {:.2} | {:.0} | {:.2} | {:.2} |",
        total as u64 - value,
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        ms(percentile(&waits, 0.5)),
        ms(percentile(&waits, 0.99)),
    );
    Ok(())
}
