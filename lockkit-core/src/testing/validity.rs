//! The conformance scenarios of the validity floor: no guard of any primitive, on any path,
//! is handed out with less than a tenth of what the backend can promise left.
//!
//! A [`Recording`] over the harness's backend makes grants say they arrived with half the
//! floor left (as after a failover, or on a descheduled process): each must be confirmed by
//! a renewal or given back, never handed out as it came. Without the script, a reentrant
//! share and the earlier parts of a `lock_all` run down on their own (no auto-renewal).

use std::sync::Arc;
use std::time::Duration;

use super::election::election;
use super::recording::Recording;
use super::rwlock::rwlock;
use super::scenarios::{expect_no_leftovers, namespace, options, patience};
use super::semaphore::semaphore;
use super::{Failure, Harness, Outcome};
use crate::client::LockClient;
use crate::guard::MutexGuard;
use crate::options::LockOptions;
use crate::owner::LockOwner;

/// A client of `ns` over a [`Recording`] wrapping a new client's backend (kept too: its
/// session lives as long as it does), for scripting.
async fn scripted_client(
    h: &dyn Harness,
    ns: &str,
    options: LockOptions,
) -> Result<(LockClient, Arc<Recording>, LockClient), Failure> {
    let real = h.client(ns, options.clone()).await?;
    let scripted = Arc::new(Recording::new(real.backend().clone()));
    let client = LockClient::with_options(scripted.clone(), ns, options)?;
    Ok((client, scripted, real))
}

/// Fails unless `guard` was handed out with at least the floor left: a tenth of what the
/// backend can promise a grant of its TTL. The validity it was handed out with, not what is
/// left when this task reads it: a loaded machine may deschedule the task in between.
fn useful(client: &LockClient, guard: &MutexGuard, path: &str) -> Outcome {
    let floor = client.backend().max_validity(guard.ttl()) / 10;
    let given = guard.granted_validity();
    ensure!(
        given >= floor,
        "{path} handed out a guard with {given:?} left, under the floor of {floor:?}"
    );
    Ok(())
}

/// A mutex's grants that arrive with half the floor left are confirmed by a renewal before
/// they are handed out: on the first attempt, by `try_lock`, after a wait, and in `lock_all`.
pub(super) async fn a_short_mutex_grant_is_confirmed_before_it_is_handed_out(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let (client, scripted, _real) = scripted_client(h, &ns, options(h)).await?;
    let other = h.client(&ns, options(h)).await?;
    scripted.shorten_grants(true);
    let mutex = client.mutex("m")?;

    let first = mutex.lock_timeout(patience(h)).await?;
    useful(&client, &first, "lock()")?;
    first.release().await?;

    let tried = mutex.try_lock().await?;
    let Some(tried) = tried else {
        return Err(Failure("try_lock() of a free lock gave None".into()));
    };
    useful(&client, &tried, "try_lock()")?;
    tried.release().await?;

    let held = other.mutex("m")?.lock_timeout(patience(h)).await?;
    let waiter = {
        let (mutex, patience) = (mutex.clone(), patience(h));
        tokio::spawn(async move { mutex.lock_timeout(patience).await })
    };
    // Give the waiter time to queue, so that it is granted by the hand-over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await?;
    let waited = waiter
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))??;
    useful(&client, &waited, "lock() after a wait")?;
    waited.release().await?;

    let all = client.lock_all_timeout(["m", "n"], patience(h)).await?;
    for part in all.parts() {
        useful(&client, part, "lock_all()")?;
    }
    all.release().await?;
    ensure!(
        scripted.renewals() >= 5,
        "{} renewals confirmed 5 short grants",
        scripted.renewals()
    );
    drop(client);
    expect_no_leftovers(h, &ns).await
}

/// A permit's, a read lock's and a write lock's grants that arrive with half the floor left
/// are confirmed by a renewal before they are handed out, waiting or trying.
pub(super) async fn a_short_permit_or_rwlock_grant_is_confirmed_before_it_is_handed_out(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let (client, scripted, _real) = scripted_client(h, &ns, options(h)).await?;
    scripted.shorten_grants(true);
    if let Some(pool) = semaphore(&client, "pool", 2)? {
        let permit = pool.acquire_timeout(patience(h)).await?;
        useful(&client, permit.as_guard(), "Semaphore::acquire()")?;
        let tried = pool.try_acquire().await?;
        let Some(tried) = tried else {
            return Err(Failure("try_acquire() with a free permit gave None".into()));
        };
        useful(&client, tried.as_guard(), "Semaphore::try_acquire()")?;
        permit.release().await?;
        tried.release().await?;
    }
    if let Some(lock) = rwlock(&client, "rw")? {
        let read = lock.read_timeout(patience(h)).await?;
        useful(&client, read.as_guard(), "RwLock::read()")?;
        let tried = lock.try_read().await?;
        let Some(tried) = tried else {
            return Err(Failure("try_read() beside a reader gave None".into()));
        };
        useful(&client, tried.as_guard(), "RwLock::try_read()")?;
        read.release().await?;
        tried.release().await?;
        let write = lock.write_timeout(patience(h)).await?;
        useful(&client, write.as_guard(), "RwLock::write()")?;
        write.release().await?;
        let tried = lock.try_write().await?;
        let Some(tried) = tried else {
            return Err(Failure("try_write() of a free lock gave None".into()));
        };
        useful(&client, tried.as_guard(), "RwLock::try_write()")?;
        tried.release().await?;
    }
    drop(client);
    expect_no_leftovers(h, &ns).await
}

