//! What each scenario must show on each tier: the campaign's pass criteria.
//!
//! On every tier: no release deletes another holder's lock and no extend takes it back,
//! nothing is left on the servers, no grant is handed over with its validity gone. On the
//! tiers that keep their grants through server faults ([`Topology::keeps_grants`]: the
//! consensus tiers, etcd and ZooKeeper, whose grants are on a majority; PostgreSQL single,
//! whose grants and fencing sequence are on its disk before a client hears of them; the
//! PostgreSQL pair, where they are on the synchronous standby's disk too) also: no stale write
//! accepted, no fencing token regression or duplicate, and no overlap under server faults
//! (a crash and restart, a pause, the pair's failover to its standby). Per scenario:
//! - holder pause, pause before write: the pause outlasts the TTL, so every tier shows an
//!   overlap (that the scenario happened); the fenced resource refuses the stale write and
//!   accepts none, on every tier (every tier's tokens increase across holders).
//! - partition, delayed replies, dropped replies, holder crash: no overlap on any tier: a cut
//!   off holder's lost signal fires by its validity deadline, which the servers' expiry
//!   follows.
//! - server pause, server crash: no overlap on the tiers that keep their grants (etcd,
//!   ZooKeeper, both PostgreSQL tiers); Redis single, Sentinel, Redlock (with an immediate
//!   restart) and the cluster report theirs. After a crash the waiter is granted (by the
//!   restarted server, the promoted replica or standby, the new leader): a tier that stays
//!   unusable after it fails the row.
//! - delayed restart (Redlock), crash of a Redis with an fsync'd append-only file: no
//!   overlap.
//! - split brain (Sentinel): the overlaps are counted, not limited: that is what the tier
//!   gives up.
//! - leader isolation: no grant on the minority side.
//! - queued waiter expires (etcd, ZooKeeper, PostgreSQL): no overlap.
//! - partition: also, explicitly, the cut-off holder's lost signal fired before the next
//!   grant to anyone else.
//! - election rows (holder pause, partition, server crash with election candidates): the
//!   criteria of the lock row they repeat, on the same tier; the leader's term is its fencing
//!   token. A tier whose backend has no elections (Redlock) shows them as not applicable.
//! - semaphore and rwlock rows (holder pause, partition, server crash): the criteria of the
//!   lock row they repeat, with overlaps judged by kind (a third holder of the semaphore of
//!   2; a writer beside anyone). Not applicable where the backend lacks the primitive.
//! - semaphore and rwlock contention: 10,000 grants, no overlap, no duplicate token.

use lockkit_core::testing::history::{Event, What};

use crate::run::Outcome;
use crate::scenarios::Scenario;
use crate::tiers::Topology;

/// The criteria `outcome` of `scenario` on `topology` breaks, described; empty if it passes.
pub fn broken(outcome: &Outcome, topology: Topology, scenario: Scenario) -> Vec<String> {
    if outcome.not_applicable.is_some() {
        return Vec::new();
    }
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
    require(v.under_floor == 0, "no grant under its validity floor");
    if topology.keeps_grants() {
        require(v.stale_accepted == 0, "no stale write accepted");
        require(v.token_regressions == 0, "no token regression");
        require(v.token_duplicates == 0, "no duplicate token");
    }
    match scenario.lock_row() {
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
        Scenario::ServerPause | Scenario::ServerCrash if topology.keeps_grants() => {
            require(v.overlaps == 0, "no overlap");
        }
        Scenario::LeaderIsolation => require(v.acquisitions == 0, "no grant on the minority side"),
        Scenario::SplitBrain => {
            require(
                v.acquisitions >= 2,
                "the waiter was granted by the promoted replica",
            );
        }
        Scenario::SemaphoreContention | Scenario::RwLockContention => {
            require(v.overlaps == 0, "no overlap");
            require(v.token_duplicates == 0, "no duplicate token");
            require(v.acquisitions >= 10_000, "10,000 grants");
        }
        _ => {}
    }
    match scenario.lock_row() {
        Scenario::HolderCrash | Scenario::Partition => {
            require(v.acquisitions >= 2, "the next worker was granted");
        }
        Scenario::ServerCrash => require(
            v.recovery.iter().all(Option::is_some),
            "the waiter was granted after the crash",
        ),
        _ => {}
    }
    if scenario.lock_row() == Scenario::Partition {
        require(
            lost_before_next_grant(&outcome.events),
            "the cut-off holder's lost signal before the next grant",
        );
    }
    broken
}

/// Whether, for every fault aimed at a worker, that worker's lost signal fired before any
/// other worker was granted after the fault (a grant with no lost signal before it fails).
pub fn lost_before_next_grant(events: &[Event]) -> bool {
    events.iter().enumerate().all(|(i, fault)| {
        let What::Fault {
            target: Some(target),
            ..
        } = &fault.what
        else {
            return true;
        };
        let later = &events[i + 1..];
        let lost = later
            .iter()
            .find(|e| &e.process == target && matches!(e.what, What::Lost { .. }))
            .map(|e| e.at_ns);
        let next = later
            .iter()
            .find(|e| &e.process != target && matches!(e.what, What::Granted { .. }))
            .map(|e| e.at_ns);
        match (lost, next) {
            (_, None) => true,
            (Some(lost), Some(next)) => lost < next,
            (None, Some(_)) => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use lockkit_core::testing::history::GrantKind;

    use super::*;

    fn at(at_ns: u64, process: &str, what: What) -> Event {
        Event {
            at_ns,
            process: process.to_owned(),
            key: "k".to_owned(),
            what,
        }
    }

    fn cut(at_ns: u64) -> Event {
        at(
            at_ns,
            "injector",
            What::Fault {
                description: "cut".to_owned(),
                target: Some("holder".to_owned()),
            },
        )
    }

    fn granted(at_ns: u64, process: &str) -> Event {
        at(
            at_ns,
            process,
            What::Granted {
                token: 2,
                remaining_ms: 1000,
                floor_ms: 100,
                kind: GrantKind::Exclusive,
            },
        )
    }

    #[test]
    fn a_lost_signal_before_the_next_grant_passes() {
        let events = [
            cut(1),
            at(5, "holder", What::Lost { token: 1 }),
            granted(6, "waiter"),
        ];
        assert!(lost_before_next_grant(&events));
    }

    #[test]
    fn a_grant_before_the_cut_off_holder_knew_fails() {
        let events = [
            cut(1),
            granted(4, "waiter"),
            at(5, "holder", What::Lost { token: 1 }),
        ];
        assert!(!lost_before_next_grant(&events));
        assert!(!lost_before_next_grant(&[cut(1), granted(4, "waiter")]));
    }

    #[test]
    fn a_fault_no_grant_followed_passes() {
        assert!(lost_before_next_grant(&[cut(1)]));
    }
}
