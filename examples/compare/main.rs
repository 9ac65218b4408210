//! The comparison suite: the same workloads on every tier this build can reach, side by side.
//!
//! ```sh
//! cargo run --release --example compare -- [--quick] [--speed-only] [--tiers A,B] [--json FILE] [--svg FILE]
//! ```
//!
//! `--speed-only` runs W1, W2, W7 and W8 alone: no child processes, no server killed. `--quick`
//! runs W1 and W2 at a tenth of their size. `--tiers redis,zk-3` runs those tiers alone (the
//! names of the table's first column). The Markdown tables go to stdout (W1; W2 with a
//! row per contender and lockkit's ratios to each; W3-W5); `--json` writes every number
//! (each W2 round too), `--svg` the chart (`chart.rs`: W1 p50, W2 throughput, W2 max wait
//! and W3 recovery per tier, lockkit beside its floors and peer).
//!
//! Workloads (DESIGN.md §6):
//! - W1 uncontended: one client, N acquire+release cycles on one key: cycles/s, p50, p99,
//!   against the backend's raw-protocol floor (`floors.rs`; PostgreSQL has two, advisory
//!   locks and a lease table, `postgres_floors.rs`) and its peer (`peers.rs`: rslock on
//!   single-node Redis and Redlock), in alternating rounds. The Sentinel and Redlock tiers
//!   alternate with single-node Redis too, and report their p50 over its p50 in those rounds.
//! - W2 contended: 8 workers × M iterations of acquire → read a counter in the store the lock
//!   lives in → write it plus one → release (`store.rs`: GET and SET on Redis, a range and a
//!   put on etcd, getData and setData on ZooKeeper, a SELECT and an UPDATE of a row on
//!   PostgreSQL, each worker over its own connection: what a service does under a lock); the
//!   final value must be 8 × M per round, a shortfall is reported as lost updates. Three
//!   rounds, in each of which lockkit, its raw floor (a contended lock written by hand over the
//!   same protocol, `floors.rs` says which per backend; both of PostgreSQL's) and its peer
//!   (each worker with its own rslock client) run in turn, each round starting with the next
//!   one.
//!   Throughput, wait p50, p99 and max: medians over the rounds (every round is in the JSON).
//! - W3 holder crash: another process (this program, re-run with `--hold`) takes the lock with
//!   a 2 s TTL and is killed with SIGKILL; the time until this process is granted the lock.
//!   Not run on the memory tier, which cannot be shared between processes.
//! - W4 holder pause: another process takes the lock (2 s TTL) and then writes to a fenced
//!   resource every 20 ms, naively, without checking that it still holds the lock. It is
//!   stopped (SIGSTOP) for 4 s; meanwhile this process is granted the lock and writes with its
//!   own token; then the paused one resumes (SIGCONT). The resource keeps the highest token it
//!   has seen and rejects older ones. Reported: the paused holder's writes that arrived while
//!   this process held the lock (overlapping critical sections), how many of those it made
//!   although its guard already reported the lock lost, and how many stale writes the fenced
//!   resource rejected and accepted.
//! - W5 server failover: 4 clients contend for one key (5 ms critical sections); after 1 s the
//!   server that decides is killed with SIGKILL (the single Redis, the Sentinel primary, one
//!   Redlock node, the etcd leader, the ZooKeeper leader, the PostgreSQL server) and the run
//!   goes on for 6 s more (the single Redis is restarted, empty, 2 s after its death, and the
//!   PostgreSQL server too, from its data directory, recovering what it had committed:
//!   nothing else would bring them back). On PostgreSQL that is a crash and a restart, not a
//!   failover: promoting a synchronous standby needs the `postgres-ha` topology, which is no
//!   tier of the suite.
//!   Reported: critical sections that overlapped, stale writes the fenced resource rejected and
//!   accepted, the longest time without a grant, and the errors clients saw. The killed member
//!   is restarted afterwards (`compose/member.sh`); without the compose scripts W5 is skipped.
//!
//! - W6 leader election: a standby candidate waits while another process leads (2 s TTL);
//!   the leader is killed with SIGKILL: the time until the standby leads. Then leaders of two
//!   clients hand over by `resign()` while the other waits (25 times, 5 with `--quick`): the
//!   time from the call to the next leader, p50 and max. Not on Redlock, which refuses
//!   elections; the memory tier times the resigns only.
//! - W7 semaphore: 16 workers, each with its own client, share a semaphore of 4 permits and
//!   take a permit, hold it 5 ms and give it back, M times each (50, 10 with `--quick`):
//!   grants/s and their share of the ideal (every permit always held: 800/s), wait p50 and
//!   max, and the most holders seen at once (above 4 fails the workload). Runs with
//!   `--speed-only` too. Not on Redlock, which refuses semaphores.
//! - W8 read-write lock: 16 workers, each with its own client, share one read-write lock and
//!   take it M times each (as W7), one time in ten as a writer, otherwise as a reader, hold
//!   it 5 ms and give it back: grants/s, read and write waits (p50, max), the most readers
//!   seen at once (a writer inside with anyone fails the workload), and the writes granted
//!   ahead of one that asked at least a hold (5 ms) before them. Runs with
//!   `--speed-only` too. Not on Redlock, which refuses read-write locks.
//!
//! Every tier this build contains (cargo features `redis`, `zk`, `etcd`, `postgres`) whose
//! servers are reachable runs: the URLs come from
//! `LOCKKIT_TEST_{REDIS,SENTINEL,REDLOCK,ETCD,ZK,POSTGRES}_URL` or the endpoints file of
//! `compose/up.sh` (`compose/compare.sh` starts them). A tier whose
//! servers are missing is skipped with a notice, or fails the run under
//! `LOCKKIT_REQUIRE_BACKENDS=1`.
//!
//! A workload that fails on a tier (the tier cannot be reached, or its errors outlast a
//! `lock()`) shows `FAILED` in that tier's row, with the error listed under the table; the
//! other workloads and tiers still run, and the exit status is then 1.

