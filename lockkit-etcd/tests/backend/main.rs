//! etcd-specific behaviour against the compose cluster, none of which disturbs the cluster:
//! sessions lost by revocation and by a dead link, the waiting queue, fenced writes.
//! One test binary, its tests in modules by topic; the helpers they share are here.

#[path = "../support/mod.rs"]
mod support;

mod lock_keys;
mod release_retry;
mod session_loss;
mod settlement;
mod waiting_queue;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::{LockClient, LockOptions, MutexGuard};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

async fn client(config: &EtcdConfig, namespace: &str, options: LockOptions) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    LockClient::with_options(Arc::new(backend), namespace, options).expect("client")
}

type Waiting = tokio::task::JoinHandle<lockkit_core::Result<(MutexGuard, Instant)>>;

/// `holder` takes "job"; `waiter` queues for it and reports when it is granted.
async fn hold_with_a_waiter(holder: &LockClient, waiter: LockClient) -> (MutexGuard, Waiting) {
    let held = holder
        .mutex("job")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .mutex("job")?
            .lock_timeout(Duration::from_secs(30))
            .await?;
        Ok((guard, Instant::now()))
    });
    (held, waiting)
}
