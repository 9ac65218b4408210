//! The scenarios: each a fault timed against lock workers, run on every tier it applies to.
//! The election rows time the same faults against election candidates
//! ([`WorkerSpec::elect`](crate::WorkerSpec::elect)) on the tiers whose backend has
//! elections, and are judged as the lock rows they repeat. The semaphore and read-write lock
//! rows do the same with permit takers and writers beside a companion worker
//! ([`Run::contend_for`]); the two contention rows check 10,000 grants of 8 processes of a
//! semaphore and of a read-write lock, without faults.

use std::time::Duration;

use lockkit::{LockkitConfig, Support};

use crate::CampaignError;
use crate::run::{Campaign, Outcome, Primitive, Run};
use crate::tiers::{Tier, Topology};

mod faults;

use faults::*;

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
    /// the etcd or ZooKeeper leader, the PostgreSQL server or primary with every process it
    /// forked) are stopped (SIGSTOP) for 2 × TTL while one worker holds the lock and another
    /// waits.
    ServerPause,
    /// The deciding servers are killed (SIGKILL) while the lock is held and restarted at once
    /// (Redis without persistence: the lock is forgotten; PostgreSQL recovers it from its
    /// WAL). On the PostgreSQL pair the primary is killed and the standby promoted at once: a
    /// failover (the pair is brought up afresh after the row).
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
    /// A waiter's connections are blackholed while it is queued, until its session (lease,
    /// PostgreSQL queue row) has expired; the holder then releases and a third worker queues: the expired waiter
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
            Scenario::LeaderIsolation => topology.is_consensus(),
            // The tiers whose waiters queue, each in a place that expires with its session.
            Scenario::QueuedWaiterExpires => topology.is_consensus() || topology.is_postgres(),
            _ => true,
        }
    }

    /// Runs the scenario on `tier`.
    ///
    /// # Errors
    /// When the scenario cannot be carried out (a worker or server does not do its part);
    /// safety findings are in the [`Outcome`], not errors.
    pub async fn run(self, campaign: &Campaign, tier: &Tier) -> Result<Outcome, CampaignError> {
        if matches!(
            self.lock_row(),
            Scenario::ServerPause | Scenario::ServerCrash
        ) {
            tier.prepare()?;
        }
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
