//! W1 and W2: speed, uncontended and contended.

use std::time::{Duration, Instant};

use lockkit::{LockClient, Mutex, MutexGuard};

use crate::contended_floors::{ContendedFloor, Contender};
use crate::floors::{BoxError, Floor};
use crate::peers::{Peer, PeerClient};
use crate::store::{Counter, Store};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub(crate) struct Uncontended {
    pub(crate) cycles: usize,
    pub(crate) cycles_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// What the raw floor does, if the backend has one.
    pub(crate) floor: Option<String>,
    pub(crate) floor_p50_us: Option<f64>,
    /// lockkit's p50 over the floor's.
    pub(crate) vs_floor: Option<f64>,
    /// What the second raw floor does, where the backend has two (PostgreSQL: the lease
    /// table, beside advisory locks), in the same rounds.
    pub(crate) second_floor: Option<String>,
    pub(crate) second_floor_p50_us: Option<f64>,
    /// lockkit's p50 over the second floor's.
    pub(crate) vs_second_floor: Option<f64>,
    /// The peer (a real client of the same servers), if the tier has one.
    pub(crate) peer: Option<String>,
    pub(crate) peer_cycles_per_sec: Option<f64>,
    pub(crate) peer_p50_us: Option<f64>,
    pub(crate) peer_p99_us: Option<f64>,
    /// lockkit's p50 over the peer's.
    pub(crate) vs_peer: Option<f64>,
    /// The tier W1 was also run on in the same rounds, to compare tiers without the drift
    /// between their runs (single-node Redis, for the other Redis tiers).
    pub(crate) reference: Option<String>,
    pub(crate) reference_p50_us: Option<f64>,
    /// lockkit's p50 on this tier over its p50 on the reference tier.
    pub(crate) vs_reference: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Contended {
    pub(crate) workers: usize,
    /// Per worker and round.
    pub(crate) iterations: usize,
    pub(crate) rounds: usize,
    pub(crate) lockkit: ContendedSide,
    /// lockkit with non-fair mutexes (`lock.fair = false`), where the backend has them.
    pub(crate) non_fair: Option<ContendedSide>,
    /// The raw floor, if the backend has one.
    pub(crate) floor: Option<ContendedSide>,
    /// The second raw floor, where the backend has two (PostgreSQL: the lease table).
    pub(crate) second_floor: Option<ContendedSide>,
    /// The peer (a real client of the same servers), if the tier has one.
    pub(crate) peer: Option<ContendedSide>,
    /// lockkit's throughput over the floor's: above 1, lockkit is faster.
    pub(crate) throughput_vs_floor: Option<f64>,
    /// lockkit's throughput over the second floor's.
    pub(crate) throughput_vs_second_floor: Option<f64>,
    /// lockkit's throughput over the peer's: above 1, lockkit is faster.
    pub(crate) throughput_vs_peer: Option<f64>,
    /// lockkit's max wait over the floor's: above 1, lockkit's waiters wait longer.
    pub(crate) max_wait_vs_floor: Option<f64>,
    /// lockkit's max wait over the second floor's.
    pub(crate) max_wait_vs_second_floor: Option<f64>,
    /// lockkit's max wait over the peer's.
    pub(crate) max_wait_vs_peer: Option<f64>,
}

/// One contender of W2 (lockkit, its floor or its peer): medians over the rounds, and every
/// round.
#[derive(Debug, Serialize)]
pub(crate) struct ContendedSide {
    pub(crate) what: String,
    /// The counter in the store after every round.
    pub(crate) final_value: u64,
    /// The shortfall of `final_value` from rounds x workers x iterations.
    pub(crate) lost_updates: u64,
    pub(crate) increments_per_sec: f64,
    pub(crate) wait_p50_us: f64,
    pub(crate) wait_p99_us: f64,
    pub(crate) wait_max_us: f64,
    /// CPU time of this process (user + system, every thread) per increment: the client's
    /// side of the work, where `/proc/self/stat` tells it.
    pub(crate) cpu_us_per_increment: Option<f64>,
    /// The longest wait of every round.
    pub(crate) wait_max_all_rounds_us: f64,
    pub(crate) rounds: Vec<Round>,
}

/// One W2 round of one contender.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Round {
    pub(crate) increments_per_sec: f64,
    pub(crate) wait_p50_us: f64,
    pub(crate) wait_p99_us: f64,
    pub(crate) wait_max_us: f64,
    pub(crate) cpu_us_per_increment: Option<f64>,
}

