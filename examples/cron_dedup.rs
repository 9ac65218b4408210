//! A job scheduled every second on 5 instances must run once per tick, not 5 times.
//!
//! ```sh
//! cargo run --example cron_dedup                                   # in-process (memory)
//! cargo run --features redis --example cron_dedup -- redis://127.0.0.1:6379
//! cargo run --example cron_dedup -- --quick                        # 5 ticks of 200 ms
//! ```
//!
//! Each instance, at each tick, tries the lock `job-<tick>` without waiting and runs the job
//! only if it got it. The lock is deliberately NOT released after the job: it expires by
//! itself after a few ticks, so an instance whose clock or scheduler runs late cannot take the
//! same tick again once the first one finished. (Releasing it would let a late instance run
//! the tick a second time.) On etcd and ZooKeeper a lock lives as long as its client's
//! session, renewed or not: there it lasts until the instance drops it at the end of the run.
//! The output is the number of runs per tick, which must be 1.
//! An instance whose `try_lock` fails (the lock service is unreachable, an election) skips
//! that tick, as a real scheduler would; its error is shown in the tick's row, and the exit
//! status is then 1.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockkit::{LockOptions, LockkitConfig};

#[path = "compare/failed.rs"]
mod failed;

const INSTANCES: usize = 5;

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let url = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "memory://".to_owned());
    let (ticks, period) = if quick {
        (5, Duration::from_millis(200))
    } else {
        (20, Duration::from_secs(1))
    };
    let config = LockkitConfig::from_url(&url)?;
    // One client per instance, as separate processes would have; the memory backend only
    // excludes within one client, so in-process runs share it.
    let shared = lockkit::connect(&config).await?;
    let namespace = format!("cron-{:08x}", rand::random::<u32>());
    let options = LockOptions::default()
        .with_ttl((period * 3).max(Duration::from_secs(2)))
        .with_auto_renew(false);
    let runs: Arc<Mutex<BTreeMap<usize, Vec<usize>>>> = Arc::default();
    let errors: Arc<Mutex<BTreeMap<usize, Vec<String>>>> = Arc::default();
    let mut clients = Vec::new();
    for _ in 0..INSTANCES {
        clients.push(if config.backend == lockkit::BackendKind::Memory {
            lockkit::LockClient::with_options(
                shared.backend().clone(),
                &namespace,
                options.clone(),
            )?
        } else {
            let mut config = config.clone();
            config.namespace.clone_from(&namespace);
            config.lock = options.clone();
            lockkit::connect(&config).await?
        });
    }
    let start = Instant::now() + Duration::from_millis(200);
    eprintln!("{INSTANCES} instances connected; the first tick fires in 200 ms");
    let mut instances = tokio::task::JoinSet::new();
    for (instance, locks) in clients.into_iter().enumerate() {
        let (runs, errors) = (runs.clone(), errors.clone());
        instances.spawn(async move {
            // Kept, not released, until every instance is done: a release would hand the tick
            // to an instance that fires later.
            let mut taken = Vec::new();
            for tick in 0..ticks {
                // Each instance's scheduler fires a little late, by a different amount.
                let jitter = Duration::from_millis(rand::random_range(0..20));
                tokio::time::sleep_until((start + period * tick as u32 + jitter).into()).await;
                match locks.mutex(&format!("job-{tick}"))?.try_lock().await {
                    Ok(Some(guard)) => {
                        runs.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .entry(tick)
                            .or_default()
                            .push(instance);
                        // The job runs here; the lock stays until it expires.
                        taken.push(guard);
                    }
                    Ok(None) => {}
                    Err(e) => errors
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(tick)
                        .or_default()
                        .push(format!("instance {instance}: {}", failed::describe(&e))),
                }
            }
            Ok::<_, lockkit::Error>(taken)
        });
    }
    let mut taken = Vec::new();
    while let Some(joined) = instances.join_next().await {
        taken.push(joined.map_err(|e| {
            lockkit::Error::new(lockkit::ErrorKind::Backend, "cron_dedup", e.to_string())
        })??);
    }
    drop(taken);
    let runs = runs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let errors = errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    println!(
        "{} instances, {ticks} ticks every {period:?} on {url}\n",
        INSTANCES
    );
    println!("| tick | runs | by instance | errors |");
    println!("|---:|---:|---|---|");
    let mut wrong = 0;
    for tick in 0..ticks {
        let by = runs.get(&tick).cloned().unwrap_or_default();
        wrong += usize::from(by.len() != 1);
        let failed = errors.get(&tick).map_or(String::new(), |e| e.join("; "));
        println!("| {tick} | {} | {by:?} | {failed} |", by.len());
    }
    println!("\n{} of {ticks} ticks ran exactly once", ticks - wrong);
    let failed: usize = errors.values().map(Vec::len).sum();
    if failed > 0 {
        println!("{failed} try_lock calls failed");
    }
    if wrong > 0 || failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
