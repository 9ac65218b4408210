//! The nemesis of the randomized campaign: the kinds of fault it draws, and how each is
//! caused and healed.

use std::time::{Duration, Instant};

use lockkit_core::testing::proxy::{Direction, Fault};
use nix::sys::signal::Signal;
use rand::RngExt;
use rand::rngs::StdRng;

use crate::CampaignError;
use crate::run::Run;
use crate::tiers::{Topology, crash, pause, restore, restore_if_replaced, resume};

use super::{Plan, Slot, spawn};

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
    /// On the PostgreSQL pair, the primary killed and the standby promoted at once (a
    /// failover, once a run: the promoted standby has no standby of its own, so a later kill
    /// restarts it at once, as on a single server).
    ServerKill,
    /// The deciding servers stopped (`SIGSTOP`) for 0.5-2 × TTL (a PostgreSQL server with
    /// every process it forked).
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

    pub(super) fn is_server_fault(self) -> bool {
        matches!(self, Nemesis::ServerKill | Nemesis::ServerPause)
    }
}

/// Causes one fault of `kind` (aimed at `slots[victim]` where it hits one worker) and heals
/// it; returns the name of the worker it hit.
pub(super) async fn inject(
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
        let pause_for = ttl.mul_f64(rng.random_range(0.5..2.0));
        run.fault(
            &format!(
                "{} stopped (SIGSTOP) for {pause_for:?}",
                deciders.join(", ")
            ),
            None,
        )?;
        for name in &deciders {
            pause(name)?;
        }
        tokio::time::sleep(pause_for).await;
        for name in &deciders {
            resume(name)?;
        }
    } else {
        let down = match topology {
            Topology::Etcd | Topology::Zk => ttl.mul_f64(rng.random_range(0.0..2.0)),
            Topology::Redlock => ttl.mul_f64(rng.random_range(0.0..1.0)) + Duration::from_secs(1),
            Topology::Redis
            | Topology::Sentinel
            | Topology::Cluster
            | Topology::Postgres
            | Topology::PostgresHa => Duration::ZERO,
        };
        let failover =
            topology == Topology::PostgresHa && deciders.iter().any(|n| n == "pg-primary");
        let then = if failover {
            "pg-standby promoted".to_owned()
        } else {
            format!("restarted after {down:?}")
        };
        run.fault(
            &format!("{} killed (SIGKILL), {then}", deciders.join(", ")),
            None,
        )?;
        if !crash(topology, &deciders)? {
            tokio::time::sleep(down).await;
            for name in &deciders {
                restore(name).await?;
            }
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
