//! The randomized campaign: on each tier, eight worker processes contend on three keys for a
//! while, and a nemesis draws faults at random, one after another, from those the tier's
//! topology supports. The whole merged history is then judged.
//!
//! A run is reproducible in its schedule (which fault, on whom, for how long, in what order)
//! from the seed it prints; the timing of the workers against it is the machine's.
//!
//! The faults: a worker stopped (`SIGSTOP`) past its TTL, a worker killed (`SIGKILL`) and
//! replaced, one worker's connections blackholed, its replies delayed, every worker's replies
//! dropped for a moment (through one fault proxy per worker; not on Sentinel, whose clients
//! reach the primary at the address the Sentinels announce), and the deciding servers
//! killed and restarted or paused (see [`Tier::deciders`]).
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
//! until it learns it was replaced). What two holders of such a split brain do is counted
//! apart: a write the resource ordered by token, and a lock that vanished with the primary
//! that lost. A partitioned holder must see its lost signal before anyone else is granted: an
//! overlap after a partition is a violation.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lockkit_core::testing::check::Overlap;
use lockkit_core::testing::history::{Event, What, monotonic_ns};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::CampaignError;
use crate::run::{Campaign, Outcome, Run};
use crate::tiers::{Tier, Topology, member, restore, restore_if_replaced};
use crate::worker::Worker;

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

/// A kind of fault the nemesis draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Nemesis {
    /// A worker stopped (`SIGSTOP`) for 1.2-2.5 × TTL.
    HolderPause,
    /// A worker killed (`SIGKILL`) and replaced by a new one after up to a second.
    WorkerKill,
    /// One worker's connections blackholed for 0.5-3 × TTL, then reset.
    Partition,
    /// One worker's replies delayed by 0.1-0.35 × TTL for 1-3 s.
    DelayedReplies,
    /// Every worker's replies dropped for 300 ms, then their connections reset.
    DroppedReplies,
    /// The deciding servers killed (`SIGKILL`) and restarted (the consensus tiers' leader
    /// after up to 2 × TTL, the Redlock majority after up to TTL + 1 s, the others at once).
    ServerKill,
    /// The deciding servers stopped (`SIGSTOP`) for 0.5-2 × TTL.
    ServerPause,
}

impl Nemesis {
    /// Every fault, in the order of the tables.
    pub const ALL: [Nemesis; 7] = [
        Nemesis::HolderPause,
        Nemesis::WorkerKill,
        Nemesis::Partition,
        Nemesis::DelayedReplies,
        Nemesis::DroppedReplies,
        Nemesis::ServerKill,
        Nemesis::ServerPause,
    ];

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::HolderPause => "pause",
            Nemesis::WorkerKill => "kill",
            Nemesis::Partition => "partition",
            Nemesis::DelayedReplies => "delay",
            Nemesis::DroppedReplies => "drop",
            Nemesis::ServerKill => "server-kill",
            Nemesis::ServerPause => "server-pause",
        }
    }

    /// Whether the fault can be caused on `topology`.
    pub fn applies_to(self, topology: Topology) -> bool {
        match self {
            Nemesis::Partition | Nemesis::DelayedReplies | Nemesis::DroppedReplies => {
                topology.is_proxyable()
            }
            _ => true,
        }
    }

    fn is_server_fault(self) -> bool {
        matches!(self, Nemesis::ServerKill | Nemesis::ServerPause)
    }
}

/// When one fault was in force, and whom it hit.
#[derive(Debug, Clone)]
pub struct FaultWindow {
    /// The fault.
    pub kind: Nemesis,
    /// The worker it hit, if one.
    pub target: Option<String>,
    /// When it started (monotonic nanoseconds, as in the history).
    pub start: u64,
    /// When it was healed.
    pub end: u64,
}

/// What a randomized run on one tier found.
#[derive(Debug)]
pub struct RandomOutcome {
    /// The run's outcome and verdict over the merged history.
    pub outcome: Outcome,
    /// The campaign's seed (this tier's schedule is drawn from it and the tier).
    pub seed: u64,
    /// The faults injected.
    pub windows: Vec<FaultWindow>,
    /// Overlaps no fault explains (see the module docs).
    pub unexplained_overlaps: Vec<Overlap>,
    /// Accepted writes by one of two holders that held the key together in an overlap a
    /// server fault explains (a Sentinel split brain: two primaries granting at once). Both
    /// holders are then current, and the resource orders their writes by token; "stale" by
    /// the order in which the grants reached their clients is no order the servers gave.
    pub split_brain_writes: usize,
    /// Foreign releases between two holders that a server fault made hold at once: the
    /// later holder's lock was on the primary that lost the split brain, and went with it
    /// (not with the other holder's release, which only ever deletes its own lock).
    pub split_brain_releases: usize,
    /// The share of the time some worker held a key while a worker wanted it.
    pub availability: f64,
    /// The 99th percentile of the time from asking for a key to being granted it.
    pub wait_p99: Duration,
    /// How long the workers contended.
    pub duration: Duration,
}

