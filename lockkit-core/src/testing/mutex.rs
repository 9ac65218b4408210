//! The conformance scenarios of the mutex: exclusion under contention, fencing, ownership,
//! expiry, renewal, the lost signal, tries and timeouts, reentrancy, key validation,
//! `with_lock`, inspection and waking a waiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::scenarios::{LONG_TTL, clients, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};
use crate::backend::{AcquireRequest, Attempt, Renewal};
use crate::capabilities::WaitStrategy;
use crate::client::LockClient;
use crate::error::ErrorKind;
use crate::lease::Lease;
use crate::owner::LockOwner;
use crate::token::{FencingToken, OwnerToken};

/// Many tasks in several clients increment a counter with a read, a pause and a write: any
/// overlap of critical sections loses updates, and grants must come in fencing-token order.
pub(super) async fn mutual_exclusion_under_contention(h: &dyn Harness) -> Outcome {
    exclusion_under_contention(h, |_| true).await
}

/// [`mutual_exclusion_under_contention`], with client `i`'s mutexes fair if `fair(i)`.
pub(super) async fn exclusion_under_contention(
    h: &dyn Harness,
    fair: impl Fn(usize) -> bool,
) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 3;
    const ROUNDS: u64 = 15;
    let ns = namespace();
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::<crate::Result<()>>::new();
    for i in 0..CLIENTS {
        let client = h.client(&ns, options(h).with_fair(fair(i))).await?;
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
pub(super) async fn fencing_tokens_strictly_increase(h: &dyn Harness) -> Outcome {
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
pub(super) async fn release_by_non_owner_is_refused(h: &dyn Harness) -> Outcome {
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
pub(super) async fn abandoned_lease_expires(h: &dyn Harness) -> Outcome {
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
pub(super) async fn renewal_keeps_lock_past_ttl(h: &dyn Harness) -> Outcome {
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
pub(super) async fn lost_fires_when_lease_is_taken_away(h: &dyn Harness) -> Outcome {
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
pub(super) async fn try_lock_returns_none_on_contention(h: &dyn Harness) -> Outcome {
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
pub(super) async fn lock_timeout_fails_with_timeout(h: &dyn Harness) -> Outcome {
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

/// With an explicit owner, a second acquisition shares the grant; the lock is released on
/// the server only with the last guard. Other owners and owner-less mutexes are excluded.
pub(super) async fn reentrant_owner_shares_the_grant(h: &dyn Harness) -> Outcome {
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
pub(super) async fn invalid_keys_are_rejected(h: &dyn Harness) -> Outcome {
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

/// `with_lock` runs the critical section and cancels it when the lock is lost.
pub(super) async fn with_lock_cancels_when_lost(h: &dyn Harness) -> Outcome {
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
pub(super) async fn with_lock_reports_an_unprotected_end_with_the_value(
    h: &dyn Harness,
) -> Outcome {
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

/// `inspect` shows the holder's fencing token while held, and nothing once released.
pub(super) async fn inspect_shows_the_holder(h: &dyn Harness) -> Outcome {
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
pub(super) async fn release_wakes_a_waiter(h: &dyn Harness) -> Outcome {
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