/// A leadership whose grant arrives with half the floor left is confirmed before it is
/// handed out: the election's floor is the grant's promise, not what was left of it.
pub(super) async fn a_short_leadership_grant_is_confirmed_before_it_is_handed_out(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let (client, scripted, _real) = scripted_client(h, &ns, options(h)).await?;
    let Some(election) = election(&client, "leader")? else {
        return Ok(());
    };
    scripted.shorten_grants(true);
    let leadership = election.campaign_timeout("me", patience(h)).await?;
    useful(&client, leadership.guard(), "Election::campaign()")?;
    leadership.resign().await?;
    let tried = election.try_campaign("me").await?;
    let Some(tried) = tried else {
        return Err(Failure(
            "try_campaign() with nobody leading gave None".into(),
        ));
    };
    useful(&client, tried.guard(), "Election::try_campaign()")?;
    tried.resign().await?;
    drop(client);
    expect_no_leftovers(h, &ns).await
}

/// A short grant whose confirming renewal fails is given back and taken again within the
/// wait: the caller gets a guard with useful validity, never the short one.
pub(super) async fn a_short_grant_that_cannot_be_confirmed_is_given_back_and_taken_again(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let (client, scripted, _real) = scripted_client(h, &ns, options(h)).await?;
    scripted.shorten_grants(true);
    scripted.fail_renewals(1);
    let guard = client.mutex("m")?.lock_timeout(patience(h)).await?;
    useful(&client, &guard, "lock() after a failed confirmation")?;
    ensure!(
        scripted.count("abandon") >= 1,
        "the grant whose confirmation failed was not given back"
    );
    guard.release().await?;
    drop(client);
    expect_no_leftovers(h, &ns).await
}

/// A reentrant acquisition shares a grant only with useful validity left: one that has run
/// down (no auto-renewal) is renewed first, and the share is that same grant.
///
/// The confirming renewal has half the floor to answer. When it cannot (a busy machine), the
/// first grant is lost and a new one (or a wait behind the lost grant's record) is correct;
/// that round proves nothing and is run again. A share path that never renews loses the
/// first grant in every round and fails.
pub(super) async fn a_reentrant_share_is_handed_out_with_useful_validity(
    h: &dyn Harness,
) -> Outcome {
    const ROUNDS: usize = 5;
    let ns = namespace();
    let client = h.client(&ns, options(h).with_auto_renew(false)).await?;
    let me = LockOwner::new();
    for round in 0..ROUNDS {
        let mutex = client.mutex(&format!("r{round}"))?.reentrant(&me);
        let first = mutex.lock_timeout(patience(h)).await?;
        let floor = client.backend().max_validity(first.ttl()) / 10;
        // Down to half the floor: a share must not be handed out with that.
        tokio::time::sleep_until((first.valid_until() - floor / 2).into()).await;
        let second = match mutex.lock_timeout(patience(h)).await {
            Ok(second) => second,
            // Lost before the share could confirm it, the first grant's record can stay
            // until its guard goes (etcd: on the session's lease), and a new grant waits
            // behind it: this round proves nothing either.
            Err(_) if first.is_lost() => {
                drop(first);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        useful(&client, &second, "a reentrant lock()")?;
        if first.is_lost() {
            second.release().await?;
            drop(first);
            continue;
        }
        ensure!(
            second.fencing_token() == first.fencing_token(),
            "the reentrant lock() made a new grant while the first was held"
        );
        second.release().await?;
        first.release().await?;
        drop(client);
        return expect_no_leftovers(h, &ns).await;
    }
    Err(Failure(format!(
        "in {ROUNDS} rounds, no reentrant lock() confirmed the held grant: each lost it and took a new one"
    )))
}

/// `lock_all` hands out every part with useful validity: a part taken first whose lease ran
/// out (no auto-renewal) while a later part was waited for is taken again.
pub(super) async fn lock_all_hands_out_every_part_with_useful_validity(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let ours = h.client(&ns, options(h).with_auto_renew(false)).await?;
    let other = h.client(&ns, options(h)).await?;
    let taken = other.mutex("b")?.lock_timeout(patience(h)).await?;
    let set = {
        let (ours, patience) = (ours.clone(), patience(h));
        tokio::spawn(async move { ours.lock_all_timeout(["a", "b"], patience).await })
    };
    // "a" is taken first; keep "b" until a's validity has run out.
    let ttl = h.ttl().max(ours.capabilities().min_ttl);
    tokio::time::sleep(ours.backend().max_validity(ttl) + Duration::from_millis(200)).await;
    taken.release().await?;
    let all = set
        .await
        .map_err(|e| Failure(format!("lock_all panicked: {e}")))??;
    for part in all.parts() {
        useful(&ours, part, "lock_all()")?;
        ensure!(
            part.is_held().await?,
            "lock_all() handed out {} that the server does not hold for it",
            part.key()
        );
    }
    all.release().await?;
    drop(ours);
    expect_no_leftovers(h, &ns).await
}
