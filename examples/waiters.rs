//! Idle waiters: what N waiters queued on one held key cost the servers while they wait, and
//! how the queue drains once the holder lets go.
//!
//! Per tier (redis, redis-sentinel, redlock-5, etcd-3, zk-3 when up; `--tiers` picks) and
//! per N (10, 100, 1000 by default), spread over one
//! client or several: a holder takes the key, N waiters queue behind it and wait for
//! `--wait` seconds, then the holder releases and every waiter takes the lock and gives it
//! back at once. Printed per run, from the servers' own counters summed over the members
//! (etcd: `grpc_server_started_total` over every method, and the MVCC range and txn totals of
//! `/metrics` on the client URL; ZooKeeper: `zk_packets_received` of `mntr`; Redis:
//! `total_commands_processed` of `INFO stats` on the server, the Sentinels' primary, or
//! every Redlock node), the request
//! rate during the wait, in total and per waiter, after subtracting the rate of an idle
//! window measured just before (other clients of the same servers); the attempts and waits
//! per waiter that the core asked of the backend (counted by `lockkit_core::testing::Recording`); whether the grants came in queue order (each grant's
//! fencing token is its queue position, the own key's create revision or node's czxid, so a
//! grant out of queue order shows as a token below the one before; on Redis the token is the
//! grant's, handed out in grant order, so the column says only that the grants were one at a
//! time); and the time from the release to the last grant.
//!
//! ```sh
//! compose/up.sh redis sentinel redlock etcd zk
//! cargo run --release --features redis,etcd,zk --example waiters -- --counts 10,100,1000 --clients 1 --wait 30
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use lockkit_core::testing::Recording;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "compare/failed.rs"]
mod failed;
#[path = "compare/targets.rs"]
mod targets;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The run's settings, from the command line.
#[derive(Debug, Clone)]
struct Settings {
    counts: Vec<usize>,
    clients: Vec<usize>,
    wait: Duration,
    idle: Duration,
    tiers: Vec<String>,
}

fn settings() -> Result<Settings, BoxError> {
    let mut settings = Settings {
        counts: vec![10, 100, 1000],
        clients: vec![1, 4],
        wait: Duration::from_secs(30),
        idle: Duration::from_secs(5),
        tiers: vec![
            "redis".into(),
            "redis-sentinel".into(),
            "redlock-5".into(),
            "etcd-3".into(),
            "zk-3".into(),
        ],
    };
    let mut args = std::env::args().skip(1);
    let list = |value: Option<String>| -> Result<Vec<usize>, BoxError> {
        let value = value.ok_or("a flag needs a value")?;
        Ok(value.split(',').map(str::parse).collect::<Result<_, _>>()?)
    };
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--counts" => settings.counts = list(args.next())?,
            "--clients" => settings.clients = list(args.next())?,
            "--wait" => settings.wait = Duration::from_secs(list(args.next())?[0] as u64),
            "--idle" => settings.idle = Duration::from_secs(list(args.next())?[0] as u64),
            "--tiers" => {
                settings.tiers = args
                    .next()
                    .ok_or("--tiers needs a value")?
                    .split(',')
                    .map(str::to_owned)
                    .collect();
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(settings)
}

/// The servers' request counters, summed over the members.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    /// etcd: RPCs started (unary calls and streams); ZooKeeper: packets received; Redis:
    /// commands processed.
    requests: f64,
    /// etcd: MVCC ranges plus txns; ZooKeeper: always 0.
    reads: f64,
}

/// The `host:port` of every member in a `etcd://`, `zk://`, `redis://` or `redlock://` URL
/// (of a `redis+sentinel://` URL: the Sentinels).
fn members(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    hosts.split(',').map(str::to_owned).collect()
}

/// Sends `request` to `member` and reads the answer until `complete` says it is whole or the
/// server closes the connection, within 10 s.
async fn ask_until(
    member: &str,
    request: &[u8],
    complete: impl Fn(&str) -> bool + Send + Sync,
) -> Result<String, BoxError> {
    let exchange = async {
        let mut stream = TcpStream::connect(member).await?;
        stream.write_all(request).await?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut chunk).await?;
            answer.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&answer);
            if n == 0 || complete(&text) {
                return Ok::<_, BoxError>(text.into_owned());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| format!("{member} did not answer within 10 s"))?
}

