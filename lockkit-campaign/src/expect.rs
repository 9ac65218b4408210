//! What each scenario must show on each tier: the campaign's pass criteria.
//!
//! On every tier: no release deletes another holder's lock and no extend takes it back,
//! nothing is left on the servers, no grant is handed over with its validity gone. On the consensus tiers (etcd, ZooKeeper)
//! also: no stale write accepted, no fencing token regression or duplicate, and no overlap
//! under server faults. Per scenario:
//! - holder pause, pause before write: the pause outlasts the TTL, so every tier shows an
//!   overlap (that the scenario happened); the fenced resource refuses the stale write and
//!   accepts none, on every tier (every tier's tokens increase across holders).
//! - partition, delayed replies, dropped replies, holder crash: no overlap on any tier: a cut
//!   off holder's lost signal fires by its validity deadline, which the servers' expiry
//!   follows.
//! - server pause, server crash: no overlap on the consensus tiers; Redis single, Sentinel
//!   and Redlock (with an immediate restart) report theirs.
//! - delayed restart (Redlock), crash of a Redis with an fsync'd append-only file: no
//!   overlap.
//! - split brain (Sentinel): the overlaps are counted, not limited: that is what the tier
//!   gives up.
//! - leader isolation: no grant on the minority side.
//! - queued waiter expires: no overlap.

use crate::run::Outcome;
use crate::scenarios::Scenario;
use crate::tiers::Topology;

/// The criteria `outcome` of `scenario` on `topology` breaks, described; empty if it passes.
pub fn broken(outcome: &Outcome, topology: Topology, scenario: Scenario) -> Vec<String> {
    let v = &outcome.verdict;
    let mut broken = Vec::new();
    let mut require = |holds: bool, what: &str| {
        if !holds {
            broken.push(what.to_owned());
        }
    };
    require(v.foreign_releases == 0, "no foreign release");
    require(v.foreign_extends == 0, "no foreign extend");
    require(outcome.leaked == 0, "nothing left on the servers");
    require(v.late_grants == 0, "no grant after its validity");
    if topology.is_consensus() {
        require(v.stale_accepted == 0, "no stale write accepted");
        require(v.token_regressions == 0, "no token regression");
        require(v.token_duplicates == 0, "no duplicate token");
    }
    match scenario {
        Scenario::HolderPause | Scenario::PauseBeforeWrite => {
            require(v.overlaps >= 1, "the pause outlasted the lock (an overlap)");
            require(v.stale_rejected >= 1, "the stale write refused");
            require(v.stale_accepted == 0, "no stale write accepted");
        }
        Scenario::Partition
        | Scenario::DelayedReplies
        | Scenario::DroppedReplies
        | Scenario::HolderCrash
        | Scenario::DelayedRestart
        | Scenario::PersistentCrash
        | Scenario::QueuedWaiterExpires => require(v.overlaps == 0, "no overlap"),
        Scenario::ServerPause | Scenario::ServerCrash => {
            if topology.is_consensus() {
                require(v.overlaps == 0, "no overlap");
            }
        }
        Scenario::LeaderIsolation => require(v.acquisitions == 0, "no grant on the minority side"),
        Scenario::SplitBrain => {
            require(
                v.acquisitions >= 2,
                "the waiter was granted by the promoted replica",
            );
        }
    }
    match scenario {
        Scenario::HolderCrash | Scenario::Partition => {
            require(v.acquisitions >= 2, "the next worker was granted");
        }
        _ => {}
    }
    broken
}
