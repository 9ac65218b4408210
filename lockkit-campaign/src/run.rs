//! One run of a scenario on a tier: its directory, its fenced resource, the injector's own
//! history, its workers, and the verdict at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use lockkit_core::testing::check::{Verdict, check};
use lockkit_core::testing::fenced::FencedResource;
use lockkit_core::testing::history::{Event, HistoryWriter, What, merge, read_history};

use crate::CampaignError;
use crate::tiers::Tier;
use crate::worker::{Worker, WorkerSpec};

/// What a run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The tier's name.
    pub tier: String,
    /// The scenario's name.
    pub scenario: &'static str,
    /// What the checkers found in the merged history.
    pub verdict: Verdict,
    /// Faults injected.
    pub faults: usize,
    /// Lock records (keys, queue entries, znodes) still there once every live worker was idle
    /// and every dead one's TTL had passed.
    pub leaked: usize,
    /// How long the run took.
    pub took: Duration,
    /// Where its histories are.
    pub dir: PathBuf,
    /// The merged history.
    pub events: Vec<Event>,
    /// Why the scenario does not apply to the tier, when it was not run (elections on a
    /// backend without them): a row that shows it, neither a pass nor a failure.
    pub not_applicable: Option<String>,
}

impl Outcome {
    /// The row of `scenario` on `tier`, not run because of `why`.
    pub fn not_applicable(tier: &Tier, scenario: &'static str, why: String) -> Outcome {
        Outcome {
            tier: tier.name().to_owned(),
            scenario,
            verdict: Verdict::default(),
            faults: 0,
            leaked: 0,
            took: Duration::ZERO,
            dir: PathBuf::new(),
            events: Vec::new(),
            not_applicable: Some(why),
        }
    }
}

/// The permits of a semaphore run's semaphore: one for the companion, one contended.
pub const SEMAPHORE_PERMITS: u32 = 2;

/// What the workers of a run contend for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// The lock `key`.
    Lock,
    /// The election `key` ([`WorkerSpec::elect`]).
    Election,
    /// The semaphore `key` of [`SEMAPHORE_PERMITS`] permits, one of which the run's
    /// companion holds throughout ([`Run::contend_for`]).
    Semaphore,
    /// The write lock of the read-write lock `key`, while the run's companion reads.
    RwLock,
}

/// Shared settings of a campaign.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The `lockkit-campaign` executable, run as `worker`.
    pub worker_exe: PathBuf,
    /// Where runs keep their histories.
    pub dir: PathBuf,
    /// The TTL of every lock.
    pub ttl: Duration,
}

/// A scenario run in progress.
#[derive(Debug)]
pub struct Run {
    /// The tier.
    pub tier: Tier,
    /// The lock's name.
    pub key: String,
    /// Further lock names the run's workers use (looked at for leftovers too).
    pub extra_keys: Vec<String>,
    /// The TTL of every lock.
    pub ttl: Duration,
    /// What the workers contend for.
    pub primitive: Primitive,
    /// The permits of the semaphore, in a [`Primitive::Semaphore`] run.
    pub permits: u32,
    /// The worker that shares the key with the scenario's workers throughout, if the
    /// primitive has one ([`Primitive::Semaphore`], [`Primitive::RwLock`]).
    companion: Option<Worker>,
    scenario: &'static str,
    worker_exe: PathBuf,
    dir: PathBuf,
    resource: FencedResource,
    injector: HistoryWriter,
    histories: Vec<PathBuf>,
    faults: usize,
    started: Instant,
}