impl RandomOutcome {
    /// How many faults of each kind were injected.
    pub fn faults_by_kind(&self) -> BTreeMap<Nemesis, usize> {
        let mut counts = BTreeMap::new();
        for window in &self.windows {
            *counts.entry(window.kind).or_default() += 1;
        }
        counts
    }

    /// The criteria the run broke, described; empty if it passed.
    pub fn broken(&self) -> Vec<String> {
        let v = &self.outcome.verdict;
        let mut broken = Vec::new();
        let mut require = |holds: bool, what: String| {
            if !holds {
                broken.push(what);
            }
        };
        require(v.acquisitions > 0, "some grant".into());
        let stale = v.stale_accepted - self.split_brain_writes;
        require(stale == 0, format!("no stale write accepted ({stale})"));
        require(
            v.token_regressions == 0,
            format!("no token regression ({})", v.token_regressions),
        );
        require(
            v.token_duplicates == 0,
            format!("no duplicate token ({})", v.token_duplicates),
        );
        let foreign = v.foreign_releases - self.split_brain_releases + v.foreign_extends;
        require(
            foreign == 0,
            format!("no foreign release or extend ({foreign})"),
        );
        require(
            v.late_grants == 0,
            format!("no grant after its validity ({})", v.late_grants),
        );
        require(
            v.under_floor == 0,
            format!("no grant under its validity floor ({})", v.under_floor),
        );
        require(
            self.outcome.leaked == 0,
            format!("nothing left on the servers ({})", self.outcome.leaked),
        );
        require(
            self.unexplained_overlaps.is_empty(),
            format!(
                "no overlap the tier does not document ({})",
                self.unexplained_overlaps.len()
            ),
        );
        broken
    }
}