/// Sends `request` to `member` and reads until the server closes the connection.
async fn ask(member: &str, request: &[u8]) -> Result<String, BoxError> {
    ask_until(member, request, |_| false).await
}

fn sum_of<'a>(text: &'a str, name: &'a str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ', '\t']))
        })
        .filter_map(|line| line.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// A RESP command of `args`, followed by `QUIT` (if `quit`) so that the server closes the
/// connection after its answer (a Sentinel does not know `QUIT`).
fn resp(args: &[&str], quit: bool) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len());
    for arg in args {
        out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    if quit {
        out.push_str("*1\r\n$4\r\nQUIT\r\n");
    }
    out.into_bytes()
}

/// The servers that take a Redis tier's requests: the server, every Redlock node, or the
/// primary the first Sentinel names.
async fn redis_servers(tier: &str, url: &str) -> Result<Vec<String>, BoxError> {
    if tier != "redis-sentinel" {
        return Ok(members(url));
    }
    let master = url
        .rsplit('/')
        .next()
        .ok_or("a Sentinel URL names its master")?;
    let sentinel = members(url).remove(0);
    let answer = ask_until(
        &sentinel,
        &resp(&["SENTINEL", "get-master-addr-by-name", master], false),
        |text| text.lines().count() >= 5,
    )
    .await?;
    let lines: Vec<&str> = answer.lines().collect();
    match lines.as_slice() {
        [_, _, host, _, port, ..] => Ok(vec![format!("{host}:{port}")]),
        _ => Err(format!("the Sentinel answered {answer:?}").into()),
    }
}

async fn counters(tier: &str, url: &str) -> Result<Counters, BoxError> {
    let mut total = Counters::default();
    if tier.starts_with("redis") || tier.starts_with("redlock") {
        for server in redis_servers(tier, url).await? {
            let text = ask(&server, &resp(&["INFO", "stats"], true)).await?;
            total.requests += text
                .lines()
                .find_map(|line| line.strip_prefix("total_commands_processed:"))
                .and_then(|n| n.trim().parse::<f64>().ok())
                .ok_or("INFO stats without total_commands_processed")?;
        }
        return Ok(total);
    }
    for member in members(url) {
        if tier.starts_with("etcd") {
            let request = format!("GET /metrics HTTP/1.0\r\nHost: {member}\r\n\r\n");
            let text = ask(&member, request.as_bytes()).await?;
            total.requests += sum_of(&text, "grpc_server_started_total");
            total.reads += sum_of(&text, "etcd_debugging_mvcc_range_total")
                + sum_of(&text, "etcd_debugging_mvcc_txn_total");
        } else {
            let text = ask(&member, b"mntr").await?;
            total.requests += sum_of(&text, "zk_packets_received");
        }
    }
    Ok(total)
}

/// Request rates over a window.
fn rates(before: Counters, after: Counters, window: Duration) -> (f64, f64) {
    let secs = window.as_secs_f64();
    (
        (after.requests - before.requests) / secs,
        (after.reads - before.reads) / secs,
    )
}

/// One run's results.
#[derive(Debug)]
struct Outcome {
    idle: (f64, f64),
    waiting: (f64, f64),
    attempts_per_waiter: f64,
    waits_per_waiter: f64,
    in_queue_order: bool,
    drain: Duration,
}

async fn connect(url: &str, namespace: &str) -> Result<LockClient, BoxError> {
    let mut config = LockkitConfig::from_url(url)?;
    config.namespace = namespace.to_owned();
    Ok(lockkit::connect(&config).await?)
}

