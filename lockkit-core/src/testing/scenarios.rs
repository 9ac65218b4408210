//! The scenarios of the conformance suite. Each reads as the behaviour it proves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::election::{
    a_cancelled_campaign_leaves_nothing_behind, a_crashed_leader_is_replaced_after_its_ttl,
    a_deposed_leader_cannot_proclaim, observe_ends_on_the_current_leader_in_term_order,
    one_leader_at_a_time_with_increasing_terms, resign_hands_over_at_once,
    run_as_leader_cancels_the_work_when_leadership_is_lost, the_leader_shows_its_proclaimed_value,
};
use super::multi::{
    a_cancelled_lock_all_leaves_nothing_behind, lock_all_over_overlapping_sets_never_deadlocks,
    lock_all_reports_the_loss_of_any_part, lock_all_takes_nothing_when_a_part_is_taken,
};
use super::operator::{
    force_release_breaks_the_lock_and_the_holder_reports_lost,
    list_shows_the_held_locks_by_prefix_page_by_page,
};
use super::rwlock::{
    a_crashed_reader_frees_the_lock_after_its_ttl, a_stream_of_readers_does_not_starve_a_writer,
    a_waiting_writer_blocks_new_readers, a_writer_that_gave_up_does_not_block_readers,
    an_rwlock_is_independent_of_the_mutex_and_semaphore_of_its_name,
    readers_share_and_a_writer_excludes_everyone, readers_share_until_a_writer_comes,
    renewal_keeps_a_write_lock_past_its_ttl,
};
use super::semaphore::{
    a_cancelled_permit_acquisition_leaves_nothing_behind,
    a_crashed_holder_frees_its_permit_after_its_ttl, a_permit_release_wakes_a_waiter,
    a_semaphore_admits_exactly_its_permits, a_semaphore_and_the_mutex_of_its_name_are_independent,
    a_semaphore_never_admits_more_than_its_permits, disagreeing_permit_counts_are_refused,
    renewal_keeps_a_permit_past_its_ttl,
};
use super::validity::{
    a_reentrant_share_is_handed_out_with_useful_validity,
    a_short_grant_that_cannot_be_confirmed_is_given_back_and_taken_again,
    a_short_leadership_grant_is_confirmed_before_it_is_handed_out,
    a_short_mutex_grant_is_confirmed_before_it_is_handed_out,
    a_short_permit_or_rwlock_grant_is_confirmed_before_it_is_handed_out,
    lock_all_hands_out_every_part_with_useful_validity,
};
use super::{Failure, Harness, Outcome, Scenario};
use crate::backend::{AcquireRequest, Attempt, Renewal};
use crate::capabilities::WaitStrategy;
use crate::client::LockClient;
use crate::error::ErrorKind;
use crate::lease::Lease;
use crate::options::LockOptions;
use crate::owner::LockOwner;
use crate::token::{FencingToken, OwnerToken};

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// Every scenario, by name, in the order [`run_all`](super::run_all) runs them.
        pub static SCENARIOS: &[(&str, Scenario)] = &[
            $((stringify!($name), |h| Box::pin($name(h)))),*
        ];
    };
}

crate::__conformance_scenarios!([scenarios] []);

