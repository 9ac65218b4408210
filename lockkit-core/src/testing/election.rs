//! The conformance scenarios of elections ([`Election`](crate::Election)): one leader at a
//! time, terms that increase, the proclaimed value beside the term, hand-over on resign and
//! on a crash, deposed leaders that cannot proclaim, observers that end on the current
//! leader, and [`run_as_leader`](crate::Election::run_as_leader).
//!
//! On a backend without elections, each scenario checks instead that
//! [`LockClient::election`] refuses with `Unsupported` and says why.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use super::scenarios::{LONG_TTL, clients, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};
use crate::client::LockClient;
use crate::election::{Election, Leader, MAX_VALUE_LEN};
use crate::error::ErrorKind;

/// The election `name` of `client`, or `None` (after checking the refusal) where the backend
/// has no elections.
pub(super) fn election(client: &LockClient, name: &str) -> Result<Option<Election>, Failure> {
    match client.election(name) {
        Ok(election) => {
            ensure!(
                client.capabilities().election.is_supported(),
                "election() succeeded on a backend whose capabilities deny elections"
            );
            Ok(Some(election))
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ensure!(
                !client.capabilities().election.is_supported(),
                "election() refused on a backend whose capabilities claim elections: {e}"
            );
            ensure!(
                e.to_string().len() > "elections are not supported: ".len() + 10,
                "the refusal does not say why: {e}"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn value_of(leader: Option<&Leader>) -> Option<&str> {
    leader.and_then(|l| l.value.as_deref())
}

/// Candidates of several clients campaign in turn: never two leaders at once, each leader
/// sees itself with its own value, and terms strictly increase in the order of leaderships.
pub(super) async fn one_leader_at_a_time_with_increasing_terms(h: &dyn Harness) -> Outcome {
    const CLIENTS: usize = 3;
    const CANDIDATES_PER_CLIENT: usize = 2;
    const TERMS: usize = 5;
    let ns = namespace();
    let clients = clients(h, &ns, CLIENTS).await?;
    if election(&clients[0], "leader")?.is_none() {
        return Ok(());
    }
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::<Outcome>::new();
    for (c, client) in clients.iter().enumerate() {
        for k in 0..CANDIDATES_PER_CLIENT {
            let (leading, terms, patience) = (leading.clone(), terms.clone(), patience(h));
            let election = client.election("leader")?;
            tasks.spawn(async move {
                let me = format!("candidate-{c}-{k}");
                for _ in 0..TERMS {
                    let leadership = election.campaign_timeout(me.as_str(), patience).await?;
                    ensure!(
                        leading.fetch_add(1, Ordering::SeqCst) == 0,
                        "{me} leads in term {} while another leads",
                        leadership.term()
                    );
                    terms
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(leadership.term());
                    let seen = election.leader().await?;
                    ensure!(
                        seen.as_ref().map(|l| l.term) == Some(leadership.term())
                            && value_of(seen.as_ref()) == Some(me.as_str()),
                        "{me} leads in term {} but leader() says {seen:?}",
                        leadership.term()
                    );
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    leading.fetch_sub(1, Ordering::SeqCst);
                    ensure!(leadership.resign().await?, "{me}'s resign was refused");
                }
                Ok(())
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| Failure(format!("candidate panicked: {e}")))??;
    }
    let terms = terms
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        terms.len() == CLIENTS * CANDIDATES_PER_CLIENT * TERMS,
        "{} leaderships, expected {}",
        terms.len(),
        CLIENTS * CANDIDATES_PER_CLIENT * TERMS
    );
    ensure!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms not strictly increasing in the order of leaderships: {terms:?}"
    );
    expect_no_leftovers(h, &ns).await
}

/// `leader()` is empty before the first campaign, shows the term and value of the leader,
/// follows `proclaim`, refuses an oversized value without losing the old one, and is empty
/// again after `resign`.
pub(super) async fn the_leader_shows_its_proclaimed_value(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(candidate) = election(&clients[0], "shown")? else {
        return Ok(());
    };
    let Some(bystander) = election(&clients[1], "shown")? else {
        return Err(Failure("a second client has no elections".into()));
    };
    ensure!(
        bystander.leader().await?.is_none(),
        "a leader before any campaign"
    );
    let leadership = candidate.campaign_timeout("a", patience(h)).await?;
    let seen = bystander.leader().await?;
    ensure!(
        seen == Some(Leader::new(leadership.term(), Some("a".into()))),
        "leader() says {seen:?} for term {} and value \"a\"",
        leadership.term()
    );
    leadership.proclaim("b").await?;
    let seen = bystander.leader().await?;
    ensure!(
        value_of(seen.as_ref()) == Some("b") && leadership.value() == "b",
        "after proclaiming \"b\", leader() says {seen:?}"
    );
    let oversized = leadership.proclaim("x".repeat(MAX_VALUE_LEN + 1)).await;
    ensure!(
        oversized
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::InvalidConfig),
        "an oversized value gave {oversized:?}"
    );
    let seen = bystander.leader().await?;
    ensure!(
        value_of(seen.as_ref()) == Some("b") && !leadership.is_lost(),
        "a refused value changed the leader to {seen:?}"
    );
    ensure!(leadership.resign().await?, "resign refused");
    let seen = bystander.leader().await?;
    ensure!(seen.is_none(), "leader() says {seen:?} after the resign");
    expect_no_leftovers(h, &ns).await
}

/// A waiting candidate leads as soon as the leader resigns: with a 60 s TTL, well before
/// the resigned leadership could have expired.
pub(super) async fn resign_hands_over_at_once(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(first) = election(&clients[0], "handover")? else {
        return Ok(());
    };
    let first = first.with_ttl(LONG_TTL)?;
    let second = clients[1].election("handover")?.with_ttl(LONG_TTL)?;
    let leadership = first.campaign_timeout("first", patience(h)).await?;
    let old_term = leadership.term();
    let patience = patience(h);
    let waiting = tokio::spawn(async move { second.campaign_timeout("second", patience).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(!waiting.is_finished(), "the second candidate led at once");
    let resigned_at = Instant::now();
    ensure!(leadership.resign().await?, "resign refused");
    let next = waiting
        .await
        .map_err(|e| Failure(format!("candidate panicked: {e}")))??;
    let took = resigned_at.elapsed();
    ensure!(
        took < LONG_TTL / 4,
        "the hand-over took {took:?}: it waited for an expiry, not the resign"
    );
    ensure!(
        next.term() > old_term,
        "the new term {} is not above the old {old_term}",
        next.term()
    );
    let seen = first.leader().await?;
    ensure!(
        value_of(seen.as_ref()) == Some("second"),
        "leader() says {seen:?} after the hand-over"
    );
    ensure!(next.resign().await?, "the second resign refused");
    expect_no_leftovers(h, &ns).await
}

/// A leader whose process crashed (nothing renews it, nothing releases it) is replaced once
/// its TTL or session runs out, not before, in a higher term.
pub(super) async fn a_crashed_leader_is_replaced_after_its_ttl(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let crashed = h.client(&ns, options(h).with_auto_renew(false)).await?;
    let Some(doomed) = election(&crashed, "crash")? else {
        return Ok(());
    };
    let leadership = doomed.campaign_timeout("doomed", patience(h)).await?;
    let elected_at = Instant::now();
    let old_term = leadership.term();
    // A crashed process neither renews nor releases.
    std::mem::forget(leadership);
    h.crash(crashed).await;
    let next_client = h.client(&ns, options(h)).await?;
    let next = next_client
        .election("crash")?
        .campaign_timeout("next", patience(h))
        .await?;
    let vacant_after = elected_at.elapsed();
    ensure!(
        vacant_after >= h.ttl() / 2,
        "the crashed leader was replaced after {vacant_after:?}, before its TTL of {:?}",
        h.ttl()
    );
    ensure!(
        next.term() > old_term,
        "the new term {} is not above the crashed leader's {old_term}",
        next.term()
    );
    ensure!(next.resign().await?, "resign refused");
    expect_no_leftovers(h, &ns).await
}

/// A leader whose grant was taken away cannot proclaim any more (`Lost`, and its lost signal
/// fires); the new leader's value stays, and the old leader's resign does not touch it.
pub(super) async fn a_deposed_leader_cannot_proclaim(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(old_election) = election(&clients[0], "deposed")? else {
        return Ok(());
    };
    let new_election = clients[1].election("deposed")?;
    let old = old_election.campaign_timeout("old", patience(h)).await?;
    h.force_release(old.key()).await?;
    let new = new_election.campaign_timeout("new", patience(h)).await?;
    ensure!(
        new.term() > old.term(),
        "the new term {} is not above the deposed {}",
        new.term(),
        old.term()
    );
    let refused = old.proclaim("old again").await;
    ensure!(
        refused.as_ref().is_err_and(|e| e.kind() == ErrorKind::Lost),
        "the deposed leader's proclaim gave {refused:?}"
    );
    ensure!(
        tokio::time::timeout(patience(h), old.lost()).await.is_ok(),
        "the deposed leader's lost signal did not fire"
    );
    let seen = old_election.leader().await?;
    ensure!(
        seen == Some(Leader::new(new.term(), Some("new".into()))),
        "leader() says {seen:?} after the deposed leader proclaimed"
    );
    ensure!(
        !old.resign().await?,
        "the deposed leader's resign claimed the lock"
    );
    let seen = old_election.leader().await?;
    ensure!(
        value_of(seen.as_ref()) == Some("new"),
        "the deposed leader's resign changed the leader to {seen:?}"
    );
    ensure!(new.resign().await?, "the new leader's resign refused");
    expect_no_leftovers(h, &ns).await
}

/// A campaign dropped while it waits, or while its first request is in flight, leaves no
/// candidate behind: once the leader resigns, a `try_campaign` leads at once.
pub(super) async fn a_cancelled_campaign_leaves_nothing_behind(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let Some(leader) = election(&clients[0], "cancelled")? else {
        return Ok(());
    };
    let leadership = leader.campaign_timeout("leader", patience(h)).await?;
    let quitter = clients[1].election("cancelled")?.with_ttl(LONG_TTL)?;
    let waited =
        tokio::time::timeout(Duration::from_millis(300), quitter.campaign("quitter")).await;
    ensure!(waited.is_err(), "the quitter led while the leader led");
    // Dropped right after its first request went out.
    let hasty = tokio::time::timeout(Duration::from_micros(50), quitter.campaign("hasty")).await;
    drop(hasty);
    clients[1].close().await;
    ensure!(leadership.resign().await?, "resign refused");
    let late = clients[2].election("cancelled")?;
    let deadline = Instant::now() + patience(h);
    let next = loop {
        // A hasty campaign that was granted before its drop is released in the background:
        // never for longer than the close above took.
        if let Some(next) = late.try_campaign("late").await? {
            break next;
        }
        ensure!(
            Instant::now() < deadline,
            "a cancelled campaign still blocks the election: leader() says {:?}",
            late.leader().await?
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(next.resign().await?, "resign refused");
    expect_no_leftovers(h, &ns).await
}

/// Observers, one started before and one during 100 rapid leader changes, see terms in
/// order (never a lower one after a higher), and both end on the leader that stays, with its
/// value, and then on the vacancy after it resigns. The last leader stays until both saw it
/// (within the harness's patience): how soon an observer sees a change is the backend's
/// latency, which a loaded machine stretches; that it ends on the current state is the
/// contract.
pub(super) async fn observe_ends_on_the_current_leader_in_term_order(h: &dyn Harness) -> Outcome {
    const CHANGES: usize = 100;
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let Some(watched) = election(&clients[2], "observed")? else {
        return Ok(());
    };
    let (saw_last, mut seen_last) = tokio::sync::watch::channel(0_usize);
    let saw_last = Arc::new(saw_last);
    let early = tokio::spawn(follow(watched.clone(), saw_last.clone()));
    let elections = [
        clients[0].election("observed")?,
        clients[1].election("observed")?,
    ];
    let mut late = None;
    for change in 0..CHANGES {
        let leadership = elections[change % 2]
            .campaign_timeout(format!("term-{change}"), patience(h))
            .await?;
        if change % 3 == 0 {
            leadership.proclaim(format!("term-{change}-again")).await?;
        }
        ensure!(leadership.resign().await?, "resign refused");
        if change == CHANGES / 2 {
            late = Some(tokio::spawn(follow(watched.clone(), saw_last.clone())));
        }
    }
    let last = elections[0]
        .campaign_timeout("the last", patience(h))
        .await?;
    let current = Some(Leader::new(last.term(), Some("the last".into())));
    let observers = 1 + usize::from(late.is_some());
    let both_saw = seen_last.wait_for(|saw| *saw >= observers);
    if tokio::time::timeout(patience(h), both_saw).await.is_err() {
        return Err(Failure(format!(
            "{} of {observers} observers saw the last leader {current:?} while it stayed",
            *seen_last.borrow()
        )));
    }
    ensure!(last.resign().await?, "the last resign refused");
    for (which, observer) in [("early", Some(early)), ("late", late)] {
        let Some(observer) = observer else { continue };
        let seen = tokio::time::timeout(patience(h), observer)
            .await
            .map_err(|_| Failure(format!("the {which} observer never ended on the vacancy")))?
            .map_err(|e| Failure(format!("the {which} observer panicked: {e}")))??;
        let terms: Vec<_> = seen.iter().flatten().map(|l| l.term).collect();
        ensure!(
            terms.windows(2).all(|w| w[0] <= w[1]),
            "the {which} observer saw terms go back: {terms:?}"
        );
        ensure!(
            seen.windows(2).all(|w| w[0] != w[1]),
            "the {which} observer saw a state twice in a row: {seen:?}"
        );
        ensure!(
            seen.contains(&current),
            "the {which} observer never saw the last leader {current:?}: {seen:?}"
        );
    }
    expect_no_leftovers(h, &ns).await
}

/// Every state `election` reports, until a vacancy after a leader whose value is "the last";
/// counts itself on `saw_last` when it first sees that leader.
async fn follow(
    election: Election,
    saw_last: Arc<tokio::sync::watch::Sender<usize>>,
) -> Result<Vec<Option<Leader>>, Failure> {
    let mut changes = election.observe();
    let mut seen: Vec<Option<Leader>> = Vec::new();
    let mut counted = false;
    while let Some(state) = changes.next().await {
        let state = state?;
        if !counted && state.as_ref().and_then(|l| l.value.as_deref()) == Some("the last") {
            counted = true;
            saw_last.send_modify(|saw| *saw += 1);
        }
        let ended = state.is_none()
            && seen
                .iter()
                .flatten()
                .any(|l| l.value.as_deref() == Some("the last"));
        seen.push(state);
        if ended {
            return Ok(seen);
        }
    }
    Err(Failure("the observation stream ended".into()))
}

/// `run_as_leader` cancels its work when the leadership is taken away, campaigns again after
/// its retry pause, runs the work anew in a higher term, and resigns when the work returns.
pub(super) async fn run_as_leader_cancels_the_work_when_leadership_is_lost(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let client = h.client(&ns, options(h)).await?;
    let Some(election) = election(&client, "runner")? else {
        return Ok(());
    };
    let election = election.with_retry_pause(Duration::from_millis(50));
    let runs = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let (first_term, first_term_rx) = tokio::sync::oneshot::channel();
    let mut first_term = Some(first_term);
    let runner = {
        let (election, runs, cancelled) = (election.clone(), runs.clone(), cancelled.clone());
        tokio::spawn(async move {
            election
                .run_as_leader("runner", move |leadership| {
                    let first_run = runs.fetch_add(1, Ordering::SeqCst) == 0;
                    let counted = first_run.then(|| CountOnDrop(cancelled.clone()));
                    let first_term = first_term.take();
                    async move {
                        if let Some(_counted) = counted {
                            if let Some(tx) = first_term {
                                let _ = tx.send(leadership.term());
                            }
                            std::future::pending::<()>().await;
                        }
                        leadership.term()
                    }
                })
                .await
        })
    };
    let first = tokio::time::timeout(patience(h), first_term_rx)
        .await
        .map_err(|_| Failure("the work never started".into()))?
        .map_err(|_| Failure("the runner ended before its work started".into()))?;
    h.force_release(election.key()).await?;
    let second = tokio::time::timeout(patience(h), runner)
        .await
        .map_err(|_| Failure("run_as_leader did not come back after losing the leadership".into()))?
        .map_err(|e| Failure(format!("the runner panicked: {e}")))??;
    ensure!(
        cancelled.load(Ordering::SeqCst) == 1,
        "the first run was not cancelled"
    );
    ensure!(
        runs.load(Ordering::SeqCst) == 2,
        "the work ran {} times, expected 2",
        runs.load(Ordering::SeqCst)
    );
    ensure!(
        second > first,
        "the second term {second} is not above the first {first}"
    );
    let seen = election.leader().await?;
    ensure!(
        seen.is_none(),
        "leader() says {seen:?} after the work returned"
    );
    expect_no_leftovers(h, &ns).await
}

/// Counts its own drop: the work future was dropped (cancelled) while it held one.
struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
