//! The randomized campaign: on each tier, eight worker processes contend on three keys for a
//! while, and a nemesis draws faults at random, one after another, from those the tier's
//! topology supports. The whole merged history is then judged.
//!
//! A run is reproducible in its schedule (which fault, on whom, for how long, in what order)
//! from the seed it prints; the timing of the workers against it is the machine's.
//!
//! The faults: a worker stopped (`SIGSTOP`) past its TTL, a worker killed (`SIGKILL`) and
//! replaced, one worker's connections blackholed, its replies delayed, every worker's replies
//! dropped for a moment (through one fault proxy per worker; not on Sentinel or the cluster,
//! whose clients reach the primary at the address the servers announce; on the PostgreSQL
//! pair, a proxy port in front of each server), and the deciding servers killed and
//! restarted or paused (see [`Tier::deciders`]; on the PostgreSQL pair, the first kill of the
//! primary is a failover to the standby, and the pair is brought up afresh after the run).
//!
//! What must hold on every tier ([`RandomOutcome::broken`]): no stale write accepted by the
//! fenced resource, no fencing token regression or duplicate, no foreign release or extend,
//! no grant handed over with its validity gone or under its floor, nothing left on the
//! servers, and no overlap
//! that the tier's documentation does not explain. Overlaps are explained on every tier by a
//! holder stopped past its TTL (no lease survives that; fencing is what makes it harmless),
//! and on the Redis tiers also by a fault of their servers (single Redis and Redlock forget
//! grants in a crash without persistence, and a Sentinel or Cluster failover can promote a
//! replica that never saw the grant, or leave a paused primary granting beside the new one
//! until it learns it was replaced); on etcd, ZooKeeper and both PostgreSQL tiers no server
//! fault explains one (see [`Topology::keeps_grants`]). What two holders of such a split
//! brain do is counted apart: a write the resource ordered by token, and a lock that vanished
//! with the primary that lost. A partitioned holder must see its lost signal before anyone
//! else is granted: an overlap after a partition is a violation.

use std::time::{Duration, Instant};

use lockkit_core::testing::check::Overlap;
use lockkit_core::testing::history::monotonic_ns;
use lockkit_core::testing::proxy::FaultProxy;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::CampaignError;
use crate::run::{Campaign, Run};
use crate::tiers::{Tier, Topology};
use crate::worker::Worker;

mod judge;
mod nemesis;

pub use judge::{FaultWindow, RandomOutcome, markdown};
use judge::{availability_and_wait, explained, granted_in_server_fault, millis, split_by_servers};
pub use nemesis::Nemesis;
use nemesis::inject;

/// What a randomized run does on each tier.
#[derive(Debug, Clone)]
pub struct Plan {
    /// How long the workers contend on one tier.
    pub duration: Duration,
    /// The seed of the fault schedule; each tier's schedule is drawn from it and the tier.
    pub seed: u64,
    /// Test only: workers present fencing token 1 instead of their grant's (see
    /// [`WorkerSpec::break_fencing`](crate::WorkerSpec::break_fencing)).
    pub break_fencing: bool,
}

/// How many workers contend, and on how many keys.
const WORKERS: usize = 8;
const KEYS: usize = 3;

/// One worker slot: the worker now in it, its proxy, and how many it replaced.
pub(super) struct Slot {
    index: usize,
    generation: usize,
    key: String,
    proxy: Option<FaultProxy>,
    worker: Worker,
}

/// Runs the randomized campaign of `plan` on `tier`.
///
/// # Errors
/// When a worker, a proxy or a server does not do its part; safety findings are in the
/// outcome.
pub async fn run_random(
    campaign: &Campaign,
    tier: &Tier,
    plan: &Plan,
) -> Result<RandomOutcome, CampaignError> {
    let mut rng = StdRng::seed_from_u64(tier_seed(plan.seed, tier.topology));
    tier.prepare()?;
    let outcome = contend(campaign, tier, plan, &mut rng).await;
    // A PostgreSQL standby the run promoted: a new pair for the next run.
    tier.prepare()?;
    outcome
}

