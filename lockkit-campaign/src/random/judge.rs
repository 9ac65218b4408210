//! The judgement of a randomized run: which faults were in force, which overlaps and split-brain
//! effects the tier documents, availability and waits, and the Markdown table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use lockkit_core::testing::check::Overlap;
use lockkit_core::testing::history::{Event, What};

use crate::run::Outcome;
use crate::tiers::Topology;

use super::Nemesis;

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
    /// Foreign releases that a server fault explains: the later holder's lock was on the
    /// primary that lost the split brain (or on a server that forgot it), and went with it,
    /// not with the other holder's release, which only ever deletes its own lock. Whether
    /// the two held at once or not: a grant answered by the losing primary after its
    /// resumption can start just after the other holder sent its release.
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

/// Whether a fault explains `overlap` on `topology` (see the module docs): a pause of one of
/// the two holders, or, on the Redis tiers, a server fault.
pub(super) fn explained(
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
/// grant, or two of them granted at once. None does on the tiers that keep their grants
/// ([`Topology::keeps_grants`]: etcd, ZooKeeper, PostgreSQL).
pub(super) fn split_by_servers(
    overlap: &Overlap,
    windows: &[FaultWindow],
    topology: Topology,
    ttl: Duration,
) -> bool {
    !topology.keeps_grants()
        && windows
            .iter()
            .any(|w| w.kind.is_server_fault() && in_force(overlap, w, ttl))
}

/// Whether a server fault of a Redis tier was in force (or healed less than two TTLs
/// before) when a grant started at `start`: its lock may have been on a server that then
/// lost it.
pub(super) fn granted_in_server_fault(
    start: u64,
    windows: &[FaultWindow],
    topology: Topology,
    ttl: Duration,
) -> bool {
    let slack = u64::try_from((ttl * 2).as_nanos()).unwrap_or(u64::MAX);
    !topology.keeps_grants()
        && windows.iter().any(|w| {
            w.kind.is_server_fault() && w.start < start && w.end.saturating_add(slack) > start
        })
}

/// Whether fault `w` began before the overlap ended and was in force (or healed less than two
/// TTLs before) when the first grant started.
pub(super) fn in_force(overlap: &Overlap, w: &FaultWindow, ttl: Duration) -> bool {
    let slack = u64::try_from((ttl * 2).as_nanos()).unwrap_or(u64::MAX);
    w.start < overlap.until && w.end.saturating_add(slack) > overlap.first_start
}

/// The share of the time some worker held each key while a worker wanted it, and the 99th
/// percentile of the waits from asking to being granted.
pub(super) fn availability_and_wait(events: &[Event]) -> (f64, Duration) {
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

pub(super) fn millis(d: Duration) -> u64 {
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