/// One worker slot: the worker now in it, its proxy, and how many it replaced.
struct Slot {
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
        let target = inject(&mut run, plan, &mut rng, kind, &mut slots, victim, end).await?;
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
        .filter(|r| split(&r.key, &r.releaser, &r.victim))
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

async fn spawn(
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

/// Causes one fault of `kind` (aimed at `slots[victim]` where it hits one worker) and heals
/// it; returns the name of the worker it hit.
async fn inject(
    run: &mut Run,
    plan: &Plan,
    rng: &mut StdRng,
    kind: Nemesis,
    slots: &mut [Slot],
    victim: usize,
    end: Instant,
) -> Result<Option<String>, CampaignError> {
    let ttl = run.ttl;
    if kind == Nemesis::DroppedReplies {
        run.fault(
            "every worker's replies dropped for 300 ms, then reset",
            None,
        )?;
        for proxy in slots.iter().filter_map(|s| s.proxy.as_ref()) {
            proxy.set(Direction::Replies, Fault::Drop);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for proxy in slots.iter().filter_map(|s| s.proxy.as_ref()) {
            proxy.reset();
            proxy.heal();
        }
        run.heal()?;
        return Ok(None);
    }
    let slot = &mut slots[victim];
    let scaled = |rng: &mut StdRng, low: f64, high: f64| ttl.mul_f64(rng.random_range(low..high));
    let target = Some(slot.worker.name.clone());
    match kind {
        Nemesis::HolderPause => {
            let pause = scaled(rng, 1.2, 2.5);
            run.fault(
                &format!("{} stopped (SIGSTOP) for {pause:?}", slot.worker.name),
                Some(&slot.worker),
            )?;
            slot.worker.signal(Signal::SIGSTOP)?;
            tokio::time::sleep(pause).await;
            slot.worker.signal(Signal::SIGCONT)?;
            run.heal()?;
            Ok(target)
        }
        Nemesis::WorkerKill => {
            run.kill(&mut slot.worker).await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
            slot.generation += 1;
            slot.worker = spawn(
                run,
                plan,
                slot.index,
                slot.generation,
                &slot.key,
                slot.proxy.as_ref(),
                end,
            )
            .await?;
            run.heal()?;
            Ok(target)
        }
        Nemesis::Partition | Nemesis::DelayedReplies => {
            let Some(proxy) = &slot.proxy else {
                return Err(CampaignError(format!(
                    "{} has no fault proxy",
                    slot.worker.name
                )));
            };
            if kind == Nemesis::Partition {
                let cut = scaled(rng, 0.5, 3.0);
                run.fault(
                    &format!("{}'s connections blackholed for {cut:?}", slot.worker.name),
                    Some(&slot.worker),
                )?;
                proxy.set(Direction::Both, Fault::Blackhole);
                tokio::time::sleep(cut).await;
                proxy.heal();
                proxy.reset();
            } else {
                let base = ttl / 10;
                let jitter = ttl / 4;
                let lasting = Duration::from_millis(rng.random_range(1000..3000));
                run.fault(
                    &format!(
                        "{}'s replies delayed by {base:?} + up to {jitter:?} for {lasting:?}",
                        slot.worker.name
                    ),
                    None,
                )?;
                proxy.set(Direction::Replies, Fault::Delay { base, jitter });
                tokio::time::sleep(lasting).await;
                proxy.heal();
            }
            run.heal()?;
            Ok(target)
        }
        Nemesis::DroppedReplies => Ok(None),
        Nemesis::ServerKill | Nemesis::ServerPause => {
            server_fault(run, rng, kind).await?;
            Ok(None)
        }
    }
}

/// The deciding servers killed and restarted, or paused and resumed.
async fn server_fault(run: &mut Run, rng: &mut StdRng, kind: Nemesis) -> Result<(), CampaignError> {
    let ttl = run.ttl;
    let deciders = run.tier.deciders(&run.key)?;
    let topology = run.tier.topology;
    if kind == Nemesis::ServerPause {
        let pause = ttl.mul_f64(rng.random_range(0.5..2.0));
        run.fault(
            &format!("{} stopped (SIGSTOP) for {pause:?}", deciders.join(", ")),
            None,
        )?;
        for name in &deciders {
            member(&["pause", name])?;
        }
        tokio::time::sleep(pause).await;
        for name in &deciders {
            member(&["resume", name])?;
        }
    } else {
        let down = match topology {
            Topology::Etcd | Topology::Zk => ttl.mul_f64(rng.random_range(0.0..2.0)),
            Topology::Redlock => ttl.mul_f64(rng.random_range(0.0..1.0)) + Duration::from_secs(1),
            Topology::Redis | Topology::Sentinel | Topology::Cluster => Duration::ZERO,
        };
        run.fault(
            &format!(
                "{} killed (SIGKILL), restarted after {down:?}",
                deciders.join(", ")
            ),
            None,
        )?;
        for name in &deciders {
            member(&["kill", name])?;
        }
        tokio::time::sleep(down).await;
        for name in &deciders {
            restore(name).await?;
        }
    }
    if topology.fails_over() {
        // A resumed primary may have been replaced; it must rejoin before the next fault.
        for name in &deciders {
            restore_if_replaced(name).await?;
        }
    }
    run.heal()
}

/// Whether a fault explains `overlap` on `topology` (see the module docs): a pause of one of
/// the two holders, or, on the Redis tiers, a server fault.
fn explained(
    overlap: &Overlap,
    windows: &[FaultWindow],
    topology: Topology,
    ttl: Duration,
) -> bool {
    windows.iter().any(|w| {
        let hits_a_holder = w
            .target
            .as_ref()
            .is_some_and(|t| *t == overlap.first || *t == overlap.second);
        in_force(overlap, w, ttl) && w.kind == Nemesis::HolderPause && hits_a_holder
    }) || split_by_servers(overlap, windows, topology, ttl)
}

/// Whether a server fault of a Redis tier explains `overlap`: the servers forgot the first
/// grant, or two of them granted at once.
fn split_by_servers(
    overlap: &Overlap,
    windows: &[FaultWindow],
    topology: Topology,
    ttl: Duration,
) -> bool {
    !topology.is_consensus()
        && windows
            .iter()
            .any(|w| w.kind.is_server_fault() && in_force(overlap, w, ttl))
}

/// Whether fault `w` began before the overlap ended and was in force (or healed less than two
/// TTLs before) when the first grant started.
fn in_force(overlap: &Overlap, w: &FaultWindow, ttl: Duration) -> bool {
    let slack = u64::try_from((ttl * 2).as_nanos()).unwrap_or(u64::MAX);
    w.start < overlap.until && w.end.saturating_add(slack) > overlap.first_start
}

/// The share of the time some worker held each key while a worker wanted it, and the 99th
/// percentile of the waits from asking to being granted.
fn availability_and_wait(events: &[Event]) -> (f64, Duration) {
    let end = events.last().map_or(0, |e| e.at_ns);
    let mut asked: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut holding: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut wanted: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    let mut held: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    let mut waits = Vec::new();
    for event in events {
        let who = (event.process.as_str(), event.key.as_str());
        match &event.what {
            What::Invoke => {
                asked.insert(who, event.at_ns);
            }
            What::Granted { .. } => {
                if let Some(at) = asked.remove(&who) {
                    wanted.entry(who.1).or_default().push((at, event.at_ns));
                    waits.push(event.at_ns.saturating_sub(at));
                }
                holding.insert(who, event.at_ns);
            }
            What::Failed { .. } => {
                if let Some(at) = asked.remove(&who) {
                    wanted.entry(who.1).or_default().push((at, event.at_ns));
                }
            }
            What::Release { .. } | What::Lost { .. } => {
                if let Some(at) = holding.remove(&who) {
                    held.entry(who.1).or_default().push((at, event.at_ns));
                }
            }
            What::Killed => {
                for (map, into) in [(&mut asked, &mut wanted), (&mut holding, &mut held)] {
                    let gone: Vec<_> = map.keys().filter(|k| k.0 == who.0).copied().collect();
                    for k in gone {
                        if let Some(at) = map.remove(&k) {
                            into.entry(k.1).or_default().push((at, event.at_ns));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    for ((_, key), at) in asked {
        wanted.entry(key).or_default().push((at, end));
    }
    for ((_, key), at) in holding {
        held.entry(key).or_default().push((at, end));
    }
    let (mut with_holder, mut demanded) = (0u64, 0u64);
    for (key, held_spans) in &held {
        let mut all = held_spans.clone();
        all.extend(wanted.get(key).into_iter().flatten().copied());
        with_holder += union_length(held_spans.clone());
        demanded += union_length(all);
    }
    let availability = if demanded == 0 {
        0.0
    } else {
        with_holder as f64 / demanded as f64
    };
    waits.sort_unstable();
    let p99 = waits
        .get((waits.len().saturating_sub(1) as f64 * 0.99).round() as usize)
        .copied()
        .unwrap_or_default();
    (availability, Duration::from_nanos(p99))
}

/// The total length of the union of `spans`.
fn union_length(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort_unstable();
    let (mut total, mut reach) = (0u64, 0u64);
    for (start, end) in spans {
        let start = start.max(reach);
        if end > start {
            total += end - start;
            reach = end;
        }
    }
    total
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The Markdown table of randomized runs, one row per tier.
pub fn markdown(rows: &[RandomOutcome]) -> String {
    let mut out = String::from(
        "| tier | seed | s | grants | faults | overlaps (unexplained) | stale refused / accepted (split brain) | token regressions + duplicates | foreign releases + extends (split brain) | late grants / under the floor | leaked | availability | p99 wait ms | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let v = &row.outcome.verdict;
        let faults = row
            .faults_by_kind()
            .iter()
            .map(|(kind, n)| format!("{} {n}", kind.name()))
            .collect::<Vec<_>>()
            .join(", ");
        let broken = row.broken();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} ({}) | {} / {} ({}) | {} | {} ({}) | {} / {} | {} | {:.1}% | {:.0} | {} |",
            row.outcome.tier,
            row.seed,
            row.duration.as_secs_f64(),
            v.acquisitions,
            if faults.is_empty() {
                "-".into()
            } else {
                faults
            },
            v.overlaps,
            row.unexplained_overlaps.len(),
            v.stale_rejected,
            v.stale_accepted,
            row.split_brain_writes,
            v.token_regressions + v.token_duplicates,
            v.foreign_releases + v.foreign_extends,
            row.split_brain_releases,
            v.late_grants,
            v.under_floor,
            row.outcome.leaked,
            row.availability * 100.0,
            row.wait_p99.as_secs_f64() * 1e3,
            if broken.is_empty() {
                "ok".to_owned()
            } else {
                format!("FAIL: {}", broken.join("; "))
            },
        );
    }
    out
}