/// The body of [`run_random`].
async fn contend(
    campaign: &Campaign,
    tier: &Tier,
    plan: &Plan,
    rng: &mut StdRng,
) -> Result<RandomOutcome, CampaignError> {
    let mut run = Run::new(campaign, tier, "random").await?;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("{}-{k}", run.key)).collect();
    run.extra_keys = keys.clone();
    let ttl = run.ttl;
    let started = Instant::now();
    let end = started + plan.duration;
    let mut slots = Vec::with_capacity(WORKERS);
    for index in 0..WORKERS {
        let proxy = if tier.topology.is_proxyable() {
            Some(
                FaultProxy::start(&tier.hosts())
                    .await
                    .map_err(|e| CampaignError(format!("a fault proxy: {e}")))?,
            )
        } else {
            None
        };
        let key = keys[index % KEYS].clone();
        let worker = spawn(&mut run, plan, index, 0, &key, proxy.as_ref(), end).await?;
        slots.push(Slot {
            index,
            generation: 0,
            key,
            proxy,
            worker,
        });
    }
    let kinds: Vec<Nemesis> = Nemesis::ALL
        .into_iter()
        .filter(|n| n.applies_to(tier.topology))
        .collect();
    let mut windows = Vec::new();
    // A fault needs time to show; none starts in the last two TTLs.
    while Instant::now() + ttl * 2 < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        let kind = kinds[rng.random_range(0..kinds.len())];
        let victim = rng.random_range(0..slots.len());
        let start = monotonic_ns();
        let target = inject(&mut run, plan, rng, kind, &mut slots, victim, end).await?;
        windows.push(FaultWindow {
            kind,
            target,
            start,
            end: monotonic_ns(),
        });
    }
    let duration = started.elapsed();
    let patience = ttl * 10 + Duration::from_secs(60);
    let mut workers = Vec::with_capacity(slots.len());
    let mut proxies = Vec::new();
    for mut slot in slots {
        slot.worker.wait_idle(patience).await?;
        workers.push(slot.worker);
        proxies.extend(slot.proxy);
    }
    let outcome = run.finish(workers).await?;
    drop(proxies);
    let (explained_overlaps, unexplained_overlaps): (Vec<Overlap>, Vec<Overlap>) = outcome
        .verdict
        .overlapping
        .iter()
        .cloned()
        .partition(|o| explained(o, &windows, tier.topology, ttl));
    // Two grants that held the key at once in an overlap a server fault explains.
    let split = |key: &str, a: &(String, u64), b: &(String, u64)| {
        explained_overlaps.iter().any(|o| {
            o.key == key
                && split_by_servers(o, &windows, tier.topology, ttl)
                && [&o.first, &o.second].contains(&&a.0)
                && [&o.first, &o.second].contains(&&b.0)
                && [o.first_start, o.second_start].contains(&a.1)
                && [o.first_start, o.second_start].contains(&b.1)
        })
    };
    let split_brain_writes = outcome
        .verdict
        .stale
        .iter()
        .filter(|w| split(&w.key, &w.writer, &w.newer))
        .count();
    let split_brain_releases = outcome
        .verdict
        .foreign
        .iter()
        .filter(|r| {
            split(&r.key, &r.releaser, &r.victim)
                || granted_in_server_fault(r.victim.1, &windows, tier.topology, ttl)
        })
        .count();
    let (availability, wait_p99) = availability_and_wait(&outcome.events);
    Ok(RandomOutcome {
        outcome,
        seed: plan.seed,
        windows,
        unexplained_overlaps,
        split_brain_writes,
        split_brain_releases,
        availability,
        wait_p99,
        duration,
    })
}

/// Each tier's schedule comes from the campaign's seed and the tier, so that running one
/// tier alone with the same seed replays that tier's schedule.
fn tier_seed(seed: u64, topology: Topology) -> u64 {
    let index = Topology::ALL
        .iter()
        .position(|t| *t == topology)
        .unwrap_or_default() as u64;
    seed ^ (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

pub(super) async fn spawn(
    run: &mut Run,
    plan: &Plan,
    index: usize,
    generation: usize,
    key: &str,
    proxy: Option<&FaultProxy>,
    end: Instant,
) -> Result<Worker, CampaignError> {
    let ttl = run.ttl;
    let name = if generation == 0 {
        format!("w{index}")
    } else {
        format!("w{index}.{generation}")
    };
    let mut spec = run.spec(&name);
    spec.key = key.to_owned();
    if let Some(proxy) = proxy {
        spec.url = run.tier.url_through(&proxy.hosts());
    }
    spec.iterations = u32::MAX;
    spec.deadline_ms = millis(end.saturating_duration_since(Instant::now()));
    spec.hold_ms = 5;
    spec.writes = 2;
    spec.acquire_timeout_ms = millis(ttl * 5);
    spec.break_fencing = plan.break_fencing;
    run.start(&spec).await
}
