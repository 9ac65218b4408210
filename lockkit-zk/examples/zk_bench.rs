//! Benchmarks the ZooKeeper backend against the ensemble of `compose/up.sh zk`
//! (`LOCKKIT_TEST_ZK_URL`), in one run:
//!
//! 1. uncontended acquire + release through lockkit, side by side with the floor: a raw
//!    `create(EPHEMERAL_SEQUENTIAL)` + `get_children` + `delete` loop with the same client crate
//!    on the same ensemble, in alternating blocks so all see the same load. lockkit sends its
//!    create and listing back to back, so a second raw loop that does the same shows what the
//!    lock machinery costs on top of the best a hand-written loop can do;
//! 2. contended: 8 tasks × 250 increments of a shared value under one lock, once with the
//!    tasks sharing one backend (one session) and once with a backend (a session) per task.
//!
//! ```sh
//! compose/up.sh zk
//! cargo run --release -p lockkit-zk --example zk_bench
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::LockClient;
use lockkit_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

const BLOCKS: usize = 10;
const CYCLES_PER_BLOCK: usize = 200;
const TASKS: usize = 8;
const INCREMENTS: u64 = 250;

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> BenchResult<()> {
    let url = lockkit_core::testing::endpoint("LOCKKIT_TEST_ZK_URL")
        .ok_or("LOCKKIT_TEST_ZK_URL is not set: start the ensemble with compose/up.sh zk")?;
    let mut config = ZkConfig::from_url(&url)?;
    config.chroot = "/lockkit-bench".to_owned();
    let ns = format!("bench-{:08x}", rand::random::<u32>());

    let raw = zk::Client::connect(&config.hosts.join(",")).await?;
    let raw_parent = format!("{}/raw-{ns}", config.chroot);
    raw.mkdir(
        &raw_parent,
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await?;
    let locks = LockClient::with_options(
        Arc::new(ZkBackend::connect(config.clone()).await?),
        &ns,
        lockkit_core::LockOptions::default(),
    )?;
    let mutex = locks.mutex("uncontended")?;

    // Warm up both paths (connections, JIT on the servers).
    for _ in 0..100 {
        raw_cycle(&raw, &raw_parent).await?;
        raw_pipelined_cycle(&raw, &raw_parent).await?;
        mutex.lock().await?.release().await?;
    }
    let (mut floor, mut pipelined, mut lockkit) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..BLOCKS {
        for _ in 0..CYCLES_PER_BLOCK {
            let started = Instant::now();
            raw_cycle(&raw, &raw_parent).await?;
            floor.push(started.elapsed());
        }
        for _ in 0..CYCLES_PER_BLOCK {
            let started = Instant::now();
            raw_pipelined_cycle(&raw, &raw_parent).await?;
            pipelined.push(started.elapsed());
        }
        for _ in 0..CYCLES_PER_BLOCK {
            let started = Instant::now();
            let guard = mutex.lock().await?;
            guard.release().await?;
            lockkit.push(started.elapsed());
        }
    }
    let floor_p50 = percentile(&mut floor, 0.5);
    let pipelined_p50 = percentile(&mut pipelined, 0.5);
    let lockkit_p50 = percentile(&mut lockkit, 0.5);
    println!(
        "## uncontended acquire+release, {} cycles each, interleaved in {BLOCKS} blocks",
        BLOCKS * CYCLES_PER_BLOCK
    );
    println!("| loop | p50 | p99 | cycles/s |");
    println!("|---|---|---|---|");
    for (name, samples) in [
        ("raw create+get_children+delete (floor)", &mut floor),
        ("raw, create and get_children pipelined", &mut pipelined),
        ("lockkit-zk lock()+release()", &mut lockkit),
    ] {
        let total: Duration = samples.iter().sum();
        println!(
            "| {name} | {} | {} | {:.0} |",
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.99)),
            samples.len() as f64 / total.as_secs_f64()
        );
    }
    println!(
        "ratio lockkit / floor (p50): {:.2}x (target <= 1.2x); lockkit / pipelined raw: {:.2}x\n",
        lockkit_p50.as_secs_f64() / floor_p50.as_secs_f64(),
        lockkit_p50.as_secs_f64() / pipelined_p50.as_secs_f64()
    );
    raw.delete(&raw_parent, None).await?;

    println!("## contended: {TASKS} tasks x {INCREMENTS} increments of one shared value");
    println!("| setup | increments/s | wait p50 | wait p99 | lost updates |");
    println!("|---|---|---|---|---|");
    let shared = LockClient::new(ZkBackend::connect(config.clone()).await?);
    let one_session: Vec<LockClient> = (0..TASKS).map(|_| shared.clone()).collect();
    contended("8 tasks, one backend (one session)", one_session, &ns).await?;
    let mut own_sessions = Vec::new();
    for _ in 0..TASKS {
        own_sessions.push(LockClient::new(ZkBackend::connect(config.clone()).await?));
    }
    contended("8 tasks, a backend (session) each", own_sessions, &ns).await?;
    Ok(())
}

async fn raw_cycle(client: &zk::Client, parent: &str) -> BenchResult<()> {
    let prefix = format!("{parent}/lock-");
    let (_, sequence) = client
        .create(
            &prefix,
            &[],
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await?;
    client.list_children(parent).await?;
    client.delete(&format!("{prefix}{sequence}"), None).await?;
    Ok(())
}

async fn raw_pipelined_cycle(client: &zk::Client, parent: &str) -> BenchResult<()> {
    let prefix = format!("{parent}/lock-");
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let created = client.create(&prefix, &[], &options);
    let listed = client.list_children(parent);
    let (created, listed) = tokio::join!(created, listed);
    let (_, sequence) = created?;
    listed?;
    client.delete(&format!("{prefix}{sequence}"), None).await?;
    Ok(())
}

async fn contended(name: &str, clients: Vec<LockClient>, ns: &str) -> BenchResult<()> {
    let key = format!("{ns}-contended-{}", rand::random::<u32>());
    let value = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::<lockkit_core::Result<Vec<Duration>>>::new();
    for client in clients {
        let (value, key) = (value.clone(), key.clone());
        tasks.spawn(async move {
            let mutex = client.mutex(&key)?;
            let mut waits = Vec::with_capacity(INCREMENTS as usize);
            for _ in 0..INCREMENTS {
                let asked = Instant::now();
                let guard = mutex.lock().await?;
                waits.push(asked.elapsed());
                let seen = value.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                value.store(seen + 1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok(waits)
        });
    }
    let mut waits = Vec::new();
    while let Some(done) = tasks.join_next().await {
        waits.extend(done??);
    }
    let elapsed = started.elapsed();
    let expected = TASKS as u64 * INCREMENTS;
    println!(
        "| {name} | {:.0} | {} | {} | {} |",
        expected as f64 / elapsed.as_secs_f64(),
        ms(percentile(&mut waits, 0.5)),
        ms(percentile(&mut waits, 0.99)),
        expected - value.load(Ordering::SeqCst)
    );
    Ok(())
}

fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples.get(index).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