/// CPU time this process has used so far (user + system, every thread), from
/// `/proc/self/stat` in clock ticks of 10 ms (Linux's fixed `USER_HZ`); `None` elsewhere.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) end with ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// A tier to run W1 on in the same rounds as another: its name for the table and its client.
pub(crate) struct Reference<'a> {
    pub(crate) name: &'static str,
    pub(crate) locks: &'a LockClient,
}

/// W1, in rounds that alternate with the backend's raw floors and its peer (when it has them)
/// and with the reference tier (when given), so that noise on a shared machine hits them all
/// alike. `floors`: none, one, or two (PostgreSQL's), reported as the floor and the second
/// floor.
pub(crate) async fn uncontended(
    locks: &LockClient,
    floors: &mut [Floor],
    mut peer: Option<(&'static str, &mut PeerClient)>,
    reference: Option<Reference<'_>>,
    cycles: usize,
) -> lockkit::Result<Uncontended> {
    // Short rounds, so that drift (a disk's fsync latency, a neighbour's load) hits the
    // contestants alike.
    const ROUNDS: usize = 20;
    let mutex = locks.mutex(&crate::run_key("w1-uncontended"))?;
    let reference_mutex = match &reference {
        Some(reference) => Some(reference.locks.mutex(&crate::run_key("w1-reference"))?),
        None => None,
    };
    let mut samples = Vec::with_capacity(cycles);
    let mut floor_samples: Vec<Vec<Duration>> =
        floors.iter().map(|_| Vec::with_capacity(cycles)).collect();
    let mut reference_samples = Vec::with_capacity(cycles);
    let mut peer_samples = Vec::with_capacity(cycles);
    let (mut busy, mut peer_busy) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let chunk = cycles / ROUNDS + usize::from(round < cycles % ROUNDS);
        let started = Instant::now();
        timed_cycles(&mutex, chunk, &mut samples).await?;
        busy += started.elapsed();
        if let Some(reference_mutex) = &reference_mutex {
            timed_cycles(reference_mutex, chunk, &mut reference_samples).await?;
        }
        for (index, (floor, samples)) in floors.iter_mut().zip(&mut floor_samples).enumerate() {
            for _ in 0..chunk {
                let t = Instant::now();
                floor.cycle().await.map_err(|e| {
                    crate::compare_error(format!("{}: {e}", FLOOR_ROLES[index.min(1)]))
                })?;
                samples.push(t.elapsed());
            }
        }
        if let Some((_, peer)) = peer.as_mut() {
            let started = Instant::now();
            for _ in 0..chunk {
                let t = Instant::now();
                peer.cycle()
                    .await
                    .map_err(|e| crate::compare_error(format!("peer: {e}")))?;
                peer_samples.push(t.elapsed());
            }
            peer_busy += started.elapsed();
        }
    }
    samples.sort();
    for samples in &mut floor_samples {
        samples.sort();
    }
    reference_samples.sort();
    peer_samples.sort();
    let p50_us = percentile(&samples, 0.50);
    let floor_p50 = |index: usize| floor_samples.get(index).map(|s| percentile(s, 0.50));
    let floor_what = |index: usize| floors.get(index).map(|f| f.describe().to_owned());
    let (floor_p50_us, second_floor_p50_us) = (floor_p50(0), floor_p50(1));
    let peer_p50_us = peer.is_some().then(|| percentile(&peer_samples, 0.50));
    let reference_p50_us = reference
        .is_some()
        .then(|| percentile(&reference_samples, 0.50));
    Ok(Uncontended {
        cycles,
        cycles_per_sec: cycles as f64 / busy.as_secs_f64(),
        p50_us,
        p99_us: percentile(&samples, 0.99),
        floor: floor_what(0),
        floor_p50_us,
        vs_floor: floor_p50_us.map(|f| p50_us / f),
        second_floor: floor_what(1),
        second_floor_p50_us,
        vs_second_floor: second_floor_p50_us.map(|f| p50_us / f),
        peer: peer.map(|(what, _)| what.to_owned()),
        peer_cycles_per_sec: peer_p50_us.map(|_| cycles as f64 / peer_busy.as_secs_f64()),
        peer_p50_us,
        peer_p99_us: peer_p50_us.map(|_| percentile(&peer_samples, 0.99)),
        vs_peer: peer_p50_us.map(|p| p50_us / p),
        reference: reference.map(|r| r.name.to_owned()),
        reference_p50_us,
        vs_reference: reference_p50_us.map(|r| p50_us / r),
    })
}

