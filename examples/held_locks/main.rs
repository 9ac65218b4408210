//! One process holding many locks with auto-renewal, per server tier: what it costs.
//!
//! ```sh
//! cargo run --release --features redis,etcd,zk --example held_locks -- \
//!     [--locks 10000] [--ttl 30s] [--hold 60s] [--tier zk-3 ...]
//! ```
//!
//! Per tier reachable (the compose endpoints, as for `examples/compare`; `--tier` picks some
//! by their names there: `redis`, `redis-sentinel`, `redis-cluster`, `redlock-5`, `etcd-3`,
//! `zk-3`, and `postgres` when built with its feature), this takes
//! `--locks` locks on distinct keys (64 acquisitions in flight), holds them for `--hold`
//! while the core's scheduler renews them, then releases them. It prints:
//! - the time to acquire them all;
//! - the process's CPU during the hold (user + system time from `/proc/self/stat`, as a
//!   share of one core);
//! - the renewal ticks seen during the hold (the scheduler's `renew_many` calls), the leases
//!   per tick, and how long a tick took (median and max) beside the median `ping` round trip:
//!   a tick that is one round trip on the wire takes about a ping plus the server's work;
//! - the servers' own count of requests per tick (`servers.rs` says what each tier counts);
//! - leases lost: guards reporting their lease lost at the end of the hold, tick answers
//!   saying `Lost`, and releases that found the lock no longer ours (or failed).
//!
//! Measurement only: nothing is asserted about speed. The exit status is 1 when a tier
//! failed or lost a lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lockkit::backend::LockBackend;
use lockkit::{BackendKind, Error, ErrorKind, LockClient, LockOptions, LockkitConfig, Result};

mod servers;
#[path = "../compare/targets.rs"]
mod targets;

use lockkit_core::testing::{Recording, Tick};
use servers::Counters;

/// Acquisitions (and releases) in flight at once.
const IN_FLIGHT: usize = 64;

#[derive(Debug, Clone)]
struct Args {
    locks: usize,
    ttl: Duration,
    hold: Duration,
    tiers: Vec<String>,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "held_locks: {problem}\nusage: held_locks [--locks N] [--ttl DURATION] [--hold DURATION] [--tier NAME]..."
    );
    std::process::exit(2)
}

/// `250ms`, `3s`, `2m`.
fn duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(number)),
        "s" => Some(Duration::from_secs(number)),
        "m" => Some(Duration::from_secs(number * 60)),
        _ => None,
    }
}

fn parse_args() -> Args {
    let mut args = Args {
        locks: 10_000,
        ttl: Duration::from_secs(30),
        hold: Duration::from_secs(60),
        tiers: Vec::new(),
    };
    let mut rest = std::env::args().skip(1);
    while let Some(flag) = rest.next() {
        let Some(value) = rest.next() else {
            usage(&format!("{flag} needs a value"));
        };
        match flag.as_str() {
            "--locks" => {
                args.locks = value
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("bad count {value:?}")))
            }
            "--ttl" | "--hold" => {
                let d =
                    duration(&value).unwrap_or_else(|| usage(&format!("bad duration {value:?}")));
                if flag == "--ttl" {
                    args.ttl = d;
                } else {
                    args.hold = d;
                }
            }
            "--tier" => args.tiers.push(value),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    args
}

/// User + system CPU time of this process so far (`/proc/self/stat`, in clock ticks of
/// 1/100 s, Linux's fixed `USER_HZ`).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: the fields are counted after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

fn error(message: String) -> Error {
    Error::new(ErrorKind::Backend, "held_locks", message)
}

/// The tier's backend, and where its servers count requests.
async fn connect(url: &str) -> Result<(Arc<dyn LockBackend>, Option<Counters>)> {
    let config = LockkitConfig::from_url(url)?;
    match config.backend {
        BackendKind::Redis | BackendKind::RedisSentinel => Ok((
            Arc::new(lockkit::redis::RedisBackend::connect(config.redis_config()?).await?),
            Counters::redis(url).await.ok(),
        )),
        BackendKind::RedisCluster => Ok((
            Arc::new(lockkit::redis::RedisClusterBackend::connect(config.redis_config()?).await?),
            Counters::redis_cluster(url).await.ok(),
        )),
        BackendKind::Redlock => Ok((
            Arc::new(lockkit::redis::RedlockBackend::connect(config.redlock_config()?).await?),
            Counters::redis(url).await.ok(),
        )),
        BackendKind::Etcd => Ok((
            Arc::new(lockkit::etcd::EtcdBackend::connect(config.etcd_config()?).await?),
            Some(Counters::Etcd(servers::hosts(url))),
        )),
        BackendKind::Zk => {
            let zk = lockkit::zk::ZkBackend::connect(lockkit::zk::ZkConfig::from_url(url)?).await?;
            let counters = Counters::Zk {
                hosts: servers::hosts(url),
                session: zk.session_id(),
            };
            Ok((Arc::new(zk), Some(counters)))
        }
        // No server-side request count for PostgreSQL here: its column shows n/a.
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => Ok((
            Arc::new(lockkit::postgres::PostgresBackend::connect(config.postgres_config()?).await?),
            None,
        )),
        other => Err(error(format!("{other:?} is not a server tier"))),
    }
}

