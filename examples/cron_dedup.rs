//! A job scheduled every second on 5 instances must run once per tick, not 5 times. Two ways:
//! a lock per tick (the default), or one elected scheduler (`--elected`).
//!
//! ```sh
//! cargo run --example cron_dedup                                   # in-process (memory)
//! cargo run --features redis --example cron_dedup -- redis://127.0.0.1:6379
//! cargo run --example cron_dedup -- --quick                        # 5 ticks of 200 ms
//! cargo run --example cron_dedup -- --quick --elected              # an elected one, 5 ticks of 1 s
//! ```
//!
//! **A lock per tick.** Each instance, at each tick, tries the lock `job-<tick>` without
//! waiting and runs the job only if it got it. The lock is deliberately NOT released after
//! the job: it expires by itself after a few ticks, so an instance whose clock or scheduler
//! runs late cannot take the same tick again once the first one finished. (Releasing it would
//! let a late instance run the tick a second time.) On etcd and ZooKeeper a lock lives as long
//! as its client's session, renewed or not: there it lasts until the instance drops it at the
//! end of the run. An instance whose `try_lock` fails (the lock service is unreachable, an
//! election) skips that tick, as a real scheduler would; its error is shown in the tick's row,
//! and the exit status is then 1.
//!
//! **An elected scheduler.** Every instance campaigns in the election `scheduler`
//! (`Election::run_as_leader`); the leader runs every tick due while it leads, the others
//! run nothing. Halfway through, the example kills the leading instance (aborts its task and
//! drops its client, so its leadership is released: a process killed with SIGKILL would
//! instead be replaced after its TTL or session timeout, and the ticks in between would run
//! nowhere), and the next candidate takes over. An observer (`Election::observe`) prints
//! the leader changes. Each run records its term: pass it with every write the job makes, so
//! that a deposed leader still running is refused.
//!
//! Either way the output is the number of runs per tick, which must be 1 (the exit status is
//! 1 otherwise).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockkit::{Leader, LockClient, LockOptions, LockkitConfig};

#[path = "compare/failed.rs"]
mod failed;

const INSTANCES: usize = 5;

/// Per tick, what ran it: the instance, and the term it led in (elected mode).
type Runs = Arc<Mutex<BTreeMap<usize, Vec<(usize, Option<u64>)>>>>;
/// The leader changes an observer saw, with when it saw them.
type Observed = Arc<Mutex<Vec<(Instant, Option<Leader>)>>>;
/// Per tick, the failed calls.
type Errors = Arc<Mutex<BTreeMap<usize, Vec<String>>>>;

fn record<T>(map: &Mutex<BTreeMap<usize, Vec<T>>>, tick: usize, item: T) {
    map.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(tick)
        .or_default()
        .push(item);
}

/// The schedule every instance follows: tick `t` fires at `start + period * t`.
#[derive(Clone, Copy)]
struct Schedule {
    start: Instant,
    period: Duration,
    ticks: usize,
}

impl Schedule {
    fn at(&self, tick: usize) -> Instant {
        self.start + self.period * tick as u32
    }

    /// Seconds from the first tick to `moment` (negative before it).
    fn since_first_tick(&self, moment: Instant) -> f64 {
        match moment.checked_duration_since(self.start) {
            Some(after) => after.as_secs_f64(),
            None => -(self.start - moment).as_secs_f64(),
        }
    }

