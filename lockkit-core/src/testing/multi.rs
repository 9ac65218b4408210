//! The conformance scenarios of [`LockClient::lock_all`]: overlapping sets never deadlock
//! and never overlap, a set with a taken part leaves nothing held, a cancelled one neither,
//! and the guard reports the loss of any part.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::seq::SliceRandom as _;

use super::scenarios::{clients, expect_no_leftovers, namespace, patience};
use super::{Failure, Harness, Outcome};
use crate::client::LockClient;
use crate::error::ErrorKind;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// Whether `name` is free, asked of the server.
async fn free(client: &LockClient, name: &str) -> Result<bool, Failure> {
    Ok(client.inspect(name).await?.is_none())
}

/// Tasks of several clients take random overlapping sets, each listed in a random order:
/// all finish (no deadlock), and no lock is held by two of them at once.
pub(super) async fn lock_all_over_overlapping_sets_never_deadlocks(h: &dyn Harness) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 2;
    const ROUNDS: usize = 8;
    let ns = namespace();
    let inside: Arc<HashMap<&str, AtomicUsize>> =
        Arc::new(NAMES.iter().map(|n| (*n, AtomicUsize::new(0))).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::<Outcome>::new();
    for client in clients(h, &ns, CLIENTS).await? {
        for _ in 0..TASKS_PER_CLIENT {
            let (client, inside, overlaps, patience) = (
                client.clone(),
                inside.clone(),
                overlaps.clone(),
                patience(h),
            );
            tasks.spawn(async move {
                for _ in 0..ROUNDS {
                    let mut set = NAMES.to_vec();
                    set.shuffle(&mut rand::rng());
                    set.truncate(rand::random_range(2..=3));
                    let held = client.lock_all_timeout(&set, patience).await?;
                    for name in &set {
                        if inside[name].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    for name in &set {
                        inside[name].fetch_sub(1, Ordering::SeqCst);
                    }
                    ensure!(held.release().await?, "a release of {set:?} was refused");
                }
                Ok(())
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| Failure(format!("a task panicked: {e}")))??;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(overlaps == 0, "{overlaps} locks were held twice at once");
    expect_no_leftovers(h, &ns).await
}

/// A set with a taken part gives back what it took: `try_lock_all` answers `None` and a
/// timed-out `lock_all_timeout` an error, and the free parts are free again; once the taken
/// part is free, the whole set is had, each part with its own token.
pub(super) async fn lock_all_takes_nothing_when_a_part_is_taken(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let taken = clients[1].mutex("b")?.lock_timeout(patience(h)).await?;
    ensure!(
        clients[0].try_lock_all(["c", "b", "a"]).await?.is_none(),
        "try_lock_all got a set with a taken part"
    );
    let timed_out = clients[0]
        .lock_all_timeout(["b", "a"], Duration::from_millis(300))
        .await;
    ensure!(
        timed_out
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::Timeout),
        "lock_all_timeout with a taken part gave {timed_out:?}"
    );
    clients[0].close().await;
    for name in ["a", "c"] {
        ensure!(
            free(&clients[1], name).await?,
            "{name} is still held after a failed set"
        );
    }
    let taken_token = taken.fencing_token();
    ensure!(taken.release().await?, "the release of b was refused");
    let all = clients[0]
        .lock_all_timeout(["c", "b", "a", "b"], patience(h))
        .await?;
    let keys: Vec<_> = all
        .parts()
        .iter()
        .map(|p| p.key().name().to_owned())
        .collect();
    ensure!(
        keys == ["a", "b", "c"],
        "the parts are {keys:?}, not a, b, c once each in order"
    );
    let key = clients[0].key("b")?;
    ensure!(
        all.fencing_token(&key) > Some(taken_token),
        "b's token {:?} is not above its holder's before, {taken_token}",
        all.fencing_token(&key)
    );
    ensure!(all.release().await?, "the release of the set was refused");
    expect_no_leftovers(h, &ns).await
}

/// A `lock_all` dropped while it waits for its second part leaves its first part free.
pub(super) async fn a_cancelled_lock_all_leaves_nothing_behind(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let taken = clients[1].mutex("q2")?.lock_timeout(patience(h)).await?;
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        clients[0].lock_all(["q2", "q1"]),
    )
    .await;
    ensure!(waited.is_err(), "lock_all got a set with a taken part");
    clients[0].close().await;
    ensure!(
        free(&clients[1], "q1").await?,
        "q1 is still held after a cancelled set"
    );
    ensure!(taken.release().await?, "the release of q2 was refused");
    expect_no_leftovers(h, &ns).await
}

/// The set's guard reports the loss of any one part.
pub(super) async fn lock_all_reports_the_loss_of_any_part(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let client = h.client(&ns, super::scenarios::options(h)).await?;
    let set = client.lock_all_timeout(["x", "y"], patience(h)).await?;
    h.force_release(&client.key("y")?).await?;
    ensure!(
        tokio::time::timeout(patience(h), set.lost()).await.is_ok(),
        "the set's lost signal did not fire when y was taken away"
    );
    ensure!(set.is_lost(), "is_lost() says the set is whole");
    ensure!(
        !set.release().await?,
        "the release claimed every part was still ours"
    );
    expect_no_leftovers(h, &ns).await
}
