//! The scenarios: each a fault timed against lock workers, run on every tier it applies to.
//! The election rows time the same faults against election candidates
//! ([`WorkerSpec::elect`](crate::WorkerSpec::elect)) on the tiers whose backend has
//! elections, and are judged as the lock rows they repeat. The semaphore and read-write lock
//! rows do the same with permit takers and writers beside a companion worker
//! ([`Run::contend_for`]); the two contention rows check 10,000 grants of 8 processes of a
//! semaphore and of a read-write lock, without faults.

use std::time::Duration;

use lockkit::{LockkitConfig, Support};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use nix::sys::signal::Signal;

use crate::CampaignError;
use crate::private::{SplitSentinel, persistent_redis};
use crate::run::{Campaign, Outcome, Primitive, Run};
use crate::tiers::{Tier, Topology, member, restore, restore_if_replaced};

/// A fault scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// The holder is stopped (SIGSTOP) while it writes, naively, every 100 ms, until a second
    /// worker has been granted the lock, and for at least 2 × TTL (ZooKeeper grants only
    /// once the stopped holder's session has expired); the second worker holds the lock past
    /// the first one's wake-up. The
    /// woken holder writes (the fenced resource must refuse it), extends and releases (which
    /// must neither take back nor delete the new holder's lock).
    HolderPause,
    /// The holder checks that it still holds the lock, and is stopped right there, before the
    /// write the check was for, until a second worker has been granted and has written (and
    /// for at least 2 × TTL); then it writes.
    PauseBeforeWrite,
    /// One worker, whose locks have a TTL of a quarter of the others', has its replies
    /// delayed by 0.5-1.5 × that TTL while it contends with another: a grant must never be
    /// reported once its validity has run out.
    DelayedReplies,
    /// The servers that decide (the Redis server, the Sentinel primary, 3 of 5 Redlock nodes,
    /// the etcd or ZooKeeper leader) are stopped (SIGSTOP) for 2 × TTL while one worker holds
    /// the lock and another waits.
    ServerPause,
    /// The deciding servers are killed (SIGKILL) while the lock is held and restarted at once
    /// (Redis without persistence: the lock is forgotten).
    ServerCrash,
    /// As [`Scenario::ServerCrash`], with the Redlock nodes restarted only after the TTL.
    DelayedRestart,
    /// As [`Scenario::ServerCrash`], on a Redis of its own that fsyncs every write to its
    /// append-only file before answering: the lock survives the crash.
    PersistentCrash,
    /// A Sentinel topology of its own whose primary is cut off from its replica and its
    /// Sentinels while the holder, on the primary's side, still reaches it; the Sentinels
    /// promote the replica and a waiter that asks them is granted there: split brain.
    SplitBrain,
    /// The holder is killed (SIGKILL); the time until the next worker is granted.
    HolderCrash,
    /// The holder's connections are blackholed for 3 × TTL while another worker waits: the
    /// holder's lost signal must fire before anyone else is granted.
    Partition,
    /// Three workers contend while the servers' replies are dropped for 300 ms (then the
    /// connections reset) every 700 ms: nothing may be left behind by the retries.
    DroppedReplies,
    /// A worker talks to the etcd or ZooKeeper leader only, and the two followers stop: the
    /// minority side must not grant.
    LeaderIsolation,
    /// A waiter's connections are blackholed while it is queued, until its session (lease)
    /// has expired; the holder then releases and a third worker queues: the expired waiter
    /// must not be granted on its lost place in the queue.
    QueuedWaiterExpires,
    /// [`Scenario::HolderPause`] with election candidates: the leader is stopped past its
    /// TTL while it writes with its term, another is elected; the woken leader's writes are
    /// refused by term, its extend and resign must not touch the new leadership.
    ElectionHolderPause,
    /// [`Scenario::Partition`] with election candidates: the cut-off leader's lost signal
    /// fires before another candidate is elected.
    ElectionPartition,
    /// [`Scenario::ServerCrash`] with election candidates: the deciding servers are killed
    /// while one leads and another campaigns.
    ElectionServerCrash,
    /// [`Scenario::HolderPause`] with a semaphore of 2 permits, one of which a companion
    /// holds throughout: the paused holder's permit passes to the waiter.
    SemaphoreHolderPause,
    /// [`Scenario::Partition`] with the semaphore of [`Scenario::SemaphoreHolderPause`].
    SemaphorePartition,
    /// [`Scenario::ServerCrash`] with the semaphore of [`Scenario::SemaphoreHolderPause`].
    SemaphoreServerCrash,
    /// [`Scenario::HolderPause`] with writers of a read-write lock while a companion reads.
    RwLockHolderPause,
    /// [`Scenario::Partition`] with the writers and reader of [`Scenario::RwLockHolderPause`].
    RwLockPartition,
    /// [`Scenario::ServerCrash`] with the writers and reader of [`Scenario::RwLockHolderPause`].
    RwLockServerCrash,
    /// 8 worker processes take permits of a semaphore of 3, 1,250 times each with no pause:
    /// never more than 3 holders in the merged history of 10,000 grants.
    SemaphoreContention,
    /// 6 reader and 2 writer processes take a read-write lock 1,250 times each with no
    /// pause: never a writer beside anyone in the merged history of 10,000 grants.
    RwLockContention,
}

