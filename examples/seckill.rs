//! Flash sale ("seckill"): 100 items of stock, 2000 purchase attempts at once (200 of the 1800
//! buyers try twice). Strategies side by side, on a Redis that holds the stock:
//!
//! - naive read-then-write (`GET`, then `SET stock-1`): oversells;
//! - the same read-then-write under a lockkit lock, on every tier that is up;
//! - an atomic Lua check-and-decrement;
//! - `DECR`, with a compensating `INCR` when it went below zero;
//! - a pre-filled quota list (`LPOP`) plus a per-user set (`SADD`) that refuses a second
//!   purchase by the same buyer.
//!
//! Printed per strategy: items sold, oversold, buyers who got two items, buyers who gave up
//! waiting for the lock (after 60 s, as a shop's request would time out), attempts per second.
//! A strategy that fails (a lock tier that cannot be reached, or whose errors outlast a
//! `lock()`) gets a row with its error, the others still run, and the exit status is 1, as
//! it is when a buyer gave up.
//!
//! ```sh
//! compose/up.sh redis sentinel redlock etcd zk
//! cargo run --release --all-features --example seckill          # -- --quick for 10 items
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

#[path = "compare/failed.rs"]
mod failed;
#[path = "compare/targets.rs"]
mod targets;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy)]
struct Sale {
    stock: i64,
    buyers: usize,
    repeat_buyers: usize,
}

#[derive(Debug, Clone)]
enum Strategy {
    Naive,
    /// A lock tier: its name in the tables and its URL.
    Locked(&'static str, String),
    Lua,
    DecrCompensate,
    QuotaList,
}

impl Strategy {
    fn name(&self) -> String {
        match self {
            Strategy::Naive => "naive read-then-write".into(),
            Strategy::Locked(target, _) => format!("read-then-write under a lock: {target}"),
            Strategy::Lua => "Lua check-and-decrement".into(),
            Strategy::DecrCompensate => "DECR, INCR back below zero".into(),
            Strategy::QuotaList => "quota list LPOP + per-user SADD".into(),
        }
    }
}

struct Keys {
    stock: String,
    quota: String,
    buyers: String,
}

/// How long a buyer waits for the lock before giving up.
const PATIENCE: Duration = Duration::from_secs(60);

/// How one purchase attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purchase {
    Bought,
    SoldOut,
    /// The lock was not granted within [`PATIENCE`].
    GaveUp,
}

impl From<bool> for Purchase {
    fn from(bought: bool) -> Self {
        if bought {
            Purchase::Bought
        } else {
            Purchase::SoldOut
        }
    }
}

/// One purchase attempt by `user` (under `locks`, for [`Strategy::Locked`]).
async fn buy(
    strategy: &Strategy,
    locks: Option<&LockClient>,
    con: &mut ConnectionManager,
    keys: &Keys,
    user: usize,
) -> Result<Purchase, BoxError> {
    Ok(Purchase::from(match strategy {
        Strategy::Naive => read_then_write(con, keys).await?,
        Strategy::Locked(target, _) => {
            let locks = locks.ok_or_else(|| format!("no lock client for {target}"))?;
            let guard = match locks.mutex("seckill")?.lock_timeout(PATIENCE).await {
                Ok(guard) => guard,
                Err(e) if matches!(e.kind(), lockkit::ErrorKind::Timeout) => {
                    return Ok(Purchase::GaveUp);
                }
                Err(e) => return Err(e.into()),
            };
            let bought = read_then_write(con, keys).await?;
            guard.release().await?;
            bought
        }
        Strategy::Lua => {
            let script = redis::Script::new(
                "local s = tonumber(redis.call('GET', KEYS[1]) or '0') \
                 if s > 0 then redis.call('DECR', KEYS[1]) return 1 end return 0",
            );
            script.key(&keys.stock).invoke_async::<i64>(con).await? == 1
        }
        Strategy::DecrCompensate => {
            let left: i64 = con.decr(&keys.stock, 1).await?;
            if left < 0 {
                let _: i64 = con.incr(&keys.stock, 1).await?;
                false
            } else {
                true
            }
        }
        Strategy::QuotaList => {
            let first: i64 = con.sadd(&keys.buyers, user).await?;
            if first == 0 {
                false
            } else {
                let item: Option<String> = con.lpop(&keys.quota, None).await?;
                item.is_some()
            }
        }
    }))
}

async fn read_then_write(con: &mut ConnectionManager, keys: &Keys) -> Result<bool, BoxError> {
    let stock: i64 = con.get(&keys.stock).await?;
    if stock <= 0 {
        return Ok(false);
    }
    // Other buyers run between the read and the write, as they would between processes.
    tokio::task::yield_now().await;
    let _: () = con.set(&keys.stock, stock - 1).await?;
    Ok(true)
}

struct Outcome {
    sold: usize,
    oversold: i64,
    double_buyers: usize,
    gave_up: usize,
    attempts_per_sec: f64,
}