use lockkit::LockkitConfig;
use serde::Serialize;

mod chart;
mod contended_floors;
mod election;
mod failed;
mod faults;
mod floor_servers;
mod floors;
mod peers;
mod permits;
#[cfg(feature = "postgres")]
mod postgres_floors;
mod report;
mod rwlock;
mod speed;
mod store;
mod targets;

use faults::{
    Failover, HolderCrash, HolderPause, failover, hold, hold_and_write, holder_crash, holder_pause,
};
use report::markdown;
use speed::{Contended, Uncontended, contended, uncontended};

#[derive(Debug, Clone, Copy)]
struct Sizes {
    uncontended_cycles: usize,
    workers: usize,
    iterations: usize,
    resigns: usize,
    permit_iterations: usize,
}

/// One tier's row. A workload that was not run, or failed, is `None`; a failed one is also
/// in `failures`.
#[derive(Debug, Default, Serialize)]
struct TierReport {
    target: String,
    tier: String,
    uncontended: Option<Uncontended>,
    contended: Option<Contended>,
    holder_crash: Option<HolderCrash>,
    holder_pause: Option<HolderPause>,
    failover: Option<Failover>,
    election: Option<election::ElectionTimes>,
    permits: Option<permits::PermitThroughput>,
    read_write: Option<rwlock::ReadWriteThroughput>,
    failures: Vec<Failure>,
}

/// A workload that failed on a tier, and why.
#[derive(Debug, Serialize)]
struct Failure {
    /// `connect`, `W1`, ... `W8`.
    workload: &'static str,
    error: String,
}

impl TierReport {
    /// The workload's result, or `None` after noting its failure.
    fn record<T>(&mut self, workload: &'static str, result: lockkit::Result<T>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                eprintln!("{} {workload} FAILED: {e}", self.target);
                self.failures.push(Failure {
                    workload,
                    error: failed::describe(&e),
                });
                None
            }
        }
    }

    fn failed(&self, workload: &str) -> bool {
        self.failures.iter().any(|f| f.workload == workload)
    }
}

/// Says what is wrong with the command line and what it accepts, and exits with status 2.
fn usage(problem: &str) -> ! {
    eprintln!(
        "compare: {problem}\nusage: compare [--quick] [--speed-only] [--tiers A,B] [--json FILE] [--svg FILE]"
    );
    std::process::exit(2)
}

/// `name` with this run's random suffix: runs of the suite on the same servers (engineers
/// measuring side by side) must not contend for each other's locks.
fn run_key(name: &str) -> String {
    static RUN: std::sync::LazyLock<u32> = std::sync::LazyLock::new(rand::random);
    format!("{name}-{:08x}", *RUN)
}