impl Run {
    /// Starts a run of `scenario` on `tier`: a fresh directory, key and fenced resource.
    ///
    /// # Errors
    /// When the directory or the resource cannot be made.
    pub async fn new(
        campaign: &Campaign,
        tier: &Tier,
        scenario: &'static str,
    ) -> Result<Run, CampaignError> {
        let key = format!("{scenario}-{:08x}", rand::random::<u32>());
        let dir = campaign.dir.join(format!("{}-{key}", tier.name()));
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, &e))?;
        let injector_path = dir.join("injector.jsonl");
        Ok(Run {
            tier: tier.clone(),
            ttl: campaign.ttl,
            primitive: Primitive::Lock,
            permits: SEMAPHORE_PERMITS,
            companion: None,
            scenario,
            worker_exe: campaign.worker_exe.clone(),
            resource: FencedResource::start()
                .await
                .map_err(|e| CampaignError(format!("the fenced resource: {e}")))?,
            injector: HistoryWriter::create(&injector_path, "injector")
                .map_err(|e| io_error(&injector_path, &e))?,
            histories: vec![injector_path],
            faults: 0,
            started: Instant::now(),
            key,
            extra_keys: Vec::new(),
            dir,
        })
    }

    /// A worker spec for `name` on this run's key, TTL and resource, taking the lock once.
    pub fn spec(&self, name: &str) -> WorkerSpec {
        WorkerSpec {
            name: name.to_owned(),
            url: self.tier.url.clone(),
            key: self.key.clone(),
            ttl_ms: u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            history: self.dir.join(format!("{name}.jsonl")),
            resource: self.resource.address().to_owned(),
            iterations: 1,
            deadline_ms: 120_000,
            hold_ms: 0,
            writes: 1,
            naive: false,
            stop_after_check: false,
            acquire_timeout_ms: 30_000,
            between_ms: 0,
            break_fencing: false,
            elect: self.primitive == Primitive::Election,
            permits: (self.primitive == Primitive::Semaphore).then_some(self.permits),
            read: false,
            write: self.primitive == Primitive::RwLock,
            until_told: false,
        }
    }

    /// Makes the run's workers contend for `primitive`, and starts its companion: for a
    /// semaphore, a worker that takes one of its two permits (before anyone else) and holds
    /// it until the run finishes, so that the scenario's workers contend for the other; for
    /// a read-write lock, a worker that reads (no writes), 100 ms at a time, while the
    /// scenario's workers write.
    ///
    /// # Errors
    /// When the companion cannot be started or granted.
    pub async fn contend_for(&mut self, primitive: Primitive) -> Result<(), CampaignError> {
        self.primitive = primitive;
        let mut spec = self.spec("companion");
        spec.writes = 0;
        match primitive {
            Primitive::Lock | Primitive::Election => return Ok(()),
            Primitive::Semaphore => spec.until_told = true,
            Primitive::RwLock => {
                spec.write = false;
                spec.read = true;
                spec.iterations = 40;
                spec.hold_ms = 100;
                spec.between_ms = 100;
            }
        }
        let mut companion = self.start(&spec).await?;
        companion
            .wait_for("granted", self.ttl * 4 + Duration::from_secs(20))
            .await?;
        self.companion = Some(companion);
        Ok(())
    }

    /// Starts a worker.
    ///
    /// # Errors
    /// When it cannot be started.
    pub async fn start(&mut self, spec: &WorkerSpec) -> Result<Worker, CampaignError> {
        self.histories.push(spec.history.clone());
        Worker::spawn(&self.worker_exe, spec).await
    }

    fn record(&mut self, what: What) -> Result<(), CampaignError> {
        self.injector
            .record(&self.key, what)
            .map(drop)
            .map_err(|e| CampaignError(format!("the injector's history: {e}")))
    }

    /// Records that a fault starts now, aimed at `target` (a worker) if at one.
    ///
    /// # Errors
    /// When the history cannot be written.
    pub fn fault(
        &mut self,
        description: &str,
        target: Option<&Worker>,
    ) -> Result<(), CampaignError> {
        self.faults += 1;
        self.record(What::Fault {
            description: description.to_owned(),
            target: target.map(|w| w.name.clone()),
        })
    }

    /// Records that the faults end now.
    ///
    /// # Errors
    /// When the history cannot be written.
    pub fn heal(&mut self) -> Result<(), CampaignError> {
        self.record(What::Heal)
    }

    /// Kills `worker` (SIGKILL) and records it as a fault.
    ///
    /// # Errors
    /// When the history cannot be written.
    pub async fn kill(&mut self, worker: &mut Worker) -> Result<(), CampaignError> {
        // No target: a dead worker has no lost signal to wait for.
        self.fault(&format!("{} killed (SIGKILL)", worker.name), None)?;
        worker.kill().await;
        let event = lockkit_core::testing::history::Event {
            at_ns: lockkit_core::testing::history::monotonic_ns(),
            process: worker.name.clone(),
            key: self.key.clone(),
            what: What::Killed,
        };
        // Recorded in the injector's file, on the worker's behalf.
        let line = serde_json::to_string(&event).map_err(|e| CampaignError(e.to_string()))?;
        let path = self.dir.join(format!("{}-killed.jsonl", worker.name));
        std::fs::write(&path, format!("{line}\n")).map_err(|e| io_error(&path, &e))?;
        self.histories.push(path);
        Ok(())
    }

    /// Waits for every worker to be idle, looks for leftovers while they are alive, lets them
    /// exit, and checks the merged history.
    ///
    /// # Errors
    /// When a worker does not finish, or a history cannot be read.
    pub async fn finish(mut self, workers: Vec<Worker>) -> Result<Outcome, CampaignError> {
        let mut workers = workers;
        if let Some(mut companion) = self.companion.take() {
            if self.primitive == Primitive::Semaphore {
                companion.tell().await?;
            }
            workers.push(companion);
        }
        for worker in &mut workers {
            worker.wait_idle(Duration::from_secs(120)).await?;
        }
        let leaked = self.leftovers().await?;
        for worker in workers {
            worker.finish().await;
        }
        let mut histories = vec![self.resource.events()];
        for path in &self.histories {
            histories.push(read_history(path).map_err(|e| io_error(path, &e))?);
        }
        let events = merge(histories);
        let all = serde_json::to_string(&events).map_err(|e| CampaignError(e.to_string()))?;
        let merged = self.dir.join("merged.json");
        std::fs::write(&merged, all).map_err(|e| io_error(&merged, &e))?;
        Ok(Outcome {
            tier: self.tier.name().to_owned(),
            scenario: self.scenario,
            verdict: check(&events),
            faults: self.faults,
            leaked,
            took: self.started.elapsed(),
            dir: self.dir,
            events,
            not_applicable: None,
        })
    }

    /// How many of the run's locks still have a record on the servers once the TTL of any
    /// dead holder has passed (every live worker is idle then, holding nothing and queued
    /// nowhere).
    async fn leftovers(&self) -> Result<usize, CampaignError> {
        let mut leaked = 0;
        for key in std::iter::once(&self.key).chain(&self.extra_keys) {
            leaked += self.leftover(key).await?;
        }
        Ok(leaked)
    }

    /// Whether `key` has a record on the servers: a holder of the lock, or, in an election
    /// run, a leader or a proclaimed value that outlived its grant. A semaphore or a
    /// read-write lock is looked at by what a record of it would do: a permit that cannot be
    /// had (of the two), a write or a read lock refused.
    async fn held(&self, locks: &LockClient, key: &str) -> Result<bool, CampaignError> {
        match self.primitive {
            Primitive::Lock => Ok(locks.inspect(key).await?.is_some()),
            Primitive::Election => Ok(locks.inspect(key).await?.is_some()
                || locks.election(key)?.leader().await?.is_some()),
            Primitive::Semaphore => {
                let semaphore = locks.semaphore(key, self.permits)?;
                let mut permits = Vec::new();
                for _ in 0..self.permits {
                    match semaphore.try_acquire().await? {
                        Some(permit) => permits.push(permit),
                        None => break,
                    }
                }
                let all = permits.len() == self.permits as usize;
                for permit in permits {
                    permit.release().await?;
                }
                Ok(!all)
            }
            Primitive::RwLock => {
                let rwlock = locks.rwlock(key)?;
                let Some(written) = rwlock.try_write().await? else {
                    return Ok(true);
                };
                written.release().await?;
                let Some(read) = rwlock.try_read().await? else {
                    return Ok(true);
                };
                read.release().await?;
                Ok(false)
            }
        }
    }

    /// 1 if `key` still has a record on the servers (see [`Run::leftovers`]).
    async fn leftover(&self, key: &str) -> Result<usize, CampaignError> {
        let patience = self.ttl * 3 + Duration::from_secs(10);
        let started = Instant::now();
        let mut observer: Option<LockClient> = None;
        loop {
            // A cluster that has just lost or regained members may refuse for a moment.
            let looked = match &observer {
                Some(locks) => self.held(locks, key).await,
                None => match self.observer().await {
                    Ok(locks) => {
                        observer = Some(locks);
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            let late = started.elapsed() > patience;
            match looked {
                Ok(false) => return Ok(0),
                Ok(true) if late => return Ok(1),
                Err(e) if late => {
                    return Err(CampaignError(format!("cannot look for leftovers: {e}")));
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// A client of the tier for the driver's own looks (not through any proxy).
    ///
    /// # Errors
    /// When the tier cannot be reached.
    pub async fn observer(&self) -> Result<LockClient, CampaignError> {
        Ok(lockkit::connect(&LockkitConfig::from_url(&self.tier.url)?).await?)
    }

    /// The run's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn io_error(path: &Path, e: &std::io::Error) -> CampaignError {
    CampaignError(format!("{}: {e}", path.display()))
}
