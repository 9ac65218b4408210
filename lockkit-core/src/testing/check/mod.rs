//! Checkers over a merged history (see [`history`](super::history)): what a run of lock
//! workers, a fenced resource and a fault injector proves about a tier.
//!
//! Definitions, per key:
//! - A grant's *critical section* runs from `Granted` to the first of its `Lost`, its
//!   `Release` and its worker's `Killed` (or the end of the history), stretched to its last
//!   write to the fenced resource: a worker that writes after its lock was lost was still
//!   acting as the holder.
//! - An *overlap* is a pair of critical sections of different grants that intersect where
//!   their [`GrantKind`]s do not let them: two reads may; a write, a mutex's or a leader's
//!   grant may not beside anyone. For the permits of a semaphore of `N`, an overlap is a
//!   grant that starts while `N` others are live (over-admission), lasting until fewer than
//!   `N` others are.
//! - A *token regression* is a grant whose token is lower than that of a grant completed
//!   before it was asked for; a *duplicate* is a token handed out twice.
//! - A *stale write accepted* is a write the resource stored from a holder whose lock had
//!   passed on: a later grant had been handed out and had already written to the resource.
//!   (Between a new grant and its first write, the resource cannot know of it, so an old
//!   holder's write there is no fencing failure; such writes show as overlaps.) With
//!   increasing tokens the resource refuses all of these: one it stores means tokens went
//!   backwards. A *stale write rejected* is a write the resource refused.
//! - A *foreign release* is a release that answered `ok` while a later grant was live, after
//!   which that later holder found its lock gone (its own release answered `not_held`,
//!   within the guard's validity, without its lost signal having fired): the first release
//!   deleted the second's lock. A release answered after the guard's validity (`expired`)
//!   proves nothing: the lease may have expired first.
//! - A *foreign extend* is an extend that answered `ok` after a later grant had been handed
//!   out that its kind does not admit beside it (for a permit: while `N` others were live):
//!   the holder's lease had passed on, and it claimed the lock back.
//! - A *late grant* is one handed over with no validity left; a grant *under the floor*,
//!   one handed over with less than its floor of validity (a tenth of what the backend can
//!   promise), where the history records the floor. Workers record the validity the guard
//!   was handed out with ([`granted_validity`](crate::MutexGuard::granted_validity)), which
//!   does not depend on when their thread reads it (a paused or descheduled worker reads
//!   what the core gave it).
//! - *Recovery* is the time from a fault to the next grant of a worker it did not hit;
//!   *lost-signal lag* the time from a fault to the lost signal of the worker it hit.

use std::collections::HashMap;
use std::time::Duration;

use super::history::{Event, GrantKind, What};

/// What a history shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Grants handed out.
    pub acquisitions: usize,
    /// Acquires that failed or timed out.
    pub failed_acquires: usize,
    /// Pairs of overlapping critical sections.
    pub overlaps: usize,
    /// The summed length of those overlaps.
    pub overlap_total: Duration,
    /// The longest of them.
    pub overlap_max: Duration,
    /// Grants whose token was below an earlier completed grant's.
    pub token_regressions: usize,
    /// Tokens handed out more than once (each extra grant counts).
    pub token_duplicates: usize,
    /// Writes the fenced resource refused.
    pub stale_rejected: usize,
    /// Writes the fenced resource stored although a newer grant existed.
    pub stale_accepted: usize,
    /// Releases that deleted another holder's lock.
    pub foreign_releases: usize,
    /// Extends that succeeded after the lock had passed to another holder.
    pub foreign_extends: usize,
    /// Grants handed over with no validity left.
    pub late_grants: usize,
    /// Grants handed over with validity left, but less than their floor.
    pub under_floor: usize,
    /// Lost signals that fired.
    pub lost_signals: usize,
    /// Per fault: time to the next grant of a worker it did not hit (`None`: none came,
    /// although the fault was aimed at a worker; faults aimed at none that no grant followed
    /// are left out).
    pub recovery: Vec<Option<Duration>>,
    /// Per fault aimed at a worker: time to that worker's lost signal (`None`: it never
    /// fired).
    pub lost_lag: Vec<Option<Duration>>,
    /// The first violations, described, for a failure message.
    pub violations: Vec<String>,
    /// Every overlap, for judging which fault explains it.
    pub overlapping: Vec<Overlap>,
    /// Every stale write the resource accepted, for the same judgement.
    pub stale: Vec<StaleWrite>,
    /// Every foreign release, for the same judgement.
    pub foreign: Vec<ForeignRelease>,
}