/// How many processes a contention row runs, and how many grants each takes.
const CONTENDERS: usize = 8;
const CONTENDED_GRANTS: u32 = 1_250;

impl Scenario {
    /// Every scenario, in the order of the tables.
    pub const ALL: [Scenario; 24] = [
        Scenario::HolderPause,
        Scenario::PauseBeforeWrite,
        Scenario::DelayedReplies,
        Scenario::ServerPause,
        Scenario::ServerCrash,
        Scenario::DelayedRestart,
        Scenario::PersistentCrash,
        Scenario::SplitBrain,
        Scenario::HolderCrash,
        Scenario::Partition,
        Scenario::DroppedReplies,
        Scenario::LeaderIsolation,
        Scenario::QueuedWaiterExpires,
        Scenario::ElectionHolderPause,
        Scenario::ElectionPartition,
        Scenario::ElectionServerCrash,
        Scenario::SemaphoreHolderPause,
        Scenario::SemaphorePartition,
        Scenario::SemaphoreServerCrash,
        Scenario::RwLockHolderPause,
        Scenario::RwLockPartition,
        Scenario::RwLockServerCrash,
        Scenario::SemaphoreContention,
        Scenario::RwLockContention,
    ];

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::HolderPause => "holder-pause",
            Scenario::PauseBeforeWrite => "pause-before-write",
            Scenario::DelayedReplies => "delayed-replies",
            Scenario::ServerPause => "server-pause",
            Scenario::ServerCrash => "server-crash",
            Scenario::DelayedRestart => "delayed-restart",
            Scenario::PersistentCrash => "persistent-crash",
            Scenario::SplitBrain => "split-brain",
            Scenario::HolderCrash => "holder-crash",
            Scenario::Partition => "partition",
            Scenario::DroppedReplies => "dropped-replies",
            Scenario::LeaderIsolation => "leader-isolation",
            Scenario::QueuedWaiterExpires => "queued-waiter-expires",
            Scenario::ElectionHolderPause => "election-holder-pause",
            Scenario::ElectionPartition => "election-partition",
            Scenario::ElectionServerCrash => "election-server-crash",
            Scenario::SemaphoreHolderPause => "semaphore-holder-pause",
            Scenario::SemaphorePartition => "semaphore-partition",
            Scenario::SemaphoreServerCrash => "semaphore-server-crash",
            Scenario::RwLockHolderPause => "rwlock-holder-pause",
            Scenario::RwLockPartition => "rwlock-partition",
            Scenario::RwLockServerCrash => "rwlock-server-crash",
            Scenario::SemaphoreContention => "semaphore-contention",
            Scenario::RwLockContention => "rwlock-contention",
        }
    }

    /// What its workers contend for.
    pub fn primitive(self) -> Primitive {
        match self {
            Scenario::ElectionHolderPause
            | Scenario::ElectionPartition
            | Scenario::ElectionServerCrash => Primitive::Election,
            Scenario::SemaphoreHolderPause
            | Scenario::SemaphorePartition
            | Scenario::SemaphoreServerCrash
            | Scenario::SemaphoreContention => Primitive::Semaphore,
            Scenario::RwLockHolderPause
            | Scenario::RwLockPartition
            | Scenario::RwLockServerCrash
            | Scenario::RwLockContention => Primitive::RwLock,
            _ => Primitive::Lock,
        }
    }

    /// The lock scenario a row of another primitive repeats (itself for a lock row and for
    /// the contention rows): the fault, its timing and the pass criteria are that row's.
    pub fn lock_row(self) -> Scenario {
        match self {
            Scenario::ElectionHolderPause
            | Scenario::SemaphoreHolderPause
            | Scenario::RwLockHolderPause => Scenario::HolderPause,
            Scenario::ElectionPartition
            | Scenario::SemaphorePartition
            | Scenario::RwLockPartition => Scenario::Partition,
            Scenario::ElectionServerCrash
            | Scenario::SemaphoreServerCrash
            | Scenario::RwLockServerCrash => Scenario::ServerCrash,
            lock => lock,
        }
    }

    /// The scenario called `name`.
    pub fn named(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether the scenario means something on `topology`.
    /// Rows of other primitives apply where their lock row does; whether the tier's backend
    /// has the primitive is asked when the row runs (a row it has not shows as not
    /// applicable).
    pub fn applies_to(self, topology: Topology) -> bool {
        if self.lock_row() != self {
            return self.lock_row().applies_to(topology);
        }
        match self {
            Scenario::DelayedReplies | Scenario::Partition | Scenario::DroppedReplies => {
                topology.is_proxyable()
            }
            Scenario::DelayedRestart => topology == Topology::Redlock,
            Scenario::PersistentCrash => topology == Topology::Redis,
            Scenario::SplitBrain => topology == Topology::Sentinel,
            Scenario::LeaderIsolation | Scenario::QueuedWaiterExpires => topology.is_consensus(),
            _ => true,
        }
    }

    /// Runs the scenario on `tier`.
    ///
    /// # Errors
    /// When the scenario cannot be carried out (a worker or server does not do its part);
    /// safety findings are in the [`Outcome`], not errors.
    pub async fn run(self, campaign: &Campaign, tier: &Tier) -> Result<Outcome, CampaignError> {
        if let Err(why) = supported(tier, self.primitive()).await? {
            return Ok(Outcome::not_applicable(tier, self.name(), why));
        }
        let run = || async {
            let mut run = Run::new(campaign, tier, self.name()).await?;
            if !matches!(
                self,
                Scenario::SemaphoreContention | Scenario::RwLockContention
            ) {
                run.contend_for(self.primitive()).await?;
            }
            Ok::<_, CampaignError>(run)
        };
        match self.lock_row() {
            Scenario::HolderPause => holder_pause(run().await?).await,
            Scenario::PauseBeforeWrite => pause_before_write(run().await?).await,
            Scenario::DelayedReplies => delayed_replies(run().await?).await,
            Scenario::ServerPause => server_pause(run().await?).await,
            Scenario::ServerCrash => server_crash(run().await?, Duration::ZERO).await,
            Scenario::DelayedRestart => {
                server_crash(run().await?, campaign.ttl + Duration::from_secs(1)).await
            }
            // These two bring their own servers, so their runs are on those.
            Scenario::PersistentCrash => persistent_crash(campaign).await,
            Scenario::SplitBrain => split_brain(campaign).await,
            Scenario::HolderCrash => holder_crash(run().await?).await,
            Scenario::Partition => partition(run().await?).await,
            Scenario::DroppedReplies => dropped_replies(run().await?).await,
            Scenario::LeaderIsolation => leader_isolation(run().await?).await,
            Scenario::QueuedWaiterExpires => queued_waiter_expires(run().await?).await,
            Scenario::SemaphoreContention | Scenario::RwLockContention => {
                contention(run().await?, self.primitive()).await
            }
            other => Err(CampaignError(format!(
                "{} repeats {}, which repeats nothing",
                self.name(),
                other.name()
            ))),
        }
    }
}

