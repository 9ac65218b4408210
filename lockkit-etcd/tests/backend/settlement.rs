//! A cancelled attempt's put is settled by the session's clean-up (its epoch key), so it
//! cannot land later, and a settled session is not swept again.

use std::time::{Duration, Instant};

use lockkit_core::LockOptions;
use lockkit_core::backend::OwnerToken;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_etcd::etcd_client::{Compare, CompareOp, TxnOp};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

use crate::{client, support};

/// The session's epoch key, as the backend names it.
fn epoch_key(config: &EtcdConfig, lease: i64) -> String {
    format!("{}/../sessions/{lease:016x}", config.prefix)
}

/// Waits (up to 10 s) until the session `lease`'s epoch key was written: its clean-up settled
/// the unanswered attempts.
async fn settled(admin: &EtcdBackend, config: &EtcdConfig, lease: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = admin
            .client()
            .get(epoch_key(config, lease), None)
            .await
            .expect("read the epoch key");
        if let Some(kv) = found.kvs().first() {
            return kv.mod_revision();
        }
        assert!(
            Instant::now() < deadline,
            "the session's unanswered attempt was not settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A cancelled attempt's put can be held up (on a slow link to one member) past every
/// clean-up delete. Were it to land then, it would sit on the session lease, which the backend
/// renews for as long as it lives, and hold the lock for good. The session's clean-up settles
/// it first: it writes the session's epoch key, which every put compares, so the put, as the
/// server sees it (the acquisition's key name absent, the epoch it was sent with), can no
/// longer apply.
///
/// The attempt is cancelled in flight for real (a proxy delays it); its put arriving late is
/// then replayed by an operator client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_held_up_past_its_clean_up_cannot_land_after_the_settlement() {
    let Some(mut config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("lateput");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let direct = config.clone();
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    config.endpoints = proxy.hosts();
    config.request_timeout = Duration::from_secs(1);
    let ttl = Duration::from_secs(2);
    let options = LockOptions::default().with_ttl(ttl);
    let locks = client(&config, &ns, options.clone()).await;
    // The session and the key name its acquisitions of "job" reuse.
    let first = locks.mutex("job").expect("key").lock().await.expect("lock");
    let name = lockkit_core::backend::lease_of(&first)
        .handle()
        .expect("key")
        .to_owned();
    let lease = support::lease_of(&name);
    assert!(first.release().await.expect("release"));

    proxy.set(
        Direction::Requests,
        Fault::Delay {
            base: Duration::from_millis(300),
            jitter: Duration::ZERO,
        },
    );
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        locks.mutex("job").expect("key").lock(),
    )
    .await;
    assert!(cancelled.is_err(), "the attempt was not in flight");
    proxy.heal();
    let epoch = settled(&admin, &direct, lease).await;
    assert!(epoch > 0);
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;

    let late = lockkit_etcd::etcd_client::Txn::new()
        .when([
            Compare::create_revision(name.as_str(), CompareOp::Equal, 0),
            Compare::mod_revision(epoch_key(&direct, lease), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(
            name.as_str(),
            OwnerToken::generate().expect("token").digest_hex(),
            Some(lockkit_etcd::etcd_client::PutOptions::new().with_lease(lease)),
        )]);
    let replayed = admin.client().txn(late).await.expect("the late put");
    assert!(
        !replayed.succeeded(),
        "a put sent before the settlement landed after it"
    );
    support::expect_no_keys(&admin, &ns, Duration::from_secs(1)).await;
    // The session goes on: later attempts put under the new epoch.
    let next = locks
        .mutex("job")
        .expect("key")
        .lock_timeout(Duration::from_secs(5))
        .await
        .expect("a lock after the settlement");
    assert!(next.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

/// How many `LeaseTimeToLive` calls the etcd serving `client_port` has handled.
async fn lease_listings(client_port: u16) -> u64 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", client_port))
        .await
        .expect("the metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("ask for the metrics");
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .await
        .expect("read the metrics");
    body.lines()
        .filter(|line| {
            line.starts_with("grpc_server_handled_total")
                && line.contains("grpc_method=\"LeaseTimeToLive\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Once a session's unanswered attempts are settled, nothing more is done for them: the
/// session's keys are not listed every TTL for the rest of its life (a listing costs as much
/// as the keys on the lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_session_is_not_swept_again() {
    let Some(etcd) = support::private::PrivateEtcd::start("lk-settle", 22100..22120, None) else {
        return;
    };
    let direct = etcd.config();
    let admin = etcd.ready(&direct).await;
    let ns = support::namespace("settle");
    let proxy = FaultProxy::start(&direct.endpoints)
        .await
        .expect("a fault proxy");
    let mut config = direct.clone();
    config.endpoints = proxy.hosts();
    config.request_timeout = Duration::from_secs(1);
    let ttl = Duration::from_secs(2);
    let locks = client(&config, &ns, LockOptions::default().with_ttl(ttl)).await;
    let first = locks.mutex("job").expect("key").lock().await.expect("lock");
    let lease = support::lease_of(
        lockkit_core::backend::lease_of(&first)
            .handle()
            .expect("key"),
    );
    assert!(first.release().await.expect("release"));
    proxy.set(
        Direction::Requests,
        Fault::Delay {
            base: Duration::from_millis(300),
            jitter: Duration::ZERO,
        },
    );
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        locks.mutex("job").expect("key").lock(),
    )
    .await;
    assert!(cancelled.is_err(), "the attempt was not in flight");
    proxy.heal();
    settled(&admin, &direct, lease).await;
    // Past the settlement's own listing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = lease_listings(etcd.client_port).await;
    assert!(before > 0, "the settlement did not list the session's keys");
    tokio::time::sleep(ttl * 3).await;
    let after = lease_listings(etcd.client_port).await;
    assert_eq!(
        after, before,
        "the session's keys were listed again after its attempts were settled"
    );
}