/// An acquisition whose future is dropped while its request is in flight (a queue entry
/// being created behind a holder, or the grant of a free lock on its way back) leaves
/// nothing once its clean-up has run, however late the request takes effect: the queue
/// shows the holder alone, and the next acquirer gets the lock promptly. The dropped
/// acquisitions ask for a 60 s TTL, so a leftover would block the key far longer.
async fn an_acquisition_dropped_in_flight_leaves_nothing_behind(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let holder = clients[0]
        .mutex("in-flight")?
        .lock_timeout(patience(h))
        .await?;
    // Cut at points spread over a round trip, so some requests are on their way.
    for round in 0..20u64 {
        let contender = clients[1].mutex("in-flight")?.with_ttl(LONG_TTL)?;
        let _ = tokio::time::timeout(Duration::from_micros(round * 500), contender.lock()).await;
    }
    let deadline = Instant::now() + patience(h);
    loop {
        let Some(info) = clients[2].inspect("in-flight").await? else {
            return Err(Failure("the holder's lock vanished".into()));
        };
        if info.waiters.unwrap_or(0) == 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "dropped acquisitions left {:?} queue entries behind the holder",
            info.waiters
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.release().await?;
    for round in 0..20u64 {
        let racer = clients[1].mutex("in-flight")?.with_ttl(LONG_TTL)?;
        if let Ok(won) =
            tokio::time::timeout(Duration::from_micros(round * 500), racer.lock()).await
        {
            drop(won?);
        }
    }
    let next = clients[2]
        .mutex("in-flight")?
        .lock_timeout(Duration::from_secs(15))
        .await
        .map_err(|e| {
            Failure(format!(
                "the key stayed blocked after acquisitions dropped in flight: {e}"
            ))
        })?;
    // The racers' clean-ups run in the background: once they are done, nothing of theirs
    // may be left, however late their requests landed.
    clients[1].close().await;
    let deadline = Instant::now() + patience(h);
    loop {
        let queued = clients[2]
            .inspect("in-flight")
            .await?
            .and_then(|i| i.waiters);
        if queued.unwrap_or(0) == 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "queue entries left behind the next holder: {queued:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// A long TTL: a lock that is freed before it runs out was freed on purpose.
pub(super) const LONG_TTL: Duration = Duration::from_secs(60);

/// A fresh random namespace, so scenarios never see each other's keys.
pub(super) fn namespace() -> String {
    format!("lk-test-{:08x}", rand::random::<u32>())
}

pub(super) fn options(h: &dyn Harness) -> LockOptions {
    LockOptions::default()
        .with_ttl(h.ttl())
        .with_backoff(Duration::from_millis(5), Duration::from_millis(100))
}

pub(super) async fn clients(
    h: &dyn Harness,
    ns: &str,
    n: usize,
) -> Result<Vec<LockClient>, Failure> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(h.client(ns, options(h)).await?);
    }
    Ok(out)
}

/// Generous bound for anything that should happen within a few TTLs.
pub(super) fn patience(h: &dyn Harness) -> Duration {
    h.ttl() * 4 + Duration::from_secs(10)
}

pub(super) async fn expect_no_leftovers(h: &dyn Harness, ns: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = h.leftovers(ns).await?;
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "records left on the server under {ns}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Many tasks in several clients increment a counter with a read, a pause and a write: any
/// overlap of critical sections loses updates, and grants must come in fencing-token order.
async fn mutual_exclusion_under_contention(h: &dyn Harness) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 3;
    const ROUNDS: u64 = 15;
    let ns = namespace();
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::<crate::Result<()>>::new();
    for client in clients(h, &ns, CLIENTS).await? {
        for _ in 0..TASKS_PER_CLIENT {
            let (client, counter, inside, overlaps, tokens) = (
                client.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
                tokens.clone(),
            );
            let patience = patience(h);
            tasks.spawn(async move {
                let mutex = client.mutex("counter")?;
                for _ in 0..ROUNDS {
                    let guard = mutex.lock_timeout(patience).await?;
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(guard.fencing_token());
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await?;
                }
                Ok::<_, crate::Error>(())
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| Failure(format!("worker panicked: {e}")))??;
    }
    let expected = (CLIENTS * TASKS_PER_CLIENT) as u64 * ROUNDS;
    let overlaps = overlaps.load(Ordering::SeqCst);
    let value = counter.load(Ordering::SeqCst);
    ensure!(overlaps == 0, "{overlaps} critical sections overlapped");
    ensure!(
        value == expected,
        "counter is {value}, expected {expected}: {} updates lost",
        expected - value
    );
    let tokens = tokens
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {tokens:?}"
    );
    expect_no_leftovers(h, &ns).await
}

/// Successive grants of one key, alternating between two clients, carry strictly
/// increasing fencing tokens.
async fn fencing_tokens_strictly_increase(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let mut previous: Option<FencingToken> = None;
    for round in 0..20 {
        let guard = clients[round % 2]
            .mutex("fenced")?
            .lock_timeout(patience(h))
            .await?;
        let token = guard.fencing_token();
        if let Some(previous) = previous {
            ensure!(
                token > previous,
                "grant {round} has token {token}, not above the previous {previous}"
            );
        }
        previous = Some(token);
        ensure!(
            guard.release().await?,
            "release of grant {round} says it was not ours"
        );
    }
    expect_no_leftovers(h, &ns).await
}

/// Someone without the owner token cannot release or renew the holder's lock.
async fn release_by_non_owner_is_refused(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let [a, b] = <[LockClient; 2]>::try_from(clients(h, &ns, 2).await?)
        .map_err(|_| Failure("clients".into()))?;
    let guard = a.mutex("owned")?.lock_timeout(patience(h)).await?;
    let forged = Lease::new(
        guard.key().clone(),
        OwnerToken::generate()?,
        guard.fencing_token(),
        h.ttl(),
        Instant::now(),
    );
    ensure!(
        !b.backend().release(&forged).await?,
        "a forged lease released the lock"
    );
    ensure!(
        b.backend().renew(&forged).await? == Renewal::Lost,
        "a forged lease renewed the lock"
    );
    ensure!(
        guard.is_held().await?,
        "the holder lost the lock to a forged release"
    );
    ensure!(
        b.mutex("owned")?.try_lock().await?.is_none(),
        "another client got the lock"
    );
    ensure!(guard.release().await?, "the owner's release was refused");
    expect_no_leftovers(h, &ns).await
}

/// A holder that crashes without releasing blocks the key until its TTL runs out, then the
/// key can be taken again.
async fn abandoned_lease_expires(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let crashed = h.client(&ns, options(h)).await?;
    let key = crashed.key("abandoned")?;
    let request = AcquireRequest::new(key, OwnerToken::generate()?, h.ttl(), false);
    let granted_at = Instant::now();
    let Attempt::Granted(_) = crashed.backend().try_acquire(&request).await? else {
        return Err(Failure(
            "the first acquisition of a fresh key was contended".into(),
        ));
    };
    h.crash(crashed).await;
    let next = h.client(&ns, options(h)).await?;
    let guard = next.mutex("abandoned")?.lock_timeout(patience(h)).await?;
    let blocked_for = granted_at.elapsed();
    ensure!(
        blocked_for >= h.ttl() / 2,
        "the abandoned lock was free after {blocked_for:?}, before its TTL of {:?}",
        h.ttl()
    );
    ensure!(guard.release().await?, "release after expiry refused");
    expect_no_leftovers(h, &ns).await
}

/// Background renewal keeps a lock held for several TTLs; `extend` renews on demand.
async fn renewal_keeps_lock_past_ttl(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("renewed")?
        .lock_timeout(patience(h))
        .await?;
    tokio::time::sleep(h.ttl() * 3).await;
    ensure!(
        !guard.is_lost(),
        "the lock was lost although it was being renewed"
    );
    ensure!(
        guard.is_held().await?,
        "the server no longer has the renewed lock"
    );
    ensure!(
        clients[1].mutex("renewed")?.try_lock().await?.is_none(),
        "another client got a renewed lock"
    );
    guard.extend().await?;
    ensure!(
        guard.remaining() > h.ttl() / 2,
        "extend left only {:?}",
        guard.remaining()
    );
    ensure!(
        guard.release().await?,
        "release of the renewed lock refused"
    );
    expect_no_leftovers(h, &ns).await
}

/// When the holder's record is removed behind its back and someone else takes the lock, the
/// holder's lost signal fires, its release is refused and does not touch the new holder.
async fn lost_fires_when_lease_is_taken_away(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let old = clients[0].mutex("taken")?.lock_timeout(patience(h)).await?;
    h.force_release(old.key()).await?;
    let new = clients[1].mutex("taken")?.lock_timeout(patience(h)).await?;
    ensure!(
        new.fencing_token() > old.fencing_token(),
        "new holder's token {} is not above the old {}",
        new.fencing_token(),
        old.fencing_token()
    );
    ensure!(
        tokio::time::timeout(patience(h), old.lost()).await.is_ok(),
        "the old holder's lost signal did not fire"
    );
    ensure!(
        !old.is_held().await?,
        "the old holder still thinks it holds the lock"
    );
    ensure!(
        !old.release().await?,
        "the old holder's release claimed the lock"
    );
    ensure!(
        new.is_held().await?,
        "the old holder's release removed the new holder's lock"
    );
    ensure!(new.release().await?, "the new holder's release refused");
    expect_no_leftovers(h, &ns).await
}

/// `try_lock` returns `None` at once while the lock is held and the guard once it is free.
async fn try_lock_returns_none_on_contention(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0].mutex("try")?.lock_timeout(patience(h)).await?;
    ensure!(
        clients[1].mutex("try")?.try_lock().await?.is_none(),
        "try_lock got a held lock"
    );
    ensure!(
        clients[0].mutex("try")?.try_lock().await?.is_none(),
        "try_lock in the holder's own client got a held lock"
    );
    guard.release().await?;
    let again = clients[1].mutex("try")?.try_lock().await?;
    let Some(again) = again else {
        return Err(Failure("try_lock failed on a free lock".into()));
    };
    again.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// `lock_timeout` on a held lock fails with `Timeout`, not before its time, and leaves nothing.
async fn lock_timeout_fails_with_timeout(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0].mutex("busy")?.lock_timeout(patience(h)).await?;
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = clients[1].mutex("busy")?.lock_timeout(wait).await;
    let waited = started.elapsed();
    match result {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Err(e) => return Err(Failure(format!("expected Timeout, got {e}"))),
        Ok(_) => return Err(Failure("lock_timeout got a held lock".into())),
    }
    ensure!(
        waited >= wait,
        "gave up after {waited:?}, before the timeout of {wait:?}"
    );
    ensure!(guard.is_held().await?, "the holder lost the lock");
    guard.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// Acquisitions cancelled at any point (while waiting, while giving up, or racing the grant)
/// leave nothing that could block the key: with a 60 s TTL on the cancelled side, a leftover
/// would block.
async fn cancelled_acquire_leaves_nothing_behind(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let holder = clients[0]
        .mutex("cancel")?
        .lock_timeout(patience(h))
        .await?;
    let waiter = clients[1].mutex("cancel")?.with_ttl(LONG_TTL)?;
    ensure!(
        tokio::time::timeout(Duration::from_millis(200), waiter.lock())
            .await
            .is_err(),
        "a waiter got a held lock"
    );
    for round in 0..10u64 {
        let cut_after = Duration::from_micros(round * 700);
        let contender = clients[1].mutex("cancel")?.with_ttl(LONG_TTL)?;
        let _ = tokio::time::timeout(cut_after, contender.try_lock()).await;
        let _ =
            tokio::time::timeout(cut_after, contender.lock_timeout(Duration::from_millis(5))).await;
    }
    holder.release().await?;
    for round in 0..10u64 {
        let racer = clients[1].mutex("cancel")?.with_ttl(LONG_TTL)?;
        let cut_after = Duration::from_micros(round * 700);
        if let Ok(won) = tokio::time::timeout(cut_after, racer.lock()).await {
            drop(won?);
        }
    }
    let next = clients[2]
        .mutex("cancel")?
        .lock_timeout(Duration::from_secs(15))
        .await;
    let next = next.map_err(|e| {
        Failure(format!(
            "the key stayed blocked after cancelled acquisitions: {e}"
        ))
    })?;
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// With an explicit owner, a second acquisition shares the grant; the lock is released on
/// the server only with the last guard. Other owners and owner-less mutexes are excluded.
async fn reentrant_owner_shares_the_grant(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let me = LockOwner::new();
    let mine = clients[0].mutex("reentrant")?.reentrant(&me);
    let first = mine.lock_timeout(patience(h)).await?;
    let second = mine.lock_timeout(Duration::from_secs(2)).await?;
    ensure!(
        first.fencing_token() == second.fencing_token(),
        "reentry made a new grant"
    );
    ensure!(
        clients[0]
            .mutex("reentrant")?
            .reentrant(&LockOwner::new())
            .try_lock()
            .await?
            .is_none(),
        "another owner got the lock"
    );
    ensure!(
        clients[0].mutex("reentrant")?.try_lock().await?.is_none(),
        "an owner-less mutex got the lock"
    );
    ensure!(
        clients[1].mutex("reentrant")?.try_lock().await?.is_none(),
        "another client got the lock"
    );
    ensure!(
        first.release().await?,
        "releasing one of two reentrant guards failed"
    );
    ensure!(
        second.is_held().await?,
        "releasing one reentrant guard released the lock"
    );
    ensure!(
        clients[1].mutex("reentrant")?.try_lock().await?.is_none(),
        "lock free while a reentrant guard is held"
    );
    ensure!(second.release().await?, "the last reentrant release failed");
    let after = clients[1].mutex("reentrant")?.try_lock().await?;
    ensure!(
        after.is_some(),
        "the lock stayed held after the last reentrant release"
    );
    drop(after);
    expect_no_leftovers(h, &ns).await
}

/// Hostile names are refused with `InvalidKey` before anything reaches the server.
async fn invalid_keys_are_rejected(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let client = h.client(&ns, options(h)).await?;
    let long = "k".repeat(10_000);
    for name in [
        "",
        "a/b",
        "/",
        ".",
        "..",
        "nul\0",
        "line\nbreak",
        "\u{1b}[31m",
        "tab\t",
        "rlo-\u{202e}",
        "line\u{2028}sep",
        "emoji-\u{1f512}",
        "private-\u{e000}",
        long.as_str(),
    ] {
        match client.mutex(name) {
            Err(e) if e.kind() == ErrorKind::InvalidKey => {}
            Err(e) => return Err(Failure(format!("{name:?}: expected InvalidKey, got {e}"))),
            Ok(_) => return Err(Failure(format!("{name:?} was accepted as a lock name"))),
        }
        match client.inspect(name).await {
            Err(e) if e.kind() == ErrorKind::InvalidKey => {}
            Err(e) => {
                return Err(Failure(format!(
                    "inspect {name:?}: expected InvalidKey, got {e}"
                )));
            }
            Ok(_) => return Err(Failure(format!("inspect accepted {name:?}"))),
        }
    }
    expect_no_leftovers(h, &ns).await
}

/// A dropped guard is released in the background, long before its TTL.
async fn dropped_guard_releases_in_background(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("dropped")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    drop(guard);
    let next = clients[1]
        .mutex("dropped")?
        .lock_timeout(Duration::from_secs(15))
        .await;
    let next = next.map_err(|e| Failure(format!("a dropped guard was not released: {e}")))?;
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// `with_lock` runs the critical section and cancels it when the lock is lost.
async fn with_lock_cancels_when_lost(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let client = h.client(&ns, options(h)).await?;
    let ran = client
        .with_lock("work", async |guard| {
            // The closure holds the guard: it can extend the lease and check it before a commit.
            guard.extend().await?;
            Ok::<_, crate::Error>((guard.fencing_token(), guard.is_lost()))
        })
        .await??;
    ensure!(ran.0.get() > 0, "with_lock returned no token");
    ensure!(!ran.1, "the guard looked lost inside with_lock");
    let finished = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let key = client.key("work")?;
    let result = client
        .with_lock("work", async |_guard| {
            started.store(true, Ordering::SeqCst);
            if h.force_release(&key).await.is_ok() {
                tokio::time::sleep(patience(h) * 2).await;
            }
            finished.store(true, Ordering::SeqCst);
        })
        .await;
    ensure!(
        started.load(Ordering::SeqCst),
        "the critical section never ran"
    );
    ensure!(
        !finished.load(Ordering::SeqCst),
        "the critical section ran to its end after the lock was lost"
    );
    match result {
        Err(e) if e.kind() == ErrorKind::Lost => {}
        other => return Err(Failure(format!("expected a Lost error, got {other:?}"))),
    }
    expect_no_leftovers(h, &ns).await
}

/// A critical section that finishes after its lock was taken away (the holder did not notice
/// in time) is not reported as protected, and its value is not thrown away: the caller gets
/// both the `Lost` error and what the section produced.
async fn with_lock_reports_an_unprotected_end_with_the_value(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let client = h.client(&ns, options(h).with_ttl(LONG_TTL)).await?;
    let key = client.key("unprotected")?;
    let result = client
        .with_lock("unprotected", async |guard| {
            let taken_away = h.force_release(&key).await.is_ok();
            (guard.fencing_token(), taken_away)
        })
        .await;
    let Err(e) = result else {
        return Err(Failure(
            "with_lock reported a section protected to its end after its lock was taken away"
                .into(),
        ));
    };
    ensure!(
        e.kind() == ErrorKind::Lost,
        "expected Lost, got {}",
        e.error()
    );
    match e.into_value() {
        Some((token, true)) => ensure!(token.get() > 0, "the value lost its token"),
        Some((_, false)) => return Err(Failure("force_release failed".into())),
        None => return Err(Failure("with_lock threw the section's value away".into())),
    }
    expect_no_leftovers(h, &ns).await
}

/// `close` returns only once the release of a dropped guard is done: right after it, another
/// client takes the lock without waiting (the grant asked for a minute's TTL).
async fn close_waits_for_the_release_of_a_dropped_guard(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("closing")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    drop(guard);
    clients[0].close().await;
    let next = clients[1].mutex("closing")?.try_lock().await?;
    let Some(next) = next else {
        return Err(Failure(
            "the lock was still held after close returned: close did not wait for the release"
                .into(),
        ));
    };
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// `inspect` shows the holder's fencing token while held, and nothing once released.
async fn inspect_shows_the_holder(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let client = h.client(&ns, options(h)).await?;
    ensure!(
        client.inspect("seen").await?.is_none(),
        "a fresh key looks held"
    );
    let guard = client.mutex("seen")?.lock_timeout(patience(h)).await?;
    let info = client.inspect("seen").await?;
    let Some(info) = info else {
        return Err(Failure("inspect does not see the holder".into()));
    };
    ensure!(
        info.fencing_token == guard.fencing_token(),
        "inspect shows token {}, held {}",
        info.fencing_token,
        guard.fencing_token()
    );
    if let Some(left) = info.remaining_ttl {
        ensure!(
            left <= guard.ttl() + Duration::from_secs(1),
            "remaining TTL {left:?} above the TTL"
        );
    }
    guard.release().await?;
    ensure!(
        client.inspect("seen").await?.is_none(),
        "a released key still looks held"
    );
    expect_no_leftovers(h, &ns).await
}

/// On backends that notify or queue, a release wakes a waiter long before the holder's TTL
/// would have run out.
async fn release_wakes_a_waiter(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    if clients[0].capabilities().wait == WaitStrategy::Poll {
        eprintln!("release_wakes_a_waiter: not applicable, the backend polls");
        return Ok(());
    }
    let holder = clients[0]
        .mutex("wake")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    // Polling this slowly would miss the 20 s deadline: only a notification can wake it.
    let waiter = clients[1]
        .mutex("wake")?
        .with_options(options(h).with_backoff(Duration::from_millis(5), LONG_TTL))?;
    let waiting = tokio::spawn(async move { waiter.lock_timeout(Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await?;
    let granted = waiting
        .await
        .map_err(|e| Failure(format!("waiter panicked: {e}")))?;
    let granted =
        granted.map_err(|e| Failure(format!("the waiter was not woken by the release: {e}")))?;
    granted.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// Two waiters of one client; the holder releases and the first waiter is cancelled at the
/// same moment. Whichever of them the release woke, the second must be granted: a cancelled
/// waiter must not swallow the wake-up (the holder's 60 s TTL cannot rescue it).
async fn a_cancelled_waiter_does_not_hold_up_the_next(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    if clients[0].capabilities().wait == WaitStrategy::Poll {
        eprintln!(
            "a_cancelled_waiter_does_not_hold_up_the_next: not applicable, the backend polls"
        );
        return Ok(());
    }
    let holder = clients[0]
        .mutex("handoff")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    let waiter = || -> std::result::Result<_, Failure> {
        let mutex = clients[1]
            .mutex("handoff")?
            .with_options(options(h).with_backoff(Duration::from_millis(5), LONG_TTL))?;
        Ok(tokio::spawn(async move {
            mutex.lock_timeout(Duration::from_secs(20)).await
        }))
    };
    let first = waiter()?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = waiter()?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await?;
    // Let a woken first waiter run into its retry before it is cancelled.
    tokio::time::sleep(Duration::from_millis(1)).await;
    first.abort();
    // It may have been granted before the cancel arrived: then it hands over by releasing.
    if let Ok(Ok(guard)) = first.await {
        guard.release().await?;
    }
    let granted = second
        .await
        .map_err(|e| Failure(format!("the second waiter panicked: {e}")))?
        .map_err(|e| Failure(format!("the second waiter was not granted: {e}")))?;
    granted.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// A `release()` whose future is dropped before it completes (a timeout around it, or around
/// `with_lock`) still releases in the background: the next acquirer is granted long before the
/// holder's TTL would have freed the key.
async fn a_cancelled_release_still_releases(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("cancelled-release")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    // Polled once, then dropped: the release is on its way but unanswered.
    let _ = tokio::time::timeout(Duration::ZERO, guard.release()).await;
    let next = clients[1]
        .mutex("cancelled-release")?
        .lock_timeout(Duration::from_secs(15))
        .await
        .map_err(|e| {
            Failure(format!(
                "a release whose future was dropped did not happen: {e}"
            ))
        })?;
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

// Scenarios that take a hook from the backend's test, so they are not in `SCENARIOS`: the
// backend's test calls them with its harness and the hook.

/// Eight waiters (in two clients) queue on a held lock while the server restarts; after the
/// holder's release every waiter is granted in turn, each within the cap of one missed
/// notification (`backoff_max`, here 300 ms, plus scheduling slack) after the previous
/// holder began its release, and no two waiters overlap. A backend whose waiters rely on a
/// notification channel must bring it back after the restart (or fall back to polling): a
/// waiter left listening to a dead channel sleeps until the holder's TTL (a minute here).
///
/// `restart` restarts the server (for a cluster, whatever the backend's test calls a
/// restart) and returns once it answers again. The holder's grant may not survive it (a
/// server without persistence forgets it), so the holder's release may find nothing to
/// release; the waiters must be granted either way.
///
/// Call it from the backend's own test (a private server: never restart a shared one):
///
/// ```text
/// lockkit_core::testing::waiters_are_granted_across_a_server_restart(&harness, || async {
///     server.restart().await
/// }).await.unwrap();
/// ```
///
/// # Errors
/// A [`Failure`] saying which waiter was not granted, or granted late, or overlapped.
pub async fn waiters_are_granted_across_a_server_restart<F, Fut>(
    h: &dyn Harness,
    restart: F,
) -> Outcome
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    const WAITERS_PER_CLIENT: usize = 4;
    let cap = Duration::from_millis(300);
    // Scheduling on a loaded machine, a reconnect, an attempt and a release round trip.
    let slack = Duration::from_secs(1);
    let hold = Duration::from_millis(20);
    let ns = namespace();
    let waiting = options(h).with_backoff(Duration::from_millis(5), cap);
    let holder_client = h.client(&ns, options(h)).await?;
    let holder = holder_client
        .mutex("restart")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = h.client(&ns, waiting.clone()).await?;
        for _ in 0..WAITERS_PER_CLIENT {
            let mutex = client.mutex("restart")?.with_ttl(LONG_TTL)?;
            let wait = patience(h) + LONG_TTL / 2;
            tasks.push(tokio::spawn(async move {
                let guard = mutex.lock_timeout(wait).await?;
                let granted = Instant::now();
                tokio::time::sleep(hold).await;
                let releasing = Instant::now();
                guard.release().await?;
                Ok::<_, crate::error::Error>((granted, releasing))
            }));
        }
    }
    // Let every waiter try once and settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    restart().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    // Its grant may be gone with the restart: then there is nothing to release.
    let _ = holder.release().await;
    let mut sections = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let section = task
            .await
            .map_err(|e| Failure(format!("waiter {i} panicked: {e}")))?
            .map_err(|e| Failure(format!("waiter {i} was not granted after the restart: {e}")))?;
        sections.push(section);
    }
    sections.sort();
    let mut previous: Option<Instant> = None;
    for (n, (granted, releasing)) in sections.iter().enumerate() {
        let since = match previous {
            Some(previous) => {
                ensure!(
                    *granted >= previous,
                    "grant {n} came before the previous holder released: two holders"
                );
                previous
            }
            // The first waiter may have been granted before the release (the restart lost
            // the holder's grant).
            None => released.min(*granted),
        };
        let gap = granted.duration_since(since);
        ensure!(
            gap <= cap + slack,
            "grant {n} came {gap:?} after the previous release (cap {cap:?}): a waiter slept through the release"
        );
        previous = Some(*releasing);
    }
    drop(holder_client);
    expect_no_leftovers(h, &ns).await
}