/// `Err` with the reason when the backend of `tier` does not have `primitive`.
async fn supported(tier: &Tier, primitive: Primitive) -> Result<Result<(), String>, CampaignError> {
    let capabilities = || async {
        let locks = lockkit::connect(&LockkitConfig::from_url(&tier.url)?).await?;
        Ok::<_, CampaignError>(locks.capabilities())
    };
    let support = match primitive {
        Primitive::Lock => return Ok(Ok(())),
        Primitive::Election => capabilities().await?.election,
        Primitive::Semaphore => capabilities().await?.semaphore,
        Primitive::RwLock => capabilities().await?.rwlock,
    };
    Ok(match support {
        Support::Supported => Ok(()),
        Support::Unsupported(why) => Err(why.to_owned()),
        unknown => Err(format!("{unknown:?}")),
    })
}

/// [`CONTENDERS`] processes take `primitive` [`CONTENDED_GRANTS`] times each, at once: a
/// semaphore of 3 permits (no writes: its holders are many), or a read-write lock that 2 of
/// them write (one fenced write per grant) and the others read.
async fn contention(mut run: Run, primitive: Primitive) -> Result<Outcome, CampaignError> {
    run.primitive = primitive;
    run.permits = 3;
    let mut workers = Vec::with_capacity(CONTENDERS);
    for i in 0..CONTENDERS {
        let mut spec = run.spec(&format!("contender-{i}"));
        spec.iterations = CONTENDED_GRANTS;
        spec.deadline_ms = 600_000;
        spec.acquire_timeout_ms = 60_000;
        match primitive {
            Primitive::Semaphore => spec.writes = 0,
            _ if i < 2 => {}
            _ => {
                spec.write = false;
                spec.read = true;
                spec.writes = 0;
            }
        }
        workers.push(run.start(&spec).await?);
    }
    for worker in &mut workers {
        worker.wait_idle(Duration::from_secs(600)).await?;
    }
    run.finish(workers).await
}

