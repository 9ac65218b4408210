//! The faults of the scenarios, each timed against the run's workers and healed: holder
//! pauses and crashes, delayed and dropped replies, partitions, server pauses, crashes and
//! isolation, and the private-server scenarios (a persistent Redis, a Sentinel split brain).

use std::time::Duration;

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use nix::sys::signal::Signal;

use super::{Scenario, millis, patience, writes_over};
use crate::CampaignError;
use crate::private::{SplitSentinel, persistent_redis};
use crate::run::{Campaign, Outcome, Run};
use crate::tiers::{
    Tier, Topology, crash, member, pause, restore, restore_if_replaced, restore_pair, resume,
};

pub(super) async fn holder_pause(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn pause_before_write(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn delayed_replies(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn server_pause(mut run: Run) -> Result<Outcome, CampaignError> {
    let ttl = run.ttl;
    let (holder, waiter) = holder_and_waiter(&mut run).await?;
    let deciders = run.tier.deciders(&run.key)?;
    run.fault(
        &format!("{} stopped (SIGSTOP) for 2 x TTL", deciders.join(", ")),
        Some(&holder),
    )?;
    for name in &deciders {
        pause(name)?;
    }
    tokio::time::sleep(ttl * 2).await;
    for name in &deciders {
        resume(name)?;
    }
    run.heal()?;
    let outcome = run.finish(vec![holder, waiter]).await;
    settle(&deciders).await;
    outcome
}

pub(super) async fn server_crash(
    mut run: Run,
    restart_after: Duration,
) -> Result<Outcome, CampaignError> {
    let topology = run.tier.topology;
    let (holder, waiter) = holder_and_waiter(&mut run).await?;
    let deciders = run.tier.deciders(&run.key)?;
    let failover = if topology == Topology::PostgresHa {
        ", pg-standby promoted"
    } else {
        ""
    };
    run.fault(
        &format!("{} killed (SIGKILL){failover}", deciders.join(", ")),
        Some(&holder),
    )?;
    let promoted = crash(topology, &deciders)?;
    tokio::time::sleep(restart_after).await;
    let clustered = topology.is_consensus() || topology.fails_over();
    if !clustered {
        for name in &deciders {
            restore(name).await?;
        }
        run.heal()?;
    } else if promoted {
        run.heal()?;
    }
    let outcome = run.finish(vec![holder, waiter]).await;
    if promoted {
        // The old primary would come back as a second primary: a new pair for the next run.
        restore_pair()?;
    } else if clustered {
        for name in &deciders {
            restore(name).await?;
        }
    }
    settle(&deciders).await;
    outcome
}

/// Waits until restarted or resumed Sentinel or cluster members have settled (a resumed
/// primary may have been replaced and must rejoin as a replica before the next scenario).
pub(super) async fn settle(deciders: &[String]) {
    for name in deciders
        .iter()
        .filter(|n| n.starts_with("sentinel-") || n.starts_with("cluster-"))
    {
        let _ = restore_if_replaced(name).await;
    }
}

/// A holder writing carefully every 100 ms for 5 × TTL, and a waiter queued behind it.
pub(super) async fn holder_and_waiter(
    run: &mut Run,
) -> Result<(crate::Worker, crate::Worker), CampaignError> {
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

pub(super) async fn holder_crash(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn partition(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn dropped_replies(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn leader_isolation(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn queued_waiter_expires(mut run: Run) -> Result<Outcome, CampaignError> {
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

pub(super) async fn proxy_for(run: &Run) -> Result<FaultProxy, CampaignError> {
    FaultProxy::start(&run.tier.hosts())
        .await
        .map_err(|e| CampaignError(format!("a fault proxy: {e}")))
}

pub(super) async fn persistent_crash(campaign: &Campaign) -> Result<Outcome, CampaignError> {
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

pub(super) async fn split_brain(campaign: &Campaign) -> Result<Outcome, CampaignError> {
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