/// How errors of the first and the second raw floor are prefixed.
const FLOOR_ROLES: [&str; 2] = ["floor", "second floor"];

/// `n` acquire+release cycles of `mutex`, each one's time added to `samples`.
async fn timed_cycles(mutex: &Mutex, n: usize, samples: &mut Vec<Duration>) -> lockkit::Result<()> {
    for _ in 0..n {
        let t = Instant::now();
        let guard = mutex.lock().await?;
        guard.release().await?;
        samples.push(t.elapsed());
    }
    Ok(())
}

/// W2: lockkit, lockkit with non-fair mutexes (where the backend has them), its
/// raw floors (none, one, or PostgreSQL's two) and its peer (when the backend has them) in
/// turn in each round, each round starting with the next of them, so that drift and order hit
/// them alike.
/// Each keeps its own counter in `target`'s store across its rounds (`store.rs`), and each of
/// its workers its own connection to it. `url` gives each lockkit worker its own client, as
/// each peer worker has (`None`: the memory tier, one client for all).
pub(crate) async fn contended(
    target: &str,
    url: Option<&str>,
    locks: &LockClient,
    floors: &[ContendedFloor],
    peer: Option<&Peer>,
    workers: usize,
    iterations: usize,
) -> lockkit::Result<Contended> {
    // The figures are medians of 3 interleaved runs.
    const ROUNDS: usize = 3;
    // The turns of a round: lockkit, the floor, the peer, lockkit non-fair, the second floor.
    const TURNS: usize = 5;
    let floor_error =
        |index: usize| move |e| crate::compare_error(format!("{}: {e}", FLOOR_ROLES[index.min(1)]));
    let peer_error = |e| crate::compare_error(format!("peer: {e}"));
    let store_error = |e| crate::compare_error(format!("the counter's store: {e}"));
    let side = |contender: &'static str, what: &'static str| async move {
        Side::new(target, url, contender, what, workers)
            .await
            .map_err(store_error)
    };
    let (mut ours, mut peers) = (side("lockkit", "lockkit").await?, None);
    // etcd's, ZooKeeper's and PostgreSQL's locks are fair whatever `lock.fair` says.
    let non_fair = matches!(
        locks.backend().name(),
        "memory" | "redis" | "redis-cluster" | "redlock"
    );
    let mut unfair = match non_fair {
        true => Some(side("lockkit-non-fair", "lockkit, non-fair").await?),
        false => None,
    };
    // Each floor's side and its workers.
    let mut theirs = Vec::new();
    for (index, floor) in floors.iter().enumerate() {
        let contender = ["floor", "floor-2"][index.min(1)];
        let side = side(contender, floor.describe()).await?;
        let mut contenders = Vec::new();
        for _ in 0..workers {
            contenders.push(floor.contender().await.map_err(floor_error(index))?);
        }
        theirs.push((side, contenders));
    }
    let mut clients = Vec::new();
    for _ in 0..workers {
        clients.push(match url {
            Some(url) => lockkit::connect(&lockkit::LockkitConfig::from_url(url)?).await?,
            None => locks.clone(),
        });
    }
    let mut peer_clients = Vec::new();
    if let Some(peer) = peer {
        peers = Some(side("peer", peer.describe()).await?);
        let key = format!("{{peer/w2-{:08x}}}", rand::random::<u32>());
        for _ in 0..workers {
            peer_clients.push(peer.client(&key).await.map_err(peer_error)?);
        }
    }
    let mut lockkit_workers: Vec<LockkitWorker> = clients
        .iter()
        .map(|locks| {
            let mutex = locks.mutex(&crate::run_key("w2-lock"))?;
            Ok(LockkitWorker { mutex, held: None })
        })
        .collect::<lockkit::Result<_>>()?;
    let mut unfair_workers: Vec<LockkitWorker> = clients
        .iter()
        .take(if non_fair { workers } else { 0 })
        .map(|locks| {
            let options = locks.options().clone().with_fair(false);
            let mutex = locks
                .mutex(&crate::run_key("w2-lock-non-fair"))?
                .with_options(options)?;
            Ok(LockkitWorker { mutex, held: None })
        })
        .collect::<lockkit::Result<_>>()?;
    for round in 0..ROUNDS {
        for turn in 0..TURNS {
            match ((round + turn) % TURNS, &mut peers) {
                (3, _) => {
                    if let Some(unfair) = &mut unfair {
                        unfair_workers = workers_round(unfair_workers, iterations, unfair)
                            .await
                            .map_err(|e| crate::compare_error(format!("lockkit, non-fair: {e}")))?;
                    }
                }
                (0, _) => {
                    lockkit_workers = workers_round(lockkit_workers, iterations, &mut ours)
                        .await
                        .map_err(|e| crate::compare_error(format!("lockkit: {e}")))?;
                }
                (turn @ (1 | 4), _) => {
                    let index = usize::from(turn == 4);
                    if let Some((side, contenders)) = theirs.get_mut(index) {
                        *contenders = workers_round(std::mem::take(contenders), iterations, side)
                            .await
                            .map_err(floor_error(index))?;
                    }
                }
                (2, Some(peers)) => {
                    peer_clients = workers_round(peer_clients, iterations, peers)
                        .await
                        .map_err(peer_error)?;
                }
                _ => {}
            }
        }
    }
    drop(lockkit_workers);
    drop(unfair_workers);
    let mut floor_sides = Vec::new();
    for (side, contenders) in theirs {
        for contender in contenders {
            contender.clean_up().await;
        }
        floor_sides.push(side);
    }
    if url.is_some() {
        for client in clients {
            client.close().await;
        }
    }
    let expected = (ROUNDS * workers * iterations) as u64;
    let lockkit = ours.report(expected).await.map_err(store_error)?;
    let non_fair = match unfair {
        Some(unfair) => Some(unfair.report(expected).await.map_err(store_error)?),
        None => None,
    };
    let mut floor_sides = floor_sides.into_iter();
    let floor = match floor_sides.next() {
        Some(theirs) => Some(theirs.report(expected).await.map_err(store_error)?),
        None => None,
    };
    let second_floor = match floor_sides.next() {
        Some(theirs) => Some(theirs.report(expected).await.map_err(store_error)?),
        None => None,
    };
    let peer = match peers {
        Some(peers) => Some(peers.report(expected).await.map_err(store_error)?),
        None => None,
    };
    let over = |ours: f64, theirs: Option<&ContendedSide>, of: fn(&ContendedSide) -> f64| {
        theirs.map(|theirs| ours / of(theirs))
    };
    Ok(Contended {
        workers,
        iterations,
        rounds: ROUNDS,
        throughput_vs_floor: over(lockkit.increments_per_sec, floor.as_ref(), |s| {
            s.increments_per_sec
        }),
        throughput_vs_second_floor: over(lockkit.increments_per_sec, second_floor.as_ref(), |s| {
            s.increments_per_sec
        }),
        throughput_vs_peer: over(lockkit.increments_per_sec, peer.as_ref(), |s| {
            s.increments_per_sec
        }),
        max_wait_vs_floor: over(lockkit.wait_max_us, floor.as_ref(), |s| s.wait_max_us),
        max_wait_vs_second_floor: over(lockkit.wait_max_us, second_floor.as_ref(), |s| {
            s.wait_max_us
        }),
        max_wait_vs_peer: over(lockkit.wait_max_us, peer.as_ref(), |s| s.wait_max_us),
        lockkit,
        non_fair,
        floor,
        second_floor,
        peer,
    })
}