async fn run(
    tier: &str,
    url: &str,
    waiters: usize,
    client_count: usize,
    settings: &Settings,
) -> Result<Outcome, BoxError> {
    let namespace = format!("waiters-{:08x}", rand::random::<u32>());
    let holder_client = connect(url, &namespace).await?;
    let mut clients = Vec::new();
    let mut counting = Vec::new();
    for _ in 0..client_count {
        let plain = connect(url, &namespace).await?;
        let backend = Arc::new(Recording::new(plain.backend().clone()));
        counting.push(backend.clone());
        clients.push((
            LockClient::with_options(backend, &namespace, plain.options().clone())?,
            plain,
        ));
    }
    let holder = holder_client.mutex("key")?.lock().await?;
    // Past the connections' start-up traffic (leases, sessions, the first renewals).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let idle_from = counters(tier, url).await?;
    tokio::time::sleep(settings.idle).await;
    let idle = rates(idle_from, counters(tier, url).await?, settings.idle);

    let grants = Arc::new(StdMutex::new(Vec::<(usize, u64, Instant)>::new()));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let mutex = clients[i % client_count].0.mutex("key")?;
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock_timeout(Duration::from_secs(900)).await?;
            let token = guard.fencing_token().0;
            grants
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((i, token, Instant::now()));
            guard.release().await?;
            Ok::<_, lockkit::Error>(())
        }));
    }
    let calls = |method: &str| counting.iter().map(|c| c.count(method)).sum::<usize>();
    let attempts = || calls("try_acquire");
    let waits = || calls("wait_for_change");
    let queueing = Instant::now();
    while attempts() < waiters {
        if queueing.elapsed() > Duration::from_secs(120) {
            return Err(format!("only {} of {waiters} waiters queued in 120 s", attempts()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every waiter has gone into its wait, and has had the time to set up its watch: the
    // window shows what waiting costs, not what queueing did.
    while waits() < waiters {
        if queueing.elapsed() > Duration::from_secs(120) {
            return Err(format!("only {} of {waiters} waiters waited in 120 s", waits()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (attempts_from, waits_from) = (attempts(), waits());
    let waiting_from = counters(tier, url).await?;
    tokio::time::sleep(settings.wait).await;
    let waiting = rates(waiting_from, counters(tier, url).await?, settings.wait);
    let per_waiter = |n: usize| n as f64 / waiters as f64;
    let attempts_per_waiter = per_waiter(attempts() - attempts_from);
    let waits_per_waiter = per_waiter(waits() - waits_from);

    let released = Instant::now();
    holder.release().await?;
    for task in tasks {
        task.await??;
    }
    let grants = std::mem::take(
        &mut *grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let in_queue_order = grants.windows(2).all(|w| w[0].1 < w[1].1);
    let drain = grants
        .last()
        .map_or(Duration::ZERO, |last| last.2.duration_since(released));
    for (client, plain) in clients {
        client.close().await;
        plain.close().await;
    }
    holder_client.close().await;
    Ok(Outcome {
        idle,
        waiting,
        attempts_per_waiter,
        waits_per_waiter,
        in_queue_order,
        drain,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = settings()?;
    let tiers: BTreeMap<_, _> = targets::server_tiers(None)
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| settings.tiers.iter().any(|t| t == name))
        .collect();
    println!(
        "queue waiters on one held key, TTL 10 s (the default), wait {} s, idle baseline {} s",
        settings.wait.as_secs(),
        settings.idle.as_secs()
    );
    println!();
    println!(
        "| tier | waiters | clients | server req/s waiting (idle) | req/s per waiter | etcd range+txn/s waiting (idle) | attempts / waiter | waits / waiter | queue order | drain |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    let mut failed = false;
    for (tier, url) in &tiers {
        for &waiters in &settings.counts {
            for &clients in &settings.clients {
                if clients > waiters {
                    continue;
                }
                match run(tier, url, waiters, clients, &settings).await {
                    Ok(o) => {
                        let net = o.waiting.0 - o.idle.0;
                        println!(
                            "| {tier} | {waiters} | {clients} | {:.1} ({:.1}) | {:.4} | {} | {:.2} | {:.2} | {} | {} ms |",
                            o.waiting.0,
                            o.idle.0,
                            net / waiters as f64,
                            if tier.starts_with("etcd") {
                                format!("{:.1} ({:.1})", o.waiting.1, o.idle.1)
                            } else {
                                "-".to_owned()
                            },
                            o.attempts_per_waiter,
                            o.waits_per_waiter,
                            if o.in_queue_order { "FIFO" } else { "NOT FIFO" },
                            o.drain.as_millis(),
                        );
                        failed |= !o.in_queue_order;
                    }
                    Err(e) => {
                        failed = true;
                        println!(
                            "| {tier} | {waiters} | {clients} | failed: {} |",
                            failed::describe(e.as_ref())
                        );
                    }
                }
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