/// Generous bound for a step that should take about a TTL.
fn patience(run: &Run) -> Duration {
    run.ttl * 4 + Duration::from_secs(20)
}

/// Writes every 100 ms for `hold`.
fn writes_over(hold: Duration) -> u32 {
    u32::try_from(hold.as_millis() / 100)
        .unwrap_or(u32::MAX)
        .max(1)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn holder_pause(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let mut spec = run.spec("holder");
    spec.hold_ms = millis(ttl * 4);
    spec.writes = writes_over(ttl * 4);
    spec.naive = true;
    let mut holder = run.start(&spec).await?;
    holder.wait_for("stored", patience(&run)).await?;
    run.fault(
        "holder stopped (SIGSTOP) until another is granted",
        Some(&holder),
    )?;
    holder.signal(Signal::SIGSTOP)?;
    let stopped = tokio::time::Instant::now();
    // Longer than what is left of the holder's work after it wakes: its extend and release
    // must meet the new holder's lock.
    let mut next = run.spec("next");
    next.hold_ms = millis(ttl * 6);
    next.writes = writes_over(ttl * 6);
    let mut next = run.start(&next).await?;
    next.wait_for("granted", patience(&run)).await?;
    tokio::time::sleep_until(stopped + ttl * 2).await;
    holder.signal(Signal::SIGCONT)?;
    run.heal()?;
    run.finish(vec![holder, next]).await
}

async fn pause_before_write(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let mut spec = run.spec("holder");
    spec.hold_ms = millis(ttl / 4);
    spec.stop_after_check = true;
    let mut holder = run.start(&spec).await?;
    holder.wait_for("checked", patience(&run)).await?;
    holder.wait_stopped(Duration::from_secs(10)).await?;
    run.fault(
        "holder stopped between its check and its write",
        Some(&holder),
    )?;
    let stopped = tokio::time::Instant::now();
    let mut next = run.spec("next");
    next.hold_ms = millis(ttl * 2);
    next.writes = writes_over(ttl * 2);
    let mut next = run.start(&next).await?;
    next.wait_for("stored", patience(&run)).await?;
    tokio::time::sleep_until(stopped + ttl * 2).await;
    holder.signal(Signal::SIGCONT)?;
    run.heal()?;
    run.finish(vec![holder, next]).await
}

async fn delayed_replies(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    // The slow worker's own TTL is short enough that some delayed grants arrive within the
    // backend's request timeout but after their validity: those the core must refuse.
    let slow_ttl = ttl / 4;
    let proxy = proxy_for(&run).await?;
    let mut slow = run.spec("slow");
    slow.url = run.tier.url_through(&proxy.hosts());
    slow.ttl_ms = millis(slow_ttl);
    slow.iterations = 4;
    slow.hold_ms = millis(slow_ttl / 2);
    slow.acquire_timeout_ms = millis(ttl * 3);
    // Grants may never come through such delays; the run is about those that do.
    slow.deadline_ms = millis(ttl * 10);
    let slow = run.start(&slow).await?;
    let mut fast = run.spec("fast");
    fast.iterations = 6;
    fast.hold_ms = millis(ttl / 4);
    fast.between_ms = millis(ttl / 4);
    run.fault("slow's replies delayed by 0.5-1.5 x its TTL", None)?;
    proxy.set(
        Direction::Replies,
        Fault::Delay {
            base: slow_ttl / 2,
            jitter: slow_ttl,
        },
    );
    let fast = run.start(&fast).await?;
    let mut workers = vec![slow, fast];
    for worker in &mut workers {
        worker.wait_idle(patience(&run) * 3).await?;
    }
    proxy.heal();
    run.heal()?;
    run.finish(workers).await
}

async fn server_pause(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let (holder, waiter) = holder_and_waiter(&mut run).await?;
    let deciders = run.tier.deciders(&run.key)?;
    run.fault(
        &format!("{} stopped (SIGSTOP) for 2 x TTL", deciders.join(", ")),
        Some(&holder),
    )?;
    for name in &deciders {
        member(&["pause", name])?;
    }
    tokio::time::sleep(ttl * 2).await;
    for name in &deciders {
        member(&["resume", name])?;
    }
    run.heal()?;
    let outcome = run.finish(vec![holder, waiter]).await;
    settle(&deciders).await;
    outcome
}

async fn server_crash(mut run: Run, restart_after: Duration) -> Result<Outcome, CampaignError> {
    let (holder, waiter) = holder_and_waiter(&mut run).await?;
    let deciders = run.tier.deciders(&run.key)?;
    run.fault(
        &format!("{} killed (SIGKILL)", deciders.join(", ")),
        Some(&holder),
    )?;
    for name in &deciders {
        member(&["kill", name])?;
    }
    tokio::time::sleep(restart_after).await;
    let clustered = run.tier.topology.is_consensus() || run.tier.topology.fails_over();
    if !clustered {
        for name in &deciders {
            restore(name).await?;
        }
        run.heal()?;
    }
    let outcome = run.finish(vec![holder, waiter]).await;
    if clustered {
        for name in &deciders {
            restore(name).await?;
        }
    }
    settle(&deciders).await;
    outcome
}

/// Waits until restarted or resumed Sentinel or cluster members have settled (a resumed
/// primary may have been replaced and must rejoin as a replica before the next scenario).
async fn settle(deciders: &[String]) {
    for name in deciders
        .iter()
        .filter(|n| n.starts_with("sentinel-") || n.starts_with("cluster-"))
    {
        let _ = restore_if_replaced(name).await;
    }
}

/// A holder writing carefully every 100 ms for 5 × TTL, and a waiter queued behind it.
async fn holder_and_waiter(run: &mut Run) -> Result<(crate::Worker, crate::Worker), CampaignError> {
    let ttl = run.ttl;
    let mut spec = run.spec("holder");
    spec.hold_ms = millis(ttl * 5);
    spec.writes = writes_over(ttl * 5);
    let mut holder = run.start(&spec).await?;
    holder.wait_for("stored", patience(run)).await?;
    let mut waiter = run.spec("waiter");
    waiter.hold_ms = millis(ttl / 2);
    waiter.writes = 5;
    waiter.iterations = 2;
    waiter.acquire_timeout_ms = millis(ttl * 10 + Duration::from_secs(30));
    let waiter = run.start(&waiter).await?;
    Ok((holder, waiter))
}

async fn holder_crash(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let mut spec = run.spec("holder");
    spec.hold_ms = millis(ttl * 20);
    spec.writes = writes_over(ttl * 20);
    let mut holder = run.start(&spec).await?;
    holder.wait_for("stored", patience(&run)).await?;
    let mut next = run.spec("next");
    next.acquire_timeout_ms = millis(patience(&run));
    let mut next = run.start(&next).await?;
    run.kill(&mut holder).await?;
    next.wait_for("granted", patience(&run)).await?;
    drop(holder);
    run.finish(vec![next]).await
}

async fn partition(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let proxy = proxy_for(&run).await?;
    let mut spec = run.spec("holder");
    spec.url = run.tier.url_through(&proxy.hosts());
    spec.hold_ms = millis(ttl * 6);
    spec.writes = writes_over(ttl * 6);
    let mut holder = run.start(&spec).await?;
    holder.wait_for("stored", patience(&run)).await?;
    let mut waiter = run.spec("waiter");
    waiter.acquire_timeout_ms = millis(patience(&run));
    waiter.hold_ms = millis(ttl / 2);
    waiter.writes = 5;
    let waiter = run.start(&waiter).await?;
    run.fault("holder's connections blackholed for 3 x TTL", Some(&holder))?;
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::sleep(ttl * 3).await;
    proxy.heal();
    proxy.reset();
    run.heal()?;
    run.finish(vec![holder, waiter]).await
}

async fn dropped_replies(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let proxy = proxy_for(&run).await?;
    let mut workers = Vec::new();
    for i in 0..3 {
        let mut spec = run.spec(&format!("w{i}"));
        spec.url = run.tier.url_through(&proxy.hosts());
        spec.iterations = 8;
        spec.hold_ms = 100;
        spec.acquire_timeout_ms = millis(ttl * 2);
        workers.push(run.start(&spec).await?);
    }
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        run.fault("replies dropped for 300 ms, then connections reset", None)?;
        proxy.set(Direction::Replies, Fault::Drop);
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.reset();
        proxy.heal();
        run.heal()?;
    }
    run.finish(workers).await
}

