//! Semaphores on the compose cluster: waiters served in queue order, a release that wakes
//! only the waiters whose place changed, waiters whose connections break, a waiter that
//! queues again when its session is revoked, a disagreeing count refused without a trace, and
//! the permits of a holder process killed with SIGKILL freed after its TTL.
//! None of these disturb the cluster.
//! One test binary, its tests in modules by topic; the helpers they share are here.

#[path = "../support/mod.rs"]
mod support;

mod failing_clients;
mod listing;
mod permits;
mod queue_order;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::LockBackend;
use lockkit_core::{LockClient, LockOptions, Permit, Semaphore};
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use tokio::sync::mpsc;

/// The TTL of the killed holder, whose expiry is that test's subject.
const TTL: Duration = Duration::from_secs(2);
/// The TTL of every other client. The tests of queue order and wake-ups assume that no
/// session ends while they run: one that does (its keep-alive starved past the TTL on a
/// loaded machine, as 2 s sessions were, seen as both keys of a holder's lease gone at
/// once) rightly takes its keys out of the queue, which changes the order they check.
const QUEUE_TTL: Duration = Duration::from_secs(10);
/// How long a grant that is due may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);
/// Set in the environment of the holder process that
/// `a_killed_holders_permits_are_free_after_its_ttl` starts: the namespace to hold in.
const CHILD_NAMESPACE: &str = "LOCKKIT_TEST_SEMAPHORE_HOLDER_NAMESPACE";

async fn client_of(backend: Arc<dyn LockBackend>, ns: &str, ttl: Duration) -> LockClient {
    let options = LockOptions::default().with_ttl(ttl);
    LockClient::with_options(backend, ns, options).expect("client")
}

/// A client with its own connection and sessions, as another process has.
async fn client(config: &EtcdConfig, ns: &str) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    client_of(Arc::new(backend), ns, QUEUE_TTL).await
}

/// Queues waiter `index` on `semaphore` (after the ones before it: its key is the
/// `keys`-th under the namespace) and sends its permit on `granted` once it has one.
async fn queue_waiter(
    admin: &EtcdBackend,
    ns: &str,
    keys: usize,
    index: usize,
    semaphore: Semaphore,
    granted: &mpsc::UnboundedSender<(usize, Permit)>,
) {
    let granted = granted.clone();
    tokio::spawn(async move {
        let permit = semaphore
            .acquire_timeout(Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("waiter {index}: {}", e.display_chain()));
        let _ = granted.send((index, permit));
    });
    support::until_keys(admin, ns, keys, PATIENCE).await;
}

/// The next grant, which must be waiter `expected`'s.
async fn next_grant(
    granted: &mut mpsc::UnboundedReceiver<(usize, Permit)>,
    expected: usize,
) -> Permit {
    match tokio::time::timeout(PATIENCE, granted.recv()).await {
        Ok(Some((index, permit))) => {
            assert_eq!(
                index, expected,
                "waiter {index} was granted where waiter {expected} was next in the queue"
            );
            permit
        }
        Ok(None) => panic!("the waiters are gone"),
        Err(_) => panic!("waiter {expected} was not granted after a permit was freed for it"),
    }
}

/// Not a test on its own: the holder process of
/// `a_killed_holders_permits_are_free_after_its_ttl`, which runs this test binary with
/// [`CHILD_NAMESPACE`] set. It takes both permits, says `HELD` and waits to be killed.
/// It stays in the binary's root: that test runs it as `--exact holder_process`, which the
/// path of a test in a module would not match.
#[tokio::test]
async fn holder_process() {
    let Ok(ns) = std::env::var(CHILD_NAMESPACE) else {
        return;
    };
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client_of(Arc::new(backend), &ns, TTL).await;
    let pool = holder.semaphore("killed", 2).expect("semaphore");
    let permits = [
        pool.acquire().await.expect("permit"),
        pool.acquire().await.expect("permit"),
    ];
    println!("HELD");
    tokio::time::sleep(Duration::from_secs(300)).await;
    drop(permits);
}