/// A write the fenced resource stored although a grant that started after the writer's had
/// already written: counted in [`Verdict::stale_accepted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleWrite {
    /// The key.
    pub key: String,
    /// The writer, and when its grant started.
    pub writer: (String, u64),
    /// The later grant that had written first, and when it started.
    pub newer: (String, u64),
}

/// A release that answered `ok` while a later grant was live, after which that later holder
/// found its lock gone: counted in [`Verdict::foreign_releases`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignRelease {
    /// The key.
    pub key: String,
    /// The releaser, and when its grant started.
    pub releaser: (String, u64),
    /// The later holder whose lock was gone, and when its grant started.
    pub victim: (String, u64),
}

/// Two critical sections of one key that overlapped: `first` was granted before `second`,
/// and held the key until `until` (monotonic nanoseconds, as in the history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The key.
    pub key: String,
    /// The process granted first.
    pub first: String,
    /// When it was granted.
    pub first_start: u64,
    /// The process granted while `first` still held the key.
    pub second: String,
    /// When it was granted.
    pub second_start: u64,
    /// When the overlap ended.
    pub until: u64,
}

impl Verdict {
    const MAX_DESCRIBED: usize = 20;

    fn violation(&mut self, description: String) {
        if self.violations.len() < Self::MAX_DESCRIBED {
            self.violations.push(description);
        }
    }
}

#[derive(Debug)]
struct Grant {
    process: String,
    key: String,
    kind: GrantKind,
    token: u64,
    invoked: u64,
    start: u64,
    end: Option<u64>,
    last_write: Option<u64>,
    lost: Option<u64>,
    released: Option<(u64, String)>,
    extended: Vec<u64>,
}

impl Grant {
    fn end(&self, history_end: u64) -> u64 {
        let end = self.end.unwrap_or(history_end);
        end.max(self.last_write.unwrap_or(0))
    }
}

/// Checks a merged history (ordered by time).
pub fn check(events: &[Event]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut grants: Vec<Grant> = Vec::new();
    let mut open: HashMap<(&str, &str), usize> = HashMap::new();
    let mut invoked: HashMap<(&str, &str), u64> = HashMap::new();
    let mut faults = Vec::new();
    let history_end = events.last().map_or(0, |e| e.at_ns);
    for event in events {
        let who = (event.process.as_str(), event.key.as_str());
        let current = open.get(&who).copied();
        match &event.what {
            What::Invoke => {
                invoked.insert(who, event.at_ns);
            }
            What::Granted {
                token,
                remaining_ms,
                floor_ms,
                kind,
            } => {
                verdict.acquisitions += 1;
                if *remaining_ms == 0 {
                    verdict.late_grants += 1;
                    verdict.violation(format!(
                        "{} was granted {} with no validity left",
                        event.process, event.key
                    ));
                } else if remaining_ms < floor_ms {
                    verdict.under_floor += 1;
                    verdict.violation(format!(
                        "{} was granted {} with {remaining_ms} ms left, under its floor of {floor_ms} ms",
                        event.process, event.key
                    ));
                }
                open.insert(who, grants.len());
                grants.push(Grant {
                    process: event.process.clone(),
                    key: event.key.clone(),
                    kind: *kind,
                    token: *token,
                    invoked: invoked.get(&who).copied().unwrap_or(event.at_ns),
                    start: event.at_ns,
                    end: None,
                    last_write: None,
                    lost: None,
                    released: None,
                    extended: Vec::new(),
                });
            }
            What::Failed { .. } => verdict.failed_acquires += 1,
            What::Lost { token } => {
                verdict.lost_signals += 1;
                if let Some(grant) = current.map(|i| &mut grants[i])
                    && grant.token == *token
                {
                    grant.lost.get_or_insert(event.at_ns);
                    grant.end.get_or_insert(event.at_ns);
                }
            }
            What::Release { token } => {
                if let Some(grant) = current.map(|i| &mut grants[i])
                    && grant.token == *token
                {
                    grant.end.get_or_insert(event.at_ns);
                }
            }
            What::Released { token, outcome } => {
                if let Some(i) = current
                    && grants[i].token == *token
                {
                    grants[i].released = Some((event.at_ns, outcome.clone()));
                    open.remove(&who);
                }
            }
            What::Extended { token, outcome } => {
                if let Some(i) = current
                    && grants[i].token == *token
                    && outcome == "ok"
                {
                    grants[i].extended.push(event.at_ns);
                }
            }
            What::Killed => {
                for grant in grants.iter_mut().filter(|g| g.process == event.process) {
                    grant.end.get_or_insert(event.at_ns);
                }
            }
            What::Stored { token } | What::Refused { token, .. } => {
                if matches!(event.what, What::Refused { .. }) {
                    verdict.stale_rejected += 1;
                }
                if let Some(grant) = grants
                    .iter_mut()
                    .rev()
                    .find(|g| g.process == event.process && g.key == event.key && g.token == *token)
                {
                    grant.last_write = Some(event.at_ns);
                }
            }
            What::Fault { target, .. } => faults.push((event.at_ns, target.clone())),
            What::Checked { .. } | What::Heal => {}
        }
    }

    let mut by_key: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for grant in &grants {
        by_key.entry(&grant.key).or_default().push(grant);
    }
    for (key, mut grants) in by_key {
        grants.sort_by_key(|g| g.start);
        overlaps(&mut verdict, key, &grants, history_end);
        tokens(&mut verdict, key, &grants);
        stale_writes(&mut verdict, key, &grants, events);
        foreign_releases(&mut verdict, key, &grants);
        foreign_extends(&mut verdict, key, &grants, history_end);
    }
    for (at, target) in faults {
        let next_grant = grants
            .iter()
            .filter(|g| g.start > at && Some(&g.process) != target.as_ref())
            .map(|g| g.start)
            .min();
        // A fault aimed at no worker that nothing followed (the work was done) tells nothing.
        if next_grant.is_some() || target.is_some() {
            verdict
                .recovery
                .push(next_grant.map(|g| Duration::from_nanos(g - at)));
        }
        if let Some(target) = target {
            let lost = grants
                .iter()
                .filter(|g| g.process == target)
                .filter_map(|g| g.lost)
                .filter(|&lost| lost > at)
                .min();
            verdict
                .lost_lag
                .push(lost.map(|l| Duration::from_nanos(l - at)));
        }
    }
    verdict
}