    /// Waits for `tick`, a little late, by a different amount each time, as schedulers are.
    async fn fire(&self, tick: usize) {
        let jitter = Duration::from_millis(rand::random_range(0..20));
        tokio::time::sleep_until((self.at(tick) + jitter).into()).await;
    }
}

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let elected = args.iter().any(|a| a == "--elected");
    let url = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "memory://".to_owned());
    let (ticks, period) = if quick {
        // An elected scheduler's takeover (the killed leader's session ends, the next
        // candidate is granted and proclaims) must fit in most of a period: on etcd under
        // load it took 0.32 s, which a 200 ms period does not leave.
        (5, Duration::from_millis(if elected { 1000 } else { 200 }))
    } else {
        (20, Duration::from_secs(1))
    };
    let config = LockkitConfig::from_url(&url)?;
    let ttl = (period * 3).max(Duration::from_secs(2));
    // Per-tick locks expire rather than being released or renewed; a leadership is renewed.
    let options = LockOptions::default()
        .with_ttl(ttl)
        .with_auto_renew(elected);
    // One client per instance (and one for the observer), as separate processes would have;
    // the memory backend only excludes within one client, so in-process runs share it.
    let shared = lockkit::connect(&config).await?;
    let namespace = format!("cron-{:08x}", rand::random::<u32>());
    let mut clients = Vec::new();
    for _ in 0..=INSTANCES {
        clients.push(if config.backend == lockkit::BackendKind::Memory {
            LockClient::with_options(shared.backend().clone(), &namespace, options.clone())?
        } else {
            let mut config = config.clone();
            config.namespace.clone_from(&namespace);
            config.lock = options.clone();
            lockkit::connect(&config).await?
        });
    }
    let runs = Runs::default();
    let errors = Errors::default();
    let report = if elected {
        elected_scheduler(clients, ticks, period, &runs, &errors).await?
    } else {
        let schedule = Schedule {
            start: Instant::now() + Duration::from_millis(200),
            period,
            ticks,
        };
        eprintln!("{INSTANCES} instances connected; the first tick fires in 200 ms");
        per_tick_locks(clients, schedule, &runs, &errors).await?
    };
    let runs = runs.lock().unwrap_or_else(PoisonError::into_inner);
    let errors = errors.lock().unwrap_or_else(PoisonError::into_inner);
    let way = if elected {
        "an elected scheduler"
    } else {
        "a lock per tick"
    };
    println!("{INSTANCES} instances, {ticks} ticks every {period:?} on {url}, {way}\n");
    println!(
        "| tick | runs | by instance{} | errors |",
        if elected { " (term)" } else { "" }
    );
    println!("|---:|---:|---|---|");
    let mut wrong = 0;
    for tick in 0..ticks {
        let by = runs.get(&tick).cloned().unwrap_or_default();
        wrong += usize::from(by.len() != 1);
        let by: Vec<String> = by
            .iter()
            .map(|(instance, term)| match term {
                Some(term) => format!("{instance} ({term})"),
                None => instance.to_string(),
            })
            .collect();
        let failed = errors.get(&tick).map_or(String::new(), |e| e.join("; "));
        println!("| {tick} | {} | {} | {failed} |", by.len(), by.join(", "));
    }
    println!("\n{} of {ticks} ticks ran exactly once", ticks - wrong);
    let failed: usize = errors.values().map(Vec::len).sum();
    if failed > 0 {
        println!(
            "{failed} {} failed",
            if elected { "calls" } else { "try_lock calls" }
        );
    }
    if !report.is_empty() {
        println!("\n{report}");
    }
    if wrong > 0 || failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Every instance tries the tick's lock; the one that gets it runs the tick.
async fn per_tick_locks(
    mut clients: Vec<LockClient>,
    schedule: Schedule,
    runs: &Runs,
    errors: &Errors,
) -> lockkit::Result<String> {
    clients.truncate(INSTANCES);
    let mut instances = tokio::task::JoinSet::new();
    for (instance, locks) in clients.into_iter().enumerate() {
        let (runs, errors) = (runs.clone(), errors.clone());
        instances.spawn(async move {
            // Kept, not released, until every instance is done: a release would hand the tick
            // to an instance that fires later.
            let mut taken = Vec::new();
            for tick in 0..schedule.ticks {
                schedule.fire(tick).await;
                match locks.mutex(&format!("job-{tick}"))?.try_lock().await {
                    Ok(Some(guard)) => {
                        record(&runs, tick, (instance, None));
                        // The job runs here; the lock stays until it expires.
                        taken.push(guard);
                    }
                    Ok(None) => {}
                    Err(e) => record(
                        &errors,
                        tick,
                        format!("instance {instance}: {}", failed::describe(&e)),
                    ),
                }
            }
            Ok::<_, lockkit::Error>(taken)
        });
    }
    let mut taken = Vec::new();
    while let Some(joined) = instances.join_next().await {
        taken.push(joined.map_err(|e| {
            lockkit::Error::new(lockkit::ErrorKind::Backend, "cron_dedup", e.to_string())
        })??);
    }
    drop(taken);
    Ok(String::new())
}

