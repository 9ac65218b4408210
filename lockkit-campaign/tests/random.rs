//! The randomized campaign in CI: about a minute over all tiers (12 s of contention and
//! random faults per tier, one test per tier, in parallel: they use different servers),
//! judged by `RandomOutcome::broken`; and a run whose workers do not pass their fencing
//! token, which must fail.
//!
//! The seed is fixed so that a failure here replays (`LOCKKIT_CAMPAIGN_SEED` picks another);
//! the full run, `compose/campaign.sh --random 10m`, draws a new one each time and prints it.

use std::path::PathBuf;
use std::time::Duration;

use lockkit_campaign::random::{Plan, RandomOutcome, markdown, run_random};
use lockkit_campaign::{Campaign, Tier, Topology};

fn campaign() -> Campaign {
    Campaign {
        worker_exe: PathBuf::from(env!("CARGO_BIN_EXE_lockkit-campaign")),
        dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("campaign-random"),
        ttl: Duration::from_secs(2),
    }
}

fn seed() -> u64 {
    std::env::var("LOCKKIT_CAMPAIGN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201)
}

fn randomized(topology: Topology, break_fencing: bool) -> Option<RandomOutcome> {
    let tier = Tier::of(topology)?;
    let plan = Plan {
        duration: Duration::from_secs(12),
        seed: seed(),
        break_fencing,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let row = runtime
        .block_on(run_random(&campaign(), &tier, &plan))
        .unwrap_or_else(|e| panic!("{}: {e}", tier.name()));
    println!("{}", markdown(std::slice::from_ref(&row)));
    Some(row)
}

fn holds(topology: Topology) {
    let Some(row) = randomized(topology, false) else {
        return;
    };
    let broken = row.broken();
    assert!(
        broken.is_empty(),
        "{}: {} (seed {}; {:?}; histories in {})",
        row.outcome.tier,
        broken.join("; "),
        row.seed,
        row.outcome.verdict.violations,
        row.outcome.dir.display()
    );
}

#[test]
fn redis() {
    holds(Topology::Redis);
}

#[test]
fn redis_sentinel() {
    holds(Topology::Sentinel);
}

#[test]
fn redlock() {
    holds(Topology::Redlock);
}

#[test]
fn etcd() {
    holds(Topology::Etcd);
}

#[test]
fn zk() {
    holds(Topology::Zk);
}

#[test]
fn postgres() {
    holds(Topology::Postgres);
}

/// Its first kill of the primary is a failover to the standby; the pair is brought up afresh
/// before and after the run.
#[test]
fn postgres_ha() {
    holds(Topology::PostgresHa);
}

/// Workers that present token 1 whatever their grant's (a service that does not pass its
/// fencing token along): the same checks must catch it.
#[test]
fn a_run_whose_workers_do_not_fence_fails() {
    let Some(row) = randomized(Topology::Redis, true) else {
        return;
    };
    let broken = row.broken();
    assert!(
        broken.iter().any(|b| b.starts_with("no duplicate token")),
        "the broken fencing went unnoticed: {broken:?}"
    );
}
