//! The campaign's CI subset: on each tier, the scenarios that prove its guarantees, checked
//! against the pass criteria of `src/expect.rs`:
//!
//! | tier | scenarios | must show |
//! |---|---|---|
//! | every tier | holder pause | an overlap (the pause outlasts the TTL), the stale write refused, none accepted, no foreign release, nothing leaked |
//! | every tier but Sentinel | partition | the cut-off holder's lost signal before anyone else's grant: no overlap |
//! | redis, redlock-5 | delayed replies | no grant after its validity, no overlap |
//! | redlock-5 | delayed restart | no overlap when 3 of 5 nodes crash and come back after the TTL |
//! | etcd-3, zk-3 | leader isolation, server crash, queued waiter expires | no grant on the minority side; no overlap, no stale write, no token regression when the leader dies; an expired waiter is not granted |
//! | redis, etcd-3, zk-3 | election: holder pause, partition | with election candidates, what the lock rows must show: the paused leader's writes refused by term; the partitioned leader's lost signal before another is elected |
//! | redis-sentinel | election: holder pause, server crash | as above; after the primary's crash a candidate leads on the promoted replica (the failover may elect twice: the tier's hole) |
//! | etcd-3, zk-3 | election: server crash | no overlap, no stale write, no term regression when the leader's server dies |
//! | redlock-5 | election: holder pause | shown as not applicable (Redlock has no elections), not run |
//! | redis | semaphore and rwlock: holder pause; semaphore and rwlock contention | the holder-pause criteria with permits of 2 (one held by a companion) and with writers beside a reader; never more than 3 holders of a semaphore of 3, never a writer beside anyone, in 10,000 grants of 8 processes |
//! | redis-sentinel | semaphore: server crash; rwlock: holder pause | the criteria of those rows |
//! | redis-cluster | holder pause, server crash; election: server crash; semaphore: holder pause; rwlock: holder pause | the holder-pause criteria; after the crash of the lock's slot's primary the waiter is granted on the promoted replica (overlaps reported, not limited: the tier's failover hole); an election candidate leads there; the primitives' holder-pause criteria |
//! | etcd-3, zk-3 | semaphore and rwlock: partition, server crash | the cut-off holder's lost signal before anyone's grant, and no overlap when the leader dies |
//! | redlock-5 | semaphore and rwlock: holder pause | shown as not applicable (Redlock has neither), not run |
//! | postgres | holder pause, partition, delayed replies, server crash, queued waiter expires | the holder-pause criteria; the cut-off holder's lost signal before anyone's grant; no grant after its validity; no overlap, no stale write, no token regression when the server is killed and restarted; with locks of 8 s (`postgres_durable`), the holder keeps its grant through the crash (it was on the server's disk); an expired waiter is not granted |
//! | postgres | election: holder pause, partition, server crash; semaphore and rwlock: partition, server crash | what the lock rows must show, with candidates, permits and writers |
//! | postgres-ha | holder pause, partition, server crash; election and semaphore: server crash | the holder-pause criteria; the partition's, through a proxy in front of each server; when the primary is killed and the synchronous standby promoted, no overlap, no stale write, no token regression, and the waiter granted on the new primary |
//!
//! A tier's rows of another primitive (election, semaphore, rwlock) must have run where its
//! backend has the primitive, and must show as not applicable where it has none: a backend
//! that lost one fails here instead of passing with rows that did nothing.
//!
//! The contention rows run on Redis only here: on etcd and ZooKeeper their 10,000 grants take
//! minutes in a debug build (`compose/campaign.sh` runs them on every tier, in release).
//!
//! One test per row (a tier and a scenario), each on a key of its own, so rows run side by
//! side. The rows that kill or stop a tier's servers (server crash, leader isolation, delayed
//! restart) would disturb every other test of that tier: `.config/nextest.toml` gives them
//! the second server set of `compose/test.sh`, one at a time per tier. On postgres-ha each
//! such row brings the pair up first and afresh after its failover (`compose/up.sh
//! postgres-ha`). Every run's histories
//! stay in `target/tmp/campaign-smoke/`.

use std::path::PathBuf;
use std::time::Duration;

use lockkit_campaign::run::Primitive;
use lockkit_campaign::{Campaign, Outcome, Scenario, Tier, Topology, report, run_all};