/// One tier's figures.
#[derive(Debug)]
struct Row {
    tier: &'static str,
    acquire: Duration,
    cpu_share: Option<f64>,
    ticks: usize,
    leases_per_tick: f64,
    tick_p50: Duration,
    tick_max: Duration,
    ping_p50: Duration,
    requests_per_tick: Option<(f64, &'static str)>,
    /// Guards that reported their lease lost by the end of the hold.
    lost: usize,
    /// Tick answers that said `Lost`, up to the end of the hold.
    lost_by_ticks: usize,
    /// Releases that found the lock no longer ours, or failed.
    not_ours: usize,
    failed_renewals: usize,
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

async fn run(tier: &'static str, url: &str, args: &Args) -> Result<Row> {
    let (backend, counters) = connect(url).await?;
    let counting = Arc::new(Recording::new(backend.clone()));
    let namespace = format!("held-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(
        counting.clone(),
        &namespace,
        LockOptions::default().with_ttl(args.ttl),
    )?;
    let mut pings = Vec::new();
    for _ in 0..21 {
        let sent = Instant::now();
        backend.ping().await?;
        pings.push(sent.elapsed());
    }

    let started = Instant::now();
    let guards: Vec<_> = futures_util::stream::iter(0..args.locks)
        .map(|i| {
            let locks = &locks;
            async move { locks.mutex(&format!("lock-{i}"))?.lock().await }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let acquire = started.elapsed();
    eprintln!(
        "{tier}: {} locks acquired in {acquire:.1?}; holding for {:?}",
        guards.len(),
        args.hold
    );

    let before = match &counters {
        Some(c) => c.read().await.ok(),
        None => None,
    };
    let (cpu_before, hold_start) = (cpu_time(), Instant::now());
    tokio::time::sleep(args.hold).await;
    let (cpu_after, hold_end) = (cpu_time(), Instant::now());
    let after = match &counters {
        Some(c) => c.read().await.ok(),
        None => None,
    };
    let lost_in_hold = guards.iter().filter(|g| g.is_lost()).count();

    let released = futures_util::stream::iter(guards)
        .map(|guard| guard.release())
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let not_ours = released.iter().filter(|r| !matches!(r, Ok(true))).count();
    if let Some(Err(e)) = released.iter().find(|r| r.is_err()) {
        eprintln!("{tier}: a release failed: {e}");
    }

    let between = |from: Instant, to: Instant| -> Vec<Tick> {
        counting
            .ticks()
            .into_iter()
            .filter(|t| t.at >= from && t.at < to)
            .collect()
    };
    let ticks = between(hold_start, hold_end);
    // Ticks during the releases find released nodes gone: only those up to the hold's end.
    let all_ticks = between(started, hold_end);
    if let Some(e) = all_ticks.iter().find_map(|t| t.first_error.as_ref()) {
        eprintln!("{tier}: the first renewal error: {e}");
    }
    let held_for = hold_end - hold_start;
    let leases: usize = ticks.iter().map(|t| t.leases).sum();
    let requests_per_tick = match (before, after, &counters) {
        (Some(before), Some(after), Some(c)) if !ticks.is_empty() => Some((
            after.saturating_sub(before) as f64 / ticks.len() as f64,
            c.what(),
        )),
        _ => None,
    };
    Ok(Row {
        tier,
        acquire,
        cpu_share: match (cpu_before, cpu_after) {
            (Some(b), Some(a)) => Some(100.0 * (a - b).as_secs_f64() / held_for.as_secs_f64()),
            _ => None,
        },
        ticks: ticks.len(),
        leases_per_tick: if ticks.is_empty() {
            0.0
        } else {
            leases as f64 / ticks.len() as f64
        },
        tick_p50: median(ticks.iter().map(|t| t.took).collect()),
        tick_max: ticks.iter().map(|t| t.took).max().unwrap_or_default(),
        ping_p50: median(pings),
        requests_per_tick,
        lost: lost_in_hold,
        lost_by_ticks: all_ticks.iter().map(|t| t.lost).sum(),
        not_ours,
        failed_renewals: all_ticks.iter().map(|t| t.failed).sum(),
    })
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let tiers: Vec<_> = targets::server_tiers(None)
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| args.tiers.is_empty() || args.tiers.iter().any(|t| t == name))
        .collect();
    if tiers.is_empty() {
        usage("no server tier reachable (or none of those named by --tier)");
    }
    println!(
        "{} locks, TTL {:?}, held {:?}\n\n| tier | acquire | CPU (% of one core) | ticks | leases/tick | tick p50 / max | ping p50 | server requests/tick | lost (guards / ticks / at release) | failed renewals |\n|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        args.locks, args.ttl, args.hold
    );
    let mut bad = false;
    for (tier, url) in tiers {
        match run(tier, &url, &args).await {
            Ok(row) => {
                bad |= row.lost + row.lost_by_ticks + row.not_ours > 0;
                println!(
                    "| {} | {:.2} s | {} | {} | {:.0} | {:.1} / {:.1} ms | {:.2} ms | {} | {} / {} / {} | {} |",
                    row.tier,
                    row.acquire.as_secs_f64(),
                    row.cpu_share
                        .map_or("n/a".to_owned(), |c| format!("{c:.1}%")),
                    row.ticks,
                    row.leases_per_tick,
                    row.tick_p50.as_secs_f64() * 1e3,
                    row.tick_max.as_secs_f64() * 1e3,
                    row.ping_p50.as_secs_f64() * 1e3,
                    row.requests_per_tick
                        .map_or("n/a".to_owned(), |(n, what)| format!("{n:.1} ({what})")),
                    row.lost,
                    row.lost_by_ticks,
                    row.not_ours,
                    row.failed_renewals,
                );
            }
            Err(e) => {
                bad = true;
                println!("| {tier} | FAILED: {e} |");
            }
        }
    }
    if bad {
        std::process::exit(1);
    }
}
