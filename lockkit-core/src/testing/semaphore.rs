//! The conformance scenarios of semaphores ([`Semaphore`](crate::Semaphore)): never more
//! holders than permits, exactly as many when they are asked for, a release that wakes a
//! waiter, a crashed holder's permit freed after its TTL, cancelled acquisitions that leave
//! nothing, renewal past the TTL, disagreeing permit counts refused, and a semaphore
//! independent of the mutex of the same name.
//!
//! On a backend without semaphores, each scenario checks instead that
//! [`LockClient::semaphore`] refuses with `Unsupported` and says why.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::scenarios::{LONG_TTL, clients, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};
use crate::MAX_PERMITS;
use crate::backend::{AcquireRequest, Attempt, Hold};
use crate::client::LockClient;
use crate::error::ErrorKind;
use crate::semaphore::{Permit, Semaphore};
use crate::token::OwnerToken;

/// The semaphore `name` of `client`, or `None` (after checking the refusal) where the
/// backend has no semaphores.
pub(super) fn semaphore(
    client: &LockClient,
    name: &str,
    permits: u32,
) -> Result<Option<Semaphore>, Failure> {
    match client.semaphore(name, permits) {
        Ok(semaphore) => {
            ensure!(
                client.capabilities().semaphore.is_supported(),
                "semaphore() succeeded on a backend whose capabilities deny semaphores"
            );
            Ok(Some(semaphore))
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ensure!(
                !client.capabilities().semaphore.is_supported(),
                "semaphore() refused on a backend whose capabilities claim semaphores: {e}"
            );
            ensure!(
                e.to_string().len() > "semaphores are not supported: ".len() + 10,
                "the refusal does not say why: {e}"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Tasks of several clients take and give back permits of one semaphore: never more holders
/// at once than permits, and every grant's fencing token is new and above the tokens its
/// task had before.
pub(super) async fn a_semaphore_never_admits_more_than_its_permits(h: &dyn Harness) -> Outcome {
    permits_under_contention(h, |_| true).await
}

/// The same with fair and non-fair clients on one semaphore
/// ([`LockOptions::fair`](crate::LockOptions::fair)): they exclude each other as well.
pub(super) async fn fair_and_non_fair_permit_holders_never_exceed_the_permits(
    h: &dyn Harness,
) -> Outcome {
    permits_under_contention(h, |client| client != 1).await
}

/// Tasks of three clients, fair or not as `fair(client)` says, take and give back permits of
/// one semaphore (see [`a_semaphore_never_admits_more_than_its_permits`]).
async fn permits_under_contention(h: &dyn Harness, fair: fn(usize) -> bool) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 3;
    const ROUNDS: usize = 8;
    const PERMITS: u32 = 3;
    let ns = namespace();
    let mut clients = Vec::with_capacity(CLIENTS);
    for client in 0..CLIENTS {
        clients.push(h.client(&ns, options(h).with_fair(fair(client))).await?);
    }
    if semaphore(&clients[0], "pool", PERMITS)?.is_none() {
        return Ok(());
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::<Result<Vec<u64>, Failure>>::new();
    for client in &clients {
        for _ in 0..TASKS_PER_CLIENT {
            let pool = client.semaphore("pool", PERMITS)?;
            let (inside, most_inside, patience) =
                (inside.clone(), most_inside.clone(), patience(h));
            tasks.spawn(async move {
                let mut tokens = Vec::with_capacity(ROUNDS);
                for _ in 0..ROUNDS {
                    let permit = pool.acquire_timeout(patience).await?;
                    let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most_inside.fetch_max(now_inside, Ordering::SeqCst);
                    tokens.push(permit.fencing_token().get());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    ensure!(permit.release().await?, "a permit's release was refused");
                }
                Ok(tokens)
            });
        }
    }
    let mut all = HashSet::new();
    while let Some(joined) = tasks.join_next().await {
        let tokens = joined.map_err(|e| Failure(format!("a task panicked: {e}")))??;
        ensure!(
            tokens.windows(2).all(|pair| pair[0] < pair[1]),
            "a task's fencing tokens did not increase: {tokens:?}"
        );
        for token in tokens {
            ensure!(all.insert(token), "fencing token {token} was granted twice");
        }
    }
    let most = most_inside.load(Ordering::SeqCst);
    ensure!(
        most <= PERMITS as usize,
        "{most} holders at once of a semaphore of {PERMITS} permits"
    );
    expect_no_leftovers(h, &ns).await
}

/// A semaphore of 3 permits grants 3 at once to three clients, then none; a fourth waits
/// until its timeout. Once one holder gives its permit back, a permit is had again, with a
/// token above every earlier grant's. The count itself is checked: 0 and more than
/// `MAX_PERMITS` are refused.
pub(super) async fn a_semaphore_admits_exactly_its_permits(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 4).await?;
    if semaphore(&clients[0], "slots", 3)?.is_none() {
        return Ok(());
    }
    for bad in [0, MAX_PERMITS + 1] {
        let refused = clients[0].semaphore("slots", bad);
        ensure!(
            matches!(&refused, Err(e) if e.kind() == ErrorKind::InvalidConfig),
            "a semaphore of {bad} permits was not refused as invalid: {refused:?}"
        );
    }
    let mut held: Vec<Permit> = Vec::new();
    for client in &clients[..3] {
        let Some(permit) = client.semaphore("slots", 3)?.try_acquire().await? else {
            return Err(Failure(format!(
                "permit {} of 3 was refused with {} held",
                held.len() + 1,
                held.len()
            )));
        };
        held.push(permit);
    }
    let fourth = clients[3].semaphore("slots", 3)?;
    ensure!(
        fourth.try_acquire().await?.is_none(),
        "a fourth permit was granted by a semaphore of 3"
    );
    let timed_out = fourth.acquire_timeout(Duration::from_millis(300)).await;
    ensure!(
        matches!(&timed_out, Err(e) if e.kind() == ErrorKind::Timeout),
        "a fourth acquisition did not time out: {timed_out:?}"
    );
    let highest = held.iter().map(Permit::fencing_token).max();
    let given_back = held.remove(1);
    ensure!(
        given_back.release().await?,
        "a permit's release was refused"
    );
    let Some(next) = fourth.try_acquire().await? else {
        return Err(Failure(
            "no permit after one of three was given back".into(),
        ));
    };
    ensure!(
        Some(next.fencing_token()) > highest,
        "the new grant's token {} is not above the earlier grants' {highest:?}",
        next.fencing_token()
    );
    held.push(next);
    for permit in held {
        ensure!(permit.release().await?, "a permit's release was refused");
    }
    expect_no_leftovers(h, &ns).await
}

/// A waiter on a full semaphore is granted when a holder gives its permit back, long before
/// the holders' TTL (a minute) could have freed one, and not before the release.
pub(super) async fn a_permit_release_wakes_a_waiter(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(pool) = semaphore(&clients[0], "wake", 2)? else {
        return Ok(());
    };
    let pool = pool.with_ttl(LONG_TTL)?;
    let first = pool.acquire_timeout(patience(h)).await?;
    let second = pool.acquire_timeout(patience(h)).await?;
    let waiter = clients[1].semaphore("wake", 2)?;
    let patience = patience(h);
    let waiting = tokio::spawn(async move {
        let permit = waiter.acquire_timeout(patience).await;
        (permit, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiting.is_finished(),
        "a waiter was granted a permit of a full semaphore"
    );
    let released_at = Instant::now();
    ensure!(second.release().await?, "a permit's release was refused");
    let (granted, granted_at) = waiting
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?;
    let granted = granted.map_err(|e| {
        Failure(format!(
            "the waiter was not granted after a release: {}",
            e.display_chain()
        ))
    })?;
    ensure!(
        granted_at >= released_at,
        "the waiter was granted before the release"
    );
    ensure!(granted.release().await?, "a permit's release was refused");
    ensure!(first.release().await?, "a permit's release was refused");
    expect_no_leftovers(h, &ns).await
}

/// A client that took both permits of a semaphore and crashed (nothing released, nothing
/// renewed) blocks it for about its TTL; then a permit is had again.
pub(super) async fn a_crashed_holder_frees_its_permit_after_its_ttl(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let crashed = h.client(&ns, options(h)).await?;
    if semaphore(&crashed, "crash", 2)?.is_none() {
        return Ok(());
    }
    let key = crashed.key("crash")?;
    let hold = Hold::Permit { permits: 2 };
    let granted_at = Instant::now();
    for _ in 0..2 {
        let request = AcquireRequest::new(key.clone(), OwnerToken::generate()?, h.ttl(), false)
            .with_hold(hold);
        let Attempt::Granted(_) = crashed.backend().try_acquire(&request).await? else {
            return Err(Failure(
                "a permit of a fresh semaphore of 2 was contended".into(),
            ));
        };
    }
    h.crash(crashed).await;
    let next = h.client(&ns, options(h)).await?;
    let permit = next
        .semaphore("crash", 2)?
        .acquire_timeout(patience(h))
        .await?;
    let blocked_for = granted_at.elapsed();
    ensure!(
        blocked_for >= h.ttl() / 2,
        "the crashed holder's permits were free after {blocked_for:?}, before its TTL of {:?}",
        h.ttl()
    );
    ensure!(permit.release().await?, "release after expiry refused");
    expect_no_leftovers(h, &ns).await
}

/// Acquisitions of a full semaphore cut at points spread over a round trip (a minute's TTL
/// each) leave nothing behind: once the holder gives its permit back, the next client gets
/// one promptly, and nothing is left on the server.
pub(super) async fn a_cancelled_permit_acquisition_leaves_nothing_behind(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let Some(pool) = semaphore(&clients[0], "cancel", 1)? else {
        return Ok(());
    };
    let holder = pool.acquire_timeout(patience(h)).await?;
    let contender = clients[1].semaphore("cancel", 1)?.with_ttl(LONG_TTL)?;
    for round in 0..10u64 {
        let cut_after = Duration::from_micros(round * 700);
        let _ = tokio::time::timeout(cut_after, contender.try_acquire()).await;
        let _ = tokio::time::timeout(cut_after, contender.acquire()).await;
    }
    ensure!(holder.release().await?, "the holder's release was refused");
    for round in 0..10u64 {
        let cut_after = Duration::from_micros(round * 700);
        if let Ok(won) = tokio::time::timeout(cut_after, contender.acquire()).await {
            drop(won?);
        }
    }
    let next = clients[2]
        .semaphore("cancel", 1)?
        .acquire_timeout(Duration::from_secs(15))
        .await
        .map_err(|e| {
            Failure(format!(
                "the semaphore stayed full after cancelled acquisitions: {e}"
            ))
        })?;
    ensure!(next.release().await?, "a permit's release was refused");
    expect_no_leftovers(h, &ns).await
}

/// A permit held for three TTLs is renewed in the background: nobody else gets it, and the
/// server still counts it.
pub(super) async fn renewal_keeps_a_permit_past_its_ttl(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(pool) = semaphore(&clients[0], "renew", 1)? else {
        return Ok(());
    };
    let permit = pool.acquire_timeout(patience(h)).await?;
    let other = clients[1].semaphore("renew", 1)?;
    let until = Instant::now() + h.ttl() * 3;
    while Instant::now() < until {
        ensure!(
            other.try_acquire().await?.is_none(),
            "a renewed permit was granted to another client"
        );
        tokio::time::sleep(h.ttl() / 2).await;
    }
    ensure!(!permit.is_lost(), "a renewed permit reports itself lost");
    ensure!(
        permit.is_held().await?,
        "the server no longer counts a renewed permit"
    );
    ensure!(permit.release().await?, "a permit's release was refused");
    expect_no_leftovers(h, &ns).await
}

/// While a semaphore is in use with 2 permits, a client asking for 3 is refused with
/// `InvalidConfig` (waiting or not), and nothing of its attempt stays; once the semaphore is
/// free, 3 permits is a valid count again.
pub(super) async fn disagreeing_permit_counts_are_refused(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(two) = semaphore(&clients[0], "agree", 2)? else {
        return Ok(());
    };
    let held = two.acquire_timeout(patience(h)).await?;
    let three = clients[1].semaphore("agree", 3)?;
    let tried = three.try_acquire().await;
    ensure!(
        matches!(&tried, Err(e) if e.kind() == ErrorKind::InvalidConfig),
        "try_acquire with 3 permits on a semaphore of 2 in use: {tried:?}"
    );
    let waited = three.acquire_timeout(patience(h)).await;
    ensure!(
        matches!(&waited, Err(e) if e.kind() == ErrorKind::InvalidConfig),
        "acquire with 3 permits on a semaphore of 2 in use: {waited:?}"
    );
    ensure!(
        two.try_acquire().await?.is_some(),
        "the refused attempts took the second permit"
    );
    ensure!(held.release().await?, "a permit's release was refused");
    expect_no_leftovers(h, &ns).await?;
    let now_three = three.acquire_timeout(patience(h)).await?;
    ensure!(now_three.release().await?, "a permit's release was refused");
    expect_no_leftovers(h, &ns).await
}

/// The semaphore and the mutex of one name do not block each other.
pub(super) async fn a_semaphore_and_the_mutex_of_its_name_are_independent(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(single) = semaphore(&clients[0], "shared-name", 1)? else {
        return Ok(());
    };
    let locked = clients[1]
        .mutex("shared-name")?
        .lock_timeout(patience(h))
        .await?;
    let Some(permit) = single.try_acquire().await? else {
        return Err(Failure(
            "the mutex of the same name blocked the semaphore".into(),
        ));
    };
    ensure!(locked.release().await?, "the mutex's release was refused");
    let Some(relocked) = clients[1].mutex("shared-name")?.try_lock().await? else {
        return Err(Failure(
            "the semaphore of the same name blocked the mutex".into(),
        ));
    };
    ensure!(relocked.release().await?, "the mutex's release was refused");
    ensure!(permit.release().await?, "a permit's release was refused");
    expect_no_leftovers(h, &ns).await
}