/// Runs keep their histories under the test target's scratch directory.
fn campaign(ttl: Duration) -> Campaign {
    Campaign {
        worker_exe: PathBuf::from(env!("CARGO_BIN_EXE_lockkit-campaign")),
        dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("campaign-smoke"),
        ttl,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Whether a tier's backend has the primitives beyond the mutex (elections, semaphores,
/// read-write locks), as the smoke test expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primitives {
    All,
    MutexOnly,
}

fn smoke(topology: Topology, primitives: Primitives, scenario: Scenario) {
    smoke_with_ttl(topology, primitives, scenario, Duration::from_secs(2));
}

/// Runs `scenario` on the tier of `topology` with locks of `ttl`, checks the row against its
/// tier's criteria (and which primitives the backend has), and returns the row (none when
/// the tier is not up).
fn smoke_with_ttl(
    topology: Topology,
    primitives: Primitives,
    scenario: Scenario,
    ttl: Duration,
) -> Option<Outcome> {
    let tier = Tier::of(topology)?;
    let campaign = campaign(ttl);
    let rows = runtime()
        .block_on(run_all(&campaign, &[tier], &[scenario]))
        .unwrap_or_else(|e| panic!("{e}"));
    let table = report::markdown(&rows);
    println!("{table}");
    let broken: Vec<String> = rows
        .iter()
        .filter(|(_, broken)| !broken.is_empty())
        .map(|(o, broken)| {
            format!(
                "{} / {}: {} ({:?}; histories in {})",
                o.tier,
                o.scenario,
                broken.join("; "),
                o.verdict.violations,
                o.dir.display()
            )
        })
        .collect();
    assert!(broken.is_empty(), "{}\n{table}", broken.join("\n"));
    for (o, _) in rows.iter().filter(|(o, _)| {
        Scenario::named(o.scenario).is_some_and(|s| s.primitive() != Primitive::Lock)
    }) {
        assert_eq!(
            o.not_applicable.is_none(),
            primitives == Primitives::All,
            "{} / {}: expected {primitives:?}, got {:?}\n{table}",
            o.tier,
            o.scenario,
            o.not_applicable
        );
    }
    rows.into_iter().next().map(|(o, _)| o)
}

/// `rows!(tier, Topology, Primitives, { test: Scenario, ... })`: a module `tier` with one test
/// per row. A row that kills or stops the tier's servers is named after its scenario's end
/// (`server_crash`, `leader_isolation`, `delayed_restart`): `.config/nextest.toml` picks those
/// by name for the second server set.
macro_rules! rows {
    ($tier:ident, $topology:expr, $primitives:expr, { $($row:ident: $scenario:expr),+ $(,)? }) => {
        mod $tier {
            use super::*;
            $(
                #[test]
                fn $row() {
                    smoke($topology, $primitives, $scenario);
                }
            )+
        }
    };
}

rows!(redis, Topology::Redis, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    partition: Scenario::Partition,
    delayed_replies: Scenario::DelayedReplies,
    election_holder_pause: Scenario::ElectionHolderPause,
    election_partition: Scenario::ElectionPartition,
    semaphore_holder_pause: Scenario::SemaphoreHolderPause,
    rwlock_holder_pause: Scenario::RwLockHolderPause,
    semaphore_contention: Scenario::SemaphoreContention,
    rwlock_contention: Scenario::RwLockContention,
});

rows!(redis_sentinel, Topology::Sentinel, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    election_holder_pause: Scenario::ElectionHolderPause,
    // A candidate elected on the promoted replica proclaims there (its scripts are loaded
    // first): with NOSCRIPT unhandled it stayed leaderless for 120 s.
    election_server_crash: Scenario::ElectionServerCrash,
    semaphore_server_crash: Scenario::SemaphoreServerCrash,
    rwlock_holder_pause: Scenario::RwLockHolderPause,
});

rows!(redis_cluster, Topology::Cluster, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    server_crash: Scenario::ServerCrash,
    election_server_crash: Scenario::ElectionServerCrash,
    semaphore_holder_pause: Scenario::SemaphoreHolderPause,
    rwlock_holder_pause: Scenario::RwLockHolderPause,
});

rows!(redlock, Topology::Redlock, Primitives::MutexOnly, {
    holder_pause: Scenario::HolderPause,
    partition: Scenario::Partition,
    delayed_replies: Scenario::DelayedReplies,
    delayed_restart: Scenario::DelayedRestart,
    election_holder_pause: Scenario::ElectionHolderPause,
    semaphore_holder_pause: Scenario::SemaphoreHolderPause,
    rwlock_holder_pause: Scenario::RwLockHolderPause,
});

rows!(etcd, Topology::Etcd, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    partition: Scenario::Partition,
    leader_isolation: Scenario::LeaderIsolation,
    server_crash: Scenario::ServerCrash,
    queued_waiter_expires: Scenario::QueuedWaiterExpires,
    election_holder_pause: Scenario::ElectionHolderPause,
    election_partition: Scenario::ElectionPartition,
    election_server_crash: Scenario::ElectionServerCrash,
    semaphore_partition: Scenario::SemaphorePartition,
    semaphore_server_crash: Scenario::SemaphoreServerCrash,
    rwlock_partition: Scenario::RwLockPartition,
    rwlock_server_crash: Scenario::RwLockServerCrash,
});