/// Grants sorted by start. Two grants of a key overlap unless their kinds let them: readers
/// beside readers, and up to `permits` permits of one semaphore (a grant that starts while
/// `permits` others are live is one overlap, until the live ones are `permits` again).
fn overlaps(verdict: &mut Verdict, key: &str, grants: &[&Grant], history_end: u64) {
    let mut live: Vec<&Grant> = Vec::new();
    for &b in grants {
        live.retain(|a| a.end(history_end) > b.start);
        let b_end = b.end(history_end);
        match b.kind {
            GrantKind::Permit { permits } if live.iter().all(|a| a.kind == b.kind) => {
                let permits = permits as usize;
                if permits > 0 && live.len() >= permits {
                    let mut ends: Vec<u64> = live.iter().map(|a| a.end(history_end)).collect();
                    ends.sort_unstable_by(|x, y| y.cmp(x));
                    let bound = ends[permits - 1];
                    let first = live
                        .iter()
                        .find(|a| a.end(history_end) == bound)
                        .copied()
                        .unwrap_or(b);
                    let holders = live.len() + 1;
                    overlap(
                        verdict,
                        key,
                        first,
                        b,
                        b_end.min(bound),
                        &format!("{holders} holders of a semaphore of {permits} permits"),
                    );
                }
            }
            _ => {
                for &a in &live {
                    if !(a.kind == GrantKind::Read && b.kind == GrantKind::Read) {
                        overlap(
                            verdict,
                            key,
                            a,
                            b,
                            a.end(history_end).min(b_end),
                            "held it together",
                        );
                    }
                }
            }
        }
        live.push(b);
    }
}

/// Records that `b`, granted while `a` held, overlapped with it until `until`.
fn overlap(verdict: &mut Verdict, key: &str, a: &Grant, b: &Grant, until: u64, how: &str) {
    let overlap = Duration::from_nanos(until.saturating_sub(b.start));
    verdict.overlapping.push(Overlap {
        key: key.to_owned(),
        first: a.process.clone(),
        first_start: a.start,
        second: b.process.clone(),
        second_start: b.start,
        until,
    });
    verdict.overlaps += 1;
    verdict.overlap_total += overlap;
    verdict.overlap_max = verdict.overlap_max.max(overlap);
    verdict.violation(format!(
        "{key}: {} (token {}, {:?}) and {} (token {}, {:?}): {how} for {overlap:?}",
        a.process, a.token, a.kind, b.process, b.token, b.kind
    ));
}