async fn leader_isolation(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let followers = run.tier.followers()?;
    let leader = member(&[
        "leader",
        if run.tier.topology == Topology::Etcd {
            "etcd"
        } else {
            "zk"
        },
    ])?;
    let leader_host = format!("127.0.0.1:{}", Tier::port_of(&leader)?);
    let mut spec = run.spec("minority");
    spec.url = run.tier.url_through(&[leader_host]);
    spec.acquire_timeout_ms = millis(ttl);
    spec.deadline_ms = millis(ttl * 3);
    run.fault(
        &format!("{} stopped: {leader} is alone", followers.join(", ")),
        None,
    )?;
    for name in &followers {
        member(&["pause", name])?;
    }
    let minority = run.start(&spec).await;
    let outcome = match minority {
        Ok(mut worker) => {
            let idle = worker.wait_idle(patience(&run) * 2).await;
            for name in &followers {
                member(&["resume", name])?;
            }
            run.heal()?;
            idle?;
            run.finish(vec![worker]).await
        }
        Err(e) => {
            for name in &followers {
                member(&["resume", name])?;
            }
            Err(e)
        }
    };
    // The cluster needs its quorum back before the next scenario.
    tokio::time::sleep(Duration::from_secs(2)).await;
    outcome
}

async fn queued_waiter_expires(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let proxy = proxy_for(&run).await?;
    let cut = (ttl * 3).max(Duration::from_secs(12));
    let mut spec = run.spec("holder");
    spec.hold_ms = millis(cut);
    spec.writes = writes_over(cut);
    let mut holder = run.start(&spec).await?;
    holder.wait_for("stored", patience(&run)).await?;
    let mut queued = run.spec("queued");
    queued.url = run.tier.url_through(&proxy.hosts());
    queued.iterations = 2;
    queued.hold_ms = millis(ttl / 2);
    queued.writes = 5;
    queued.acquire_timeout_ms = millis(cut * 4);
    let queued = run.start(&queued).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.fault(
        "queued waiter's connections blackholed past its session",
        Some(&queued),
    )?;
    proxy.set(Direction::Both, Fault::Blackhole);
    let mut third = run.spec("third");
    third.hold_ms = millis(ttl);
    third.writes = 10;
    third.acquire_timeout_ms = millis(cut * 4);
    tokio::time::sleep(cut / 2).await;
    let third = run.start(&third).await?;
    tokio::time::sleep(cut / 2 + ttl).await;
    proxy.heal();
    proxy.reset();
    run.heal()?;
    run.finish(vec![holder, queued, third]).await
}