rows!(zk, Topology::Zk, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    partition: Scenario::Partition,
    leader_isolation: Scenario::LeaderIsolation,
    server_crash: Scenario::ServerCrash,
    queued_waiter_expires: Scenario::QueuedWaiterExpires,
    election_holder_pause: Scenario::ElectionHolderPause,
    election_partition: Scenario::ElectionPartition,
    election_server_crash: Scenario::ElectionServerCrash,
    semaphore_partition: Scenario::SemaphorePartition,
    semaphore_server_crash: Scenario::SemaphoreServerCrash,
    rwlock_partition: Scenario::RwLockPartition,
    rwlock_server_crash: Scenario::RwLockServerCrash,
});

rows!(postgres, Topology::Postgres, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    partition: Scenario::Partition,
    delayed_replies: Scenario::DelayedReplies,
    server_crash: Scenario::ServerCrash,
    queued_waiter_expires: Scenario::QueuedWaiterExpires,
    election_holder_pause: Scenario::ElectionHolderPause,
    election_partition: Scenario::ElectionPartition,
    election_server_crash: Scenario::ElectionServerCrash,
    semaphore_partition: Scenario::SemaphorePartition,
    semaphore_server_crash: Scenario::SemaphoreServerCrash,
    rwlock_partition: Scenario::RwLockPartition,
    rwlock_server_crash: Scenario::RwLockServerCrash,
});

// Each server crash here is a failover to the standby, and a new pair after it.
rows!(postgres_ha, Topology::PostgresHa, Primitives::All, {
    holder_pause: Scenario::HolderPause,
    partition: Scenario::Partition,
    server_crash: Scenario::ServerCrash,
    election_server_crash: Scenario::ElectionServerCrash,
    semaphore_server_crash: Scenario::SemaphoreServerCrash,
});

/// On one PostgreSQL server a grant survives a crash of the server (it was on its disk before
/// the holder heard of it). At the TTL of the rows above (2 s) the server's restart (about
/// 2 s here: `pg_ctl start` and crash recovery) outlasts what is left of the holder's
/// validity, so the holder's lost signal fires and the row cannot tell a kept grant from a
/// forgotten one. With locks of 8 s the holder renews its grant on the restarted server and
/// keeps it, and the waiter is granted only once the holder has released.
mod postgres_durable {
    use super::*;

    #[test]
    fn server_crash() {
        let Some(row) = smoke_with_ttl(
            Topology::Postgres,
            Primitives::All,
            Scenario::ServerCrash,
            Duration::from_secs(8),
        ) else {
            return;
        };
        assert!(
            row.verdict.lost_lag.iter().all(Option::is_none),
            "the holder lost its grant in the crash ({:?} after it; histories in {})",
            row.verdict.lost_lag,
            row.dir.display()
        );
    }
}

/// The leftover check catches a lock nobody released: a run whose only lock is held by a
/// client that never lets go reports it as leaked.
#[test]
fn a_lock_left_behind_is_reported_as_leaked() {
    let Some(tier) = Tier::of(Topology::Redis) else {
        return;
    };
    let campaign = campaign(Duration::from_secs(1));
    runtime().block_on(async {
        let run = lockkit_campaign::Run::new(&campaign, &tier, "leak-check")
            .await
            .expect("a run");
        let holder = run.observer().await.expect("a client");
        let guard = holder
            .mutex(&run.key)
            .expect("a key")
            .lock()
            .await
            .expect("the lock");
        let outcome = run.finish(Vec::new()).await.expect("an outcome");
        assert_eq!(outcome.leaked, 1, "the held lock was not found");
        guard.release().await.expect("release");
    });
}

/// The leftover check sees a semaphore's permit nobody gave back: a run whose semaphore has
/// a permit held by a client that never lets go reports it as leaked.
#[test]
fn a_permit_left_behind_is_reported_as_leaked() {
    let Some(tier) = Tier::of(Topology::Redis) else {
        return;
    };
    let campaign = campaign(Duration::from_secs(1));
    runtime().block_on(async {
        let mut run = lockkit_campaign::Run::new(&campaign, &tier, "permit-leak-check")
            .await
            .expect("a run");
        run.primitive = Primitive::Semaphore;
        let holder = run.observer().await.expect("a client");
        let permit = holder
            .semaphore(&run.key, run.permits)
            .expect("a key")
            .acquire()
            .await
            .expect("a permit");
        let outcome = run.finish(Vec::new()).await.expect("an outcome");
        assert_eq!(outcome.leaked, 1, "the held permit was not found");
        permit.release().await.expect("release");
    });
}