/// Grants sorted by start.
fn tokens(verdict: &mut Verdict, key: &str, grants: &[&Grant]) {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for grant in grants {
        let count = seen.entry(grant.token).or_default();
        *count += 1;
        if *count > 1 {
            verdict.token_duplicates += 1;
            verdict.violation(format!(
                "{key}: token {} handed out again, to {}",
                grant.token, grant.process
            ));
        }
    }
    for b in grants {
        if let Some(a) = grants
            .iter()
            .take_while(|a| a.start < b.invoked)
            .find(|a| a.token > b.token)
        {
            verdict.token_regressions += 1;
            verdict.violation(format!(
                "{key}: {} got token {} after {} had been granted {}",
                b.process, b.token, a.process, a.token
            ));
        }
    }
}

/// Grants sorted by start.
fn stale_writes(verdict: &mut Verdict, key: &str, grants: &[&Grant], events: &[Event]) {
    let writes: Vec<&Event> = events
        .iter()
        .filter(|e| e.key == key && matches!(e.what, What::Stored { .. } | What::Refused { .. }))
        .collect();
    let written_by = |grant: &Grant, before: u64| {
        writes.iter().any(|w| {
            w.at_ns < before
                && w.process == grant.process
                && matches!(w.what, What::Stored { token } | What::Refused { token, .. } if token == grant.token)
        })
    };
    for event in &writes {
        let What::Stored { token } = event.what else {
            continue;
        };
        let Some(writer) = grants
            .iter()
            .rev()
            .find(|g| g.process == event.process && g.token == token && g.start <= event.at_ns)
        else {
            continue;
        };
        if let Some(newer) = grants
            .iter()
            .find(|g| g.start > writer.start && g.start < event.at_ns && written_by(g, event.at_ns))
        {
            verdict.stale_accepted += 1;
            verdict.stale.push(StaleWrite {
                key: key.to_owned(),
                writer: (writer.process.clone(), writer.start),
                newer: (newer.process.clone(), newer.start),
            });
            verdict.violation(format!(
                "{key}: a write by {} with token {token} was stored after {} had been granted {}",
                event.process, newer.process, newer.token
            ));
        }
    }
}

/// Grants sorted by start.
fn foreign_releases(verdict: &mut Verdict, key: &str, grants: &[&Grant]) {
    for (i, a) in grants.iter().enumerate() {
        let Some((released_at, outcome)) = &a.released else {
            continue;
        };
        if outcome != "ok" {
            continue;
        }
        let victim = grants[i + 1..].iter().find(|b| {
            b.start < *released_at
                && b.lost.is_none()
                && b.released
                    .as_ref()
                    .is_some_and(|(at, outcome)| at > released_at && outcome == "not_held")
        });
        if let Some(b) = victim {
            verdict.foreign_releases += 1;
            verdict.foreign.push(ForeignRelease {
                key: key.to_owned(),
                releaser: (a.process.clone(), a.start),
                victim: (b.process.clone(), b.start),
            });
            verdict.violation(format!(
                "{key}: the release by {} (token {}) deleted the lock of {} (token {})",
                a.process, a.token, b.process, b.token
            ));
        }
    }
}

/// Grants sorted by start. An extend that succeeded after a grant that its own does not
/// admit beside it (for a permit: while `permits` others were live) took the key back.
fn foreign_extends(verdict: &mut Verdict, key: &str, grants: &[&Grant], history_end: u64) {
    for (i, a) in grants.iter().enumerate() {
        for &at in &a.extended {
            let taken_back = match a.kind {
                GrantKind::Read => grants[i + 1..]
                    .iter()
                    .find(|b| b.start < at && b.kind != GrantKind::Read),
                GrantKind::Permit { permits } => {
                    let others_live = grants
                        .iter()
                        .filter(|g| !std::ptr::eq(**g, *a))
                        .filter(|g| g.start < at && (g.end.is_none() || g.end(history_end) > at))
                        .count();
                    grants[i + 1..]
                        .iter()
                        .find(|b| b.start < at && others_live >= permits as usize)
                }
                GrantKind::Exclusive | GrantKind::Write => {
                    grants[i + 1..].iter().find(|b| b.start < at)
                }
            };
            if let Some(b) = taken_back {
                verdict.foreign_extends += 1;
                verdict.violation(format!(
                    "{key}: {} (token {}) extended after {} had been granted {}",
                    a.process, a.token, b.process, b.token
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests;