async fn proxy_for(run: &Run) -> Result<FaultProxy, CampaignError> {
    FaultProxy::start(&run.tier.hosts())
        .await
        .map_err(|e| CampaignError(format!("a fault proxy: {e}")))
}

async fn persistent_crash(campaign: &Campaign) -> Result<Outcome, CampaignError> {
    let dir = campaign
        .dir
        .join(format!("redis-aof-{:08x}", rand::random::<u32>()));
    let mut server = persistent_redis(&dir)?;
    let tier = Tier {
        topology: Topology::Redis,
        url: format!("redis://127.0.0.1:{}", server.port),
    };
    let mut run = Run::new(campaign, &tier, Scenario::PersistentCrash.name()).await?;
    let (holder, waiter) = holder_and_waiter(&mut run).await?;
    run.fault(
        "the Redis server (appendfsync always) killed (SIGKILL) and restarted",
        Some(&holder),
    )?;
    server.kill();
    server.restart()?;
    run.heal()?;
    run.finish(vec![holder, waiter]).await
}

async fn split_brain(campaign: &Campaign) -> Result<Outcome, CampaignError> {
    let dir = campaign
        .dir
        .join(format!("split-{:08x}", rand::random::<u32>()));
    let topology = SplitSentinel::start(&dir).await?;
    let tier = Tier {
        topology: Topology::Sentinel,
        url: topology.sentinel_url(),
    };
    let mut run = Run::new(campaign, &tier, Scenario::SplitBrain.name()).await?;
    let ttl = run.ttl;
    let mut spec = run.spec("holder");
    spec.url = topology.primary_url();
    spec.hold_ms = millis(ttl * 8);
    spec.writes = writes_over(ttl * 8);
    let mut holder = run.start(&spec).await?;
    holder.wait_for("stored", patience(&run)).await?;
    let mut waiter = run.spec("waiter");
    waiter.hold_ms = millis(ttl);
    waiter.writes = 10;
    let mut waiter = run.start(&waiter).await?;
    // Let the replica receive the holder's key before the cut.
    tokio::time::sleep(Duration::from_millis(200)).await;
    run.fault(
        "primary cut off from its replica and Sentinels (the holder still reaches it)",
        Some(&holder),
    )?;
    topology.proxy.set(Direction::Both, Fault::Blackhole);
    topology.wait_promoted(Duration::from_secs(20)).await?;
    waiter.wait_for("granted", patience(&run)).await?;
    tokio::time::sleep(ttl).await;
    topology.proxy.heal();
    topology.proxy.reset();
    run.heal()?;
    let outcome = run.finish(vec![holder, waiter]).await;
    drop(topology);
    outcome
}