fn compare_error(message: String) -> lockkit::Error {
    lockkit::Error::new(lockkit::ErrorKind::Backend, "compare", message)
}

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, url, key, ttl_ms] = args.as_slice()
        && matches!(mode.as_str(), "--hold" | "--hold-and-write" | "--lead")
    {
        let ttl_ms = ttl_ms
            .parse()
            .map_err(|_| compare_error(format!("bad TTL {ttl_ms}")))?;
        return match mode.as_str() {
            "--hold" => hold(url, key, ttl_ms).await,
            "--lead" => election::lead(url, key, ttl_ms).await,
            _ => hold_and_write(url, key, ttl_ms).await,
        };
    }
    let (mut quick, mut speed_only, mut svg_path, mut json_path) = (false, false, None, None);
    let mut only: Option<Vec<String>> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--speed-only" => speed_only = true,
            "--tiers" => {
                let Some(names) = rest.next() else {
                    usage("--tiers needs a comma-separated list of tiers");
                };
                only = Some(names.split(',').map(str::to_owned).collect());
            }
            "--svg" | "--json" => {
                let Some(path) = rest.next() else {
                    usage(&format!("{arg} needs a file"));
                };
                let slot = if arg == "--svg" {
                    &mut svg_path
                } else {
                    &mut json_path
                };
                *slot = Some(path.clone());
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let sizes = if quick {
        Sizes {
            uncontended_cycles: 200,
            workers: 8,
            iterations: 25,
            resigns: 5,
            permit_iterations: 10,
        }
    } else {
        Sizes {
            uncontended_cycles: 2000,
            workers: 8,
            iterations: 250,
            resigns: 25,
            permit_iterations: 50,
        }
    };

    let mut targets = Vec::new();
    if only
        .as_ref()
        .is_none_or(|only| only.iter().any(|o| o == "memory"))
    {
        targets.push(("memory", "memory://".to_owned()));
    }
    targets.extend(targets::server_tiers(only.as_deref()).unwrap_or_else(|e| usage(&e)));
    // The other Redis tiers run W1 in the same rounds as single-node Redis, so that their
    // ratio to it is not the drift between two runs.
    // If it cannot be reached, its own row says so.
    let single_redis = match targets.iter().find(|(name, _)| *name == "redis") {
        Some((_, url)) => connect(url).await.ok(),
        None => None,
    };
    let mut reports = Vec::new();
    for (name, url) in targets {
        let reference = single_redis
            .as_ref()
            .filter(|_| matches!(name, "redis-sentinel" | "redis-cluster" | "redlock-5"))
            .map(|locks| speed::Reference {
                name: "redis",
                locks,
            });
        reports.push(run_tier(name, &url, reference, sizes, speed_only).await);
    }

    println!("{}", markdown(&reports));
    if let Some(path) = json_path {
        let json =
            serde_json::to_string_pretty(&reports).map_err(|e| compare_error(e.to_string()))?;
        std::fs::write(&path, json).map_err(|e| compare_error(format!("{path}: {e}")))?;
        eprintln!("wrote {path}");
    }
    if let Some(path) = svg_path {
        let svg = chart::svg(&reports).map_err(|e| compare_error(format!("the chart: {e}")))?;
        std::fs::write(&path, svg).map_err(|e| compare_error(format!("{path}: {e}")))?;
        eprintln!("wrote {path}");
    }
    let failures: usize = reports.iter().map(|r| r.failures.len()).sum();
    if failures > 0 {
        eprintln!("{failures} workload(s) failed");
        std::process::exit(1);
    }
    Ok(())
}

async fn connect(url: &str) -> lockkit::Result<lockkit::LockClient> {
    lockkit::connect(&LockkitConfig::from_url(url)?).await
}

/// Every workload on one tier; one that fails is noted in the row and the next one runs.
async fn run_tier(
    name: &'static str,
    url: &str,
    reference: Option<speed::Reference<'_>>,
    sizes: Sizes,
    speed_only: bool,
) -> TierReport {
    let mut report = TierReport {
        target: name.to_owned(),
        ..TierReport::default()
    };
    let Some(locks) = report.record("connect", connect(url).await) else {
        return report;
    };
    report.tier = locks.tier().to_string();
    eprintln!("running {name} ({})...", report.tier);
    let peer = match peers::Peer::for_target(name, url) {
        Ok(peer) => peer,
        Err(e) => {
            report.record::<()>(
                "connect",
                Err(compare_error(format!("{name}: the peer: {e}"))),
            );
            None
        }
    };
    let w1 = async {
        let mut floors = floors::Floor::connect(name, url)
            .await
            .map_err(|e| compare_error(format!("{name}: the raw floor: {e}")))?;
        let mut peer = match &peer {
            Some(peer) => {
                let key = format!("{{peer/w1-{:08x}}}", rand::random::<u32>());
                let client = peer
                    .client(&key)
                    .await
                    .map_err(|e| compare_error(format!("{name}: the peer: {e}")))?;
                Some((peer.describe(), client))
            }
            None => None,
        };
        let peer = peer.as_mut().map(|(what, client)| (*what, client));
        let w1 = uncontended(
            &locks,
            &mut floors,
            peer,
            reference,
            sizes.uncontended_cycles,
        )
        .await;
        for floor in floors {
            floor.clean_up().await;
        }
        w1
    };
    report.uncontended = report.record("W1", w1.await);
    let w2 = async {
        let floors = contended_floors::ContendedFloor::connect(name, url)
            .await
            .map_err(|e| compare_error(format!("{name}: the raw W2 floor: {e}")))?;
        let w2 = contended(
            name,
            (name != "memory").then_some(url),
            &locks,
            &floors,
            peer.as_ref(),
            sizes.workers,
            sizes.iterations,
        )
        .await;
        for floor in floors {
            floor.clean_up().await;
        }
        w2
    };
    report.contended = report.record("W2", w2.await);
    let shared = (name != "memory").then_some(url);
    report.permits = report
        .record(
            "W7",
            permits::permits(shared, &locks, sizes.permit_iterations).await,
        )
        .flatten();
    report.read_write = report
        .record(
            "W8",
            rwlock::read_write(shared, &locks, sizes.permit_iterations).await,
        )
        .flatten();
    if speed_only {
        return report;
    }
    if name != "memory" {
        report.holder_crash = report.record("W3", holder_crash(url, &locks).await);
        report.holder_pause = report.record("W4", holder_pause(url, &locks).await);
    }
    report.election = report
        .record(
            "W6",
            election::election(shared, &locks, sizes.resigns).await,
        )
        .flatten();
    report.failover = report.record("W5", failover(name, url).await).flatten();
    report
}
