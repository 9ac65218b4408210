//! The conformance scenarios of the operator operations: listing held locks a page at a time
//! ([`LockBackend::list`](crate::backend::LockBackend::list)) and breaking a stale lock
//! ([`LockBackend::force_release`](crate::backend::LockBackend::force_release)).
//!
//! They use the backend's own operations; the harness's
//! [`force_release`](super::Harness::force_release) hook stays as the independent,
//! server-side way to take a lock away that the other scenarios use.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::scenarios::{clients, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};
use crate::backend::LockInfo;
use crate::client::LockClient;
use crate::error::ErrorKind;

/// Every page of `prefix`, about `limit` locks at a time (Redis' `SCAN` takes the limit as
/// a hint), by name; a lock listed twice counts once.
async fn list_all(
    client: &LockClient,
    prefix: &str,
    limit: usize,
) -> Result<BTreeMap<String, LockInfo>, Failure> {
    let mut all = BTreeMap::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let page = client.list_page(prefix, cursor.as_deref(), limit).await?;
        for (key, info) in page.locks {
            ensure!(
                key.namespace() == client.namespace(),
                "listed {key} from another namespace"
            );
            all.insert(key.name().to_owned(), info);
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(all),
        }
    }
    Err(Failure(format!("listing {prefix:?} never ended")))
}

/// Held locks are listed by prefix across pages of one, with their fencing tokens, within
/// the namespace only; released ones disappear; waiters show where the backend queues.
pub(super) async fn list_shows_the_held_locks_by_prefix_page_by_page(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    // A namespace that extends this one: a listing must not reach into it.
    let neighbour = h.client(&format!("{ns}x"), options(h)).await?;
    let _theirs = neighbour.mutex("job-z")?.lock_timeout(patience(h)).await?;
    let mut guards = BTreeMap::new();
    for name in ["job-a", "job-b", "job-c", "other"] {
        let guard = clients[0].mutex(name)?.lock_timeout(patience(h)).await?;
        guards.insert(name, guard);
    }

    let listed = list_all(&clients[1], "job-", 1).await?;
    ensure!(
        listed
            .keys()
            .map(String::as_str)
            .eq(["job-a", "job-b", "job-c"]),
        "listed {:?} for the prefix job-",
        listed.keys()
    );
    for (name, info) in &listed {
        let guard = &guards[name.as_str()];
        ensure!(
            info.fencing_token == guard.fencing_token(),
            "{name} listed with token {}, held with {}",
            info.fencing_token,
            guard.fencing_token()
        );
        if let Some(left) = info.remaining_ttl {
            ensure!(
                left <= guard.ttl() + Duration::from_secs(1),
                "{name} listed with {left:?} left, above its TTL"
            );
        }
    }
    let everything = list_all(&clients[1], "", 3).await?;
    ensure!(
        everything.len() == 4 && everything.contains_key("other"),
        "listed {:?} for no prefix",
        everything.keys()
    );
    ensure!(
        list_all(&clients[1], "nothing-", 10).await?.is_empty(),
        "a prefix no lock has listed locks"
    );

    // A queued waiter, where the backend counts them.
    let waiter = clients[1].mutex("job-a")?;
    let waiting = tokio::spawn(async move { waiter.lock_timeout(Duration::from_secs(60)).await });
    let by = Instant::now() + Duration::from_secs(3);
    let mut queued = false;
    while Instant::now() < by {
        match clients[1].inspect("job-a").await?.and_then(|i| i.waiters) {
            None => break,
            Some(1) => {
                queued = true;
                break;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    if queued {
        let listed = list_all(&clients[1], "job-a", 5).await?;
        ensure!(
            listed.get("job-a").and_then(|i| i.waiters) == Some(1),
            "job-a listed as {:?} with one waiter queued",
            listed.get("job-a")
        );
    }

    for name in ["job-a", "job-b"] {
        if let Some(guard) = guards.remove(name) {
            guard.release().await?;
        }
    }
    let granted = waiting
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))??;
    let listed = list_all(&clients[1], "job-", 2).await?;
    ensure!(
        listed.keys().map(String::as_str).eq(["job-a", "job-c"]),
        "listed {:?} after job-b's release (job-a passed to the waiter)",
        listed.keys()
    );
    ensure!(
        listed["job-a"].fencing_token == granted.fencing_token(),
        "job-a listed with the old holder's token"
    );
    granted.release().await?;
    for (_, guard) in guards {
        guard.release().await?;
    }
    ensure!(
        list_all(&clients[1], "", 1).await?.is_empty(),
        "locks listed after every release"
    );

    let bad = clients[1].list_page("a/b", None, 10).await;
    ensure!(
        bad.as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::InvalidKey),
        "a prefix with a '/' gave {bad:?}"
    );
    let zero = clients[1].list_page("", None, 0).await;
    ensure!(
        zero.as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::InvalidConfig),
        "a limit of 0 gave {zero:?}"
    );
    drop(_theirs);
    neighbour.close().await;
    expect_no_leftovers(h, &format!("{ns}x")).await?;
    expect_no_leftovers(h, &ns).await
}

/// An operator breaks a held lock: the waiter behind it is granted with a higher token, the
/// old holder's guard reports the lock lost at its next renewal and its release claims
/// nothing; breaking a free lock says it was not held.
pub(super) async fn force_release_breaks_the_lock_and_the_holder_reports_lost(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let old = clients[0].mutex("stale")?.lock_timeout(patience(h)).await?;
    let waiter = clients[1].mutex("stale")?;
    let limit = patience(h);
    let waiting = tokio::spawn(async move { waiter.lock_timeout(limit).await });
    tokio::time::sleep(Duration::from_millis(200)).await;

    ensure!(
        clients[2].force_release("stale").await?,
        "breaking a held lock said it was not held"
    );
    let new = waiting
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?
        .map_err(|e| Failure(format!("the waiter was not granted after the break: {e}")))?;
    ensure!(
        new.fencing_token() > old.fencing_token(),
        "the new holder's token {} is not above the broken holder's {}",
        new.fencing_token(),
        old.fencing_token()
    );
    ensure!(
        tokio::time::timeout(patience(h), old.lost()).await.is_ok(),
        "the broken holder's guard never reported the lock lost"
    );
    ensure!(
        !old.release().await?,
        "the broken holder's release claimed the lock"
    );
    ensure!(
        new.is_held().await?,
        "the broken holder's release removed the new holder's lock"
    );
    ensure!(
        !clients[2].force_release("never-held").await?,
        "breaking a free lock said it was held"
    );
    ensure!(new.release().await?, "the new holder's release refused");
    expect_no_leftovers(h, &ns).await
}