/// Every instance campaigns; the leader runs the ticks while it leads. The schedule starts a
/// period after an observer first sees a leader (a first election can take longer than a
/// period on a loaded machine, and a tick before anyone leads would run nowhere). The leader
/// is killed after the middle tick; returns the leader changes the observer saw.
async fn elected_scheduler(
    mut clients: Vec<LockClient>,
    ticks: usize,
    period: Duration,
    runs: &Runs,
    errors: &Errors,
) -> lockkit::Result<String> {
    let watcher = clients.pop().map(|c| c.election("scheduler")).transpose()?;
    let Some(watcher) = watcher else {
        return Ok(String::new());
    };
    let (started, mut start) = tokio::sync::watch::channel(None::<Schedule>);
    let observed: Observed = Arc::default();
    let observer = tokio::spawn({
        let (observed, watcher) = (observed.clone(), watcher.clone());
        async move {
            use futures_util::StreamExt;
            let mut changes = watcher.observe();
            while let Some(change) = changes.next().await {
                // An error is shown as the tick's error by the instances; the stream goes on.
                if let Ok(leader) = change {
                    let now = Instant::now();
                    if leader.is_some() && started.borrow().is_none() {
                        let schedule = Schedule {
                            start: now + period,
                            period,
                            ticks,
                        };
                        eprintln!("a leader is elected; the first tick fires in {period:?}");
                        started.send_replace(Some(schedule));
                    }
                    observed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((now, leader));
                }
            }
        }
    });
    let mut instances = tokio::task::JoinSet::new();
    let mut kill_switches = Vec::new();
    for (instance, locks) in clients.iter().enumerate() {
        // A pause after a lost leadership as long as a tick: another instance takes over.
        let election = locks.election("scheduler")?.with_retry_pause(period);
        let (runs, errors, start) = (runs.clone(), errors.clone(), start.clone());
        kill_switches.push(instances.spawn(async move {
            let campaigned = election
                .run_as_leader(format!("instance-{instance}"), |leadership| {
                    let runs = runs.clone();
                    let mut start = start.clone();
                    async move {
                        let Some(schedule) = started_schedule(&mut start).await else {
                            return;
                        };
                        // The ticks due from the moment this instance leads.
                        let now = Instant::now();
                        let first = (0..schedule.ticks).find(|&t| schedule.at(t) >= now);
                        for tick in first.unwrap_or(schedule.ticks)..schedule.ticks {
                            schedule.fire(tick).await;
                            // The validity may have passed before the lost signal fired.
                            if !leadership.is_lost() {
                                record(&runs, tick, (instance, Some(leadership.term().get())));
                            }
                        }
                        // Leading on, without a job, until the run ends: resigning now would
                        // hand the election to every waiting candidate in turn.
                        std::future::pending::<()>().await;
                    }
                })
                .await;
            if let Err(e) = campaigned {
                record(
                    &errors,
                    ticks.saturating_sub(1),
                    format!("instance {instance}: {}", failed::describe(&e)),
                );
            }
        }));
    }

    let Some(schedule) = started_schedule(&mut start).await else {
        record(errors, 0, "nobody led within 30 s".to_owned());
        return Ok(String::new());
    };
    // Just after the middle tick ran: the next one has most of a period to take over.
    let kill_after = schedule.ticks / 2 - 1;
    tokio::time::sleep_until((schedule.at(kill_after) + schedule.period / 4).into()).await;
    let killed = match watcher.leader().await {
        Ok(Some(Leader {
            value: Some(value),
            term,
            ..
        })) => value
            .strip_prefix("instance-")
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|&i| i < kill_switches.len())
            .map(|i| (i, term)),
        Ok(_) => None,
        Err(e) => {
            record(
                errors,
                kill_after,
                format!("leader(): {}", failed::describe(&e)),
            );
            None
        }
    };
    let killed_line = match killed {
        Some((instance, term)) => {
            kill_switches[instance].abort();
            // Its client goes with it: on etcd and ZooKeeper, its session ends.
            clients.remove(instance);
            eprintln!(
                "killed the leader, instance {instance} (term {term}), after tick {kill_after}"
            );
            format!("killed the leader, instance {instance} (term {term}), after tick {kill_after}")
        }
        None => {
            record(errors, kill_after, "nobody led after this tick".to_owned());
            String::new()
        }
    };

    // After the last tick: the observer stops, then every instance (the leader resigns as
    // its task is dropped, the candidates withdraw).
    tokio::time::sleep_until((schedule.at(schedule.ticks) + schedule.period / 2).into()).await;
    observer.abort();
    let _ = observer.await;
    instances.abort_all();
    while instances.join_next().await.is_some() {}
    for locks in &clients {
        locks.close().await;
    }

    let observed = observed.lock().unwrap_or_else(PoisonError::into_inner);
    let mut report = format!("{killed_line}\nthe leader changes an observer saw:\n");
    for (at, leader) in observed.iter() {
        let at = schedule.since_first_tick(*at);
        let state = match leader {
            Some(leader) => format!("{leader}"),
            None => "nobody leads".to_owned(),
        };
        report.push_str(&format!("  {at:>+7.3} s from tick 0: {state}\n"));
    }
    let leaders: std::collections::BTreeSet<_> = observed
        .iter()
        .filter_map(|(_, leader)| leader.as_ref().map(|l| l.term))
        .collect();
    if killed.is_some() && leaders.len() < 2 {
        record(
            errors,
            schedule.ticks - 1,
            "nobody took over from the killed leader".to_owned(),
        );
    }
    Ok(report)
}

/// The schedule, once the observer has seen a first leader; `None` if nobody led within 30 s.
async fn started_schedule(
    start: &mut tokio::sync::watch::Receiver<Option<Schedule>>,
) -> Option<Schedule> {
    let started = tokio::time::timeout(Duration::from_secs(30), start.wait_for(Option::is_some));
    match started.await {
        Ok(Ok(schedule)) => *schedule,
        _ => None,
    }
}
