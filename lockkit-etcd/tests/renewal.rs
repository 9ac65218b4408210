//! Renewal ticks against a private member: how many round trips one `renew_many` takes.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::{Lease, LockBackend, Renewal, lease_of};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockOptions};
use lockkit_etcd::EtcdBackend;
use support::private::PrivateEtcd;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The member's count of `Txn` calls it has handled (`/metrics`, read past the proxy).
async fn txns_handled(port: u16) -> u64 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the member");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .expect("ask for the metrics");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{") && l.contains("grpc_method=\"Txn\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// 300 leases are three transactions of reads (etcd takes at most 128 operations in one):
/// all three reach the server while no answer can come back, so a tick waits for one round
/// trip, not three one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_sends_every_transaction_before_the_first_answer() {
    let Some(etcd) = PrivateEtcd::start("lk-renew", 21850..21870, None) else {
        return;
    };
    let direct = etcd.config();
    etcd.ready(&direct).await;
    let proxy = FaultProxy::start(&direct.endpoints)
        .await
        .expect("a fault proxy");
    let mut config = direct.clone();
    config.endpoints = proxy.hosts();
    config.request_timeout = Duration::from_secs(10);
    let backend = EtcdBackend::connect(config).await.expect("connect");
    let locks = LockClient::with_options(
        Arc::new(backend.clone()),
        "renewal",
        LockOptions::default().with_ttl(Duration::from_secs(30)),
    )
    .expect("client");
    let mut guards = Vec::new();
    for i in 0..300 {
        let mutex = locks.mutex(&format!("held-{i}")).expect("key");
        guards.push(mutex.lock().await.expect("lock"));
    }
    let leases: Vec<Lease> = guards.iter().map(|g| lease_of(g).clone()).collect();

    let before = txns_handled(etcd.client_port).await;
    proxy.set(Direction::Replies, Fault::Pause);
    let tick = tokio::spawn({
        let backend = backend.clone();
        async move { backend.renew_many(&leases).await }
    });
    // Generous: the three reads take milliseconds; one after the other, only the first
    // would ever be handled while the replies are held back.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut handled = 0;
    while Instant::now() < deadline {
        handled = txns_handled(etcd.client_port).await - before;
        if handled >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.heal();
    assert_eq!(
        handled, 3,
        "transactions of the tick handled before any answer came back"
    );
    let answers = tick.await.expect("the tick");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Renewal::Extended(_)))),
        "{answers:?}"
    );
    for guard in guards {
        assert!(guard.release().await.expect("release"));
    }
}