/// One contender of W2 over the rounds: its counter, a connection to it per worker, and its
/// rounds.
struct Side {
    /// The contender, for the table.
    what: &'static str,
    store: Store,
    counters: Vec<Counter>,
    rounds: Vec<Round>,
}

impl Side {
    /// A side (`what`, for the table) whose `workers` have a connection each to a new counter
    /// of `contender`'s in `target`'s store.
    async fn new(
        target: &str,
        url: Option<&str>,
        contender: &str,
        what: &'static str,
        workers: usize,
    ) -> Result<Side, BoxError> {
        let store = Store::create(target, url, contender).await?;
        let mut counters = Vec::new();
        for _ in 0..workers {
            counters.push(store.counter().await?);
        }
        Ok(Side {
            what,
            store,
            counters,
            rounds: Vec::new(),
        })
    }

    /// Adds a round: `done` increments, `waits` of its acquires, `elapsed` from its start to
    /// its last release, the process's CPU time `cpu` at its start.
    fn push(
        &mut self,
        done: u64,
        mut waits: Vec<Duration>,
        elapsed: Duration,
        cpu: Option<Duration>,
    ) {
        waits.sort();
        let used = cpu
            .zip(process_cpu())
            .map(|(start, end)| end.saturating_sub(start));
        self.rounds.push(Round {
            increments_per_sec: done as f64 / elapsed.as_secs_f64(),
            wait_p50_us: percentile(&waits, 0.50),
            wait_p99_us: percentile(&waits, 0.99),
            wait_max_us: percentile(&waits, 1.0),
            cpu_us_per_increment: used
                .filter(|_| done > 0)
                .map(|used| used.as_secs_f64() * 1e6 / done as f64),
        });
    }