async fn run(
    strategy: &Strategy,
    con: &ConnectionManager,
    sale: Sale,
) -> Result<Outcome, BoxError> {
    let tag = format!("{:08x}", rand::random::<u32>());
    let keys = Arc::new(Keys {
        stock: format!("seckill:{tag}:stock"),
        quota: format!("seckill:{tag}:quota"),
        buyers: format!("seckill:{tag}:buyers"),
    });
    let locks = match strategy {
        Strategy::Locked(_, url) => {
            let mut config = LockkitConfig::from_url(url)?;
            config.namespace = format!("seckill-{tag}");
            Some(lockkit::connect(&config).await?)
        }
        _ => None,
    };
    let mut setup = con.clone();
    let _: () = setup.set_ex(&keys.stock, sale.stock, 600).await?;
    let items: Vec<i64> = (0..sale.stock).collect();
    let _: () = setup.rpush(&keys.quota, items).await?;
    let _: () = setup.expire(&keys.quota, 600).await?;
    let _: () = setup.sadd(&keys.buyers, "nobody").await?;
    let _: () = setup.expire(&keys.buyers, 600).await?;

    // Buyers 0..repeat try twice.
    let mut attempts: Vec<usize> = (0..sale.buyers - sale.repeat_buyers).collect();
    attempts.extend(0..sale.repeat_buyers);
    let purchases: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let gave_up = Arc::new(AtomicUsize::new(0));
    let strategy = Arc::new(strategy.clone());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for user in attempts {
        let (strategy, locks, keys, purchases, gave_up, mut con) = (
            strategy.clone(),
            locks.clone(),
            keys.clone(),
            purchases.clone(),
            gave_up.clone(),
            con.clone(),
        );
        tasks.spawn(async move {
            match buy(&strategy, locks.as_ref(), &mut con, &keys, user).await? {
                Purchase::Bought => {
                    *purchases
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(user)
                        .or_default() += 1;
                }
                Purchase::SoldOut => {}
                Purchase::GaveUp => {
                    gave_up.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, BoxError>(())
        });
    }
    // The first failed attempt fails the strategy; dropping the set cancels the others.
    let mut failed = None;
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined.map_err(BoxError::from).and_then(|attempt| attempt) {
            failed = Some(e);
            break;
        }
    }
    drop(tasks);
    let elapsed = started.elapsed();
    let _: () = setup.del(&[&keys.stock, &keys.quota, &keys.buyers]).await?;
    if let Some(e) = failed {
        return Err(e);
    }
    let (sold, double_buyers) = {
        let purchases = purchases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (
            purchases.values().sum::<usize>(),
            purchases.values().filter(|n| **n > 1).count(),
        )
    };
    Ok(Outcome {
        sold,
        oversold: (sold as i64 - sale.stock).max(0),
        double_buyers,
        gave_up: gave_up.load(Ordering::Relaxed),
        attempts_per_sec: sale.buyers as f64 / elapsed.as_secs_f64(),
    })
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let sale = if quick {
        Sale {
            stock: 10,
            buyers: 200,
            repeat_buyers: 20,
        }
    } else {
        Sale {
            stock: 100,
            buyers: 2000,
            repeat_buyers: 200,
        }
    };
    let Some(redis_url) = lockkit_core::testing::endpoint("LOCKKIT_TEST_REDIS_URL") else {
        return Err("the stock lives in Redis: start it with compose/up.sh redis".into());
    };
    // redis-rs gives up on a reply after 500 ms by default: too short for a machine whose
    // cores are busy with 2000 waiting buyers, and the stock's replies are not what is measured.
    let con = ConnectionManager::new_with_config(
        redis::Client::open(redis_url.as_str())?,
        redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(10))),
    )
    .await?;

    let mut strategies = vec![Strategy::Naive];
    for (target, url) in targets::server_tiers(None).unwrap_or_default() {
        strategies.push(Strategy::Locked(target, url));
    }
    strategies.extend([Strategy::Lua, Strategy::DecrCompensate, Strategy::QuotaList]);

    println!(
        "{} items, {} purchase attempts ({} buyers try twice)\n",
        sale.stock, sale.buyers, sale.repeat_buyers
    );
    println!(
        "| strategy | sold | oversold | buyers with two items | gave up after {PATIENCE:?} | attempts/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut failures, mut gave_up) = (0, 0);
    for strategy in &strategies {
        match run(strategy, &con, sale).await {
            Ok(outcome) => {
                gave_up += outcome.gave_up;
                println!(
                    "| {} | {} | {} | {} | {} | {:.0} |",
                    strategy.name(),
                    outcome.sold,
                    outcome.oversold,
                    outcome.double_buyers,
                    outcome.gave_up,
                    outcome.attempts_per_sec
                );
            }
            Err(e) => {
                failures += 1;
                println!(
                    "| {} | FAILED: {} | | | | |",
                    strategy.name(),
                    failed::describe(e.as_ref())
                );
            }
        }
    }
    if failures > 0 {
        eprintln!("{failures} of {} strategies failed", strategies.len());
    }
    if gave_up > 0 {
        eprintln!("{gave_up} buyers gave up waiting for a lock");
    }
    if failures > 0 || gave_up > 0 {
        std::process::exit(1);
    }
    Ok(())
}