    /// The medians over the rounds, with the counter's final value; removes the counter.
    async fn report(self, expected: u64) -> Result<ContendedSide, BoxError> {
        let final_value = self.store.value().await?;
        self.store.clean_up().await;
        let median = |of: fn(&Round) -> f64| {
            let mut values: Vec<f64> = self.rounds.iter().map(of).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
        };
        Ok(ContendedSide {
            what: self.what.to_owned(),
            final_value,
            lost_updates: expected.saturating_sub(final_value),
            increments_per_sec: median(|r| r.increments_per_sec),
            wait_p50_us: median(|r| r.wait_p50_us),
            wait_p99_us: median(|r| r.wait_p99_us),
            wait_max_us: median(|r| r.wait_max_us),
            cpu_us_per_increment: self
                .rounds
                .iter()
                .all(|r| r.cpu_us_per_increment.is_some())
                .then(|| median(|r| r.cpu_us_per_increment.unwrap_or(f64::NAN))),
            wait_max_all_rounds_us: self
                .rounds
                .iter()
                .map(|r| r.wait_max_us)
                .fold(f64::NAN, f64::max),
            rounds: self.rounds,
        })
    }
}

/// A lockkit W2 worker: the mutex of its own client, and its guard while it holds it.
struct LockkitWorker {
    mutex: Mutex,
    held: Option<MutexGuard>,
}

/// How long one read-and-write of a W2 counter may take before the run fails.
const GIVE_UP: Duration = Duration::from_secs(60);

/// A W2 worker: lockkit's, a floor's or a peer's.
trait Worker: Send + 'static {
    fn lock(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn unlock(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl Worker for LockkitWorker {
    async fn lock(&mut self) -> Result<(), BoxError> {
        self.held = Some(self.mutex.lock().await?);
        Ok(())
    }
    async fn unlock(&mut self) -> Result<(), BoxError> {
        if let Some(guard) = self.held.take() {
            guard.release().await?;
        }
        Ok(())
    }
}

impl Worker for Contender {
    fn lock(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send {
        Contender::lock(self)
    }
    fn unlock(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send {
        Contender::unlock(self)
    }
}

impl Worker for PeerClient {
    fn lock(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send {
        PeerClient::lock(self)
    }
    fn unlock(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send {
        PeerClient::unlock(self)
    }
}

/// A round of one side's workers, each with its counter connection; gives the workers back
/// for the next one.
async fn workers_round<W: Worker>(
    workers: Vec<W>,
    iterations: usize,
    side: &mut Side,
) -> Result<Vec<W>, BoxError> {
    let before = side.store.value().await?;
    let cpu = process_cpu();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, (mut worker, mut counter)) in
        workers.into_iter().zip(side.counters.drain(..)).enumerate()
    {
        tasks.spawn(async move {
            let mut waits = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                worker.lock().await?;
                waits.push(t.elapsed());
                // As the peers' acquire: a store that stopped answering fails the run.
                tokio::time::timeout(GIVE_UP, counter.increment())
                    .await
                    .map_err(|_| format!("the counter: no answer in {GIVE_UP:?}"))??;
                worker.unlock().await?;
            }
            Ok::<_, BoxError>((index, worker, counter, waits))
        });
    }
    let mut returned = Vec::new();
    let mut waits = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(worker) => {
                let (index, worker, counter, its_waits) = worker?;
                returned.push((index, worker, counter));
                waits.extend(its_waits);
            }
            Err(e) => panic!("a W2 worker panicked: {e}"),
        }
    }
    let elapsed = started.elapsed();
    returned.sort_by_key(|(index, _, _)| *index);
    let mut workers = Vec::new();
    for (_, worker, counter) in returned {
        workers.push(worker);
        side.counters.push(counter);
    }
    let done = side.store.value().await?.saturating_sub(before);
    side.push(done, waits, elapsed, cpu);
    Ok(workers)
}
