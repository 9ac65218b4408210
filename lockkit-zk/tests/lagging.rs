//! Clean-up against a server that lags behind the leader: a private ensemble (two
//! participants and an observer whose link to the leader goes through a fault proxy) on
//! ports 21400-21499, stopped by its PIDs when the test ends, also when it fails.

#[allow(dead_code)] // the helpers the other test files need too
mod support;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockkit_core::LockKey;
use lockkit_core::backend::{AcquireRequest, LockBackend, OwnerToken};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_zk::{ZkBackend, ZkConfig};
use nix::sys::signal::Signal;
use support::server::{CLASSPATH, QUORUM_PEER, ZkServer, installed, srvr};
use zookeeper_client as zk;

/// How many commits the observer's link holds back before the create.
const FLOOD: usize = 10_000;
const CLIENT: [u16; 3] = [21401, 21402, 21403];
const QUORUM: [u16; 3] = [21411, 21412, 21413];
const ELECTION: [u16; 3] = [21421, 21422, 21423];

/// Servers 1 and 2 vote; server 3 is an observer that reaches them through `link`.
struct Ensemble {
    servers: Vec<ZkServer>,
    dir: PathBuf,
    link: FaultProxy,
}

impl Ensemble {
    async fn start() -> Option<Ensemble> {
        if !installed() {
            return None;
        }
        for port in CLIENT.iter().chain(&QUORUM).chain(&ELECTION) {
            assert!(
                TcpListener::bind(("127.0.0.1", *port)).is_ok(),
                "port {port} of the private ensemble is taken"
            );
        }
        let upstreams = [
            format!("127.0.0.1:{}", QUORUM[0]),
            format!("127.0.0.1:{}", QUORUM[1]),
        ];
        let link = FaultProxy::start(&upstreams).await.expect("a fault proxy");
        let proxied: Vec<u16> = link
            .hosts()
            .iter()
            .map(|h| h.rsplit(':').next().expect("port").parse().expect("port"))
            .collect();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("zk-lagging");
        let _ = std::fs::remove_dir_all(&dir);
        let mut ensemble = Ensemble {
            servers: Vec::new(),
            dir,
            link,
        };
        for id in 1..=3usize {
            let data = ensemble.dir.join(format!("z{id}"));
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{id}\n")).expect("myid");
            let quorum = if id == 3 {
                [proxied[0], proxied[1]]
            } else {
                [QUORUM[0], QUORUM[1]]
            };
            let config = format!(
                "tickTime=500\ninitLimit=20\nsyncLimit=10\nminSessionTimeout=1000\n\
                 maxSessionTimeout=60000\ndataDir={data}\nclientPortAddress=127.0.0.1\n\
                 clientPort={client}\nadmin.enableServer=false\nforceSync=no\n\
                 4lw.commands.whitelist=srvr\n{peer}\
                 server.1=127.0.0.1:{q1}:{e1}\nserver.2=127.0.0.1:{q2}:{e2}\n\
                 server.3=127.0.0.1:{q3}:{e3}:observer\n",
                data = data.display(),
                client = CLIENT[id - 1],
                peer = if id == 3 { "peerType=observer\n" } else { "" },
                q1 = quorum[0],
                q2 = quorum[1],
                q3 = QUORUM[2],
                e1 = ELECTION[0],
                e2 = ELECTION[1],
                e3 = ELECTION[2],
            );
            ensemble
                .servers
                .push(ZkServer::start(&data, &config, QUORUM_PEER, CLASSPATH));
        }
        let by = Instant::now() + Duration::from_secs(60);
        for port in CLIENT {
            while !srvr(port).contains("Mode: ") {
                assert!(
                    Instant::now() < by,
                    "the private ensemble did not form within 60 s"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Some(ensemble)
    }

    fn hosts(&self) -> Vec<String> {
        CLIENT.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for server in &mut self.servers {
            server.stop(Signal::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A create whose reply is lost commits on the leader; the client then moves to a server
/// that has not applied it yet (an observer whose link held back a burst of commits) and
/// cleans up there. A clean-up listing that missed the node would leave it to appear a
/// moment later, owned by the client's session, holding the lock for as long as that lives.
///
/// On ZooKeeper 3.8 this does not happen even with a plain listing: the session's
/// revalidation reaches the observer behind the held-back commits, and the observer serves
/// the listing only after applying what it had received (checked against the code before
/// the clean-up synced: it passed too). The clean-up syncs with the leader anyway, which
/// does not rest on that ordering; this test keeps the case covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_a_lagging_server_shows_late_is_swept() {
    let Some(ensemble) = Ensemble::start().await else {
        return;
    };
    let hosts = ensemble.hosts();
    let leader_side = FaultProxy::start(&hosts[..2]).await.expect("a fault proxy");
    let observer_side = FaultProxy::start(&hosts[2..]).await.expect("a fault proxy");
    let mut config = ZkConfig::default();
    config.hosts = leader_side.hosts();
    config.hosts.extend(observer_side.hosts());
    config.chroot = "/lockkit-lagging".to_owned();
    config.session_timeout = Duration::from_secs(6);
    config.request_timeout = Duration::from_secs(2);
    // First on the voting servers.
    observer_side.set(Direction::Both, Fault::Blackhole);
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    observer_side.heal();
    let admin = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&hosts[1])
        .await
        .expect("admin");
    let ns = format!("lk-lag-{:08x}", rand::random::<u32>());
    let key = LockKey::new(&ns, "job").expect("key");
    let parent = format!("/lockkit-lagging/{ns}/job");
    let keep = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    admin
        .mkdir(&format!("{parent}/keep-parent"), &keep)
        .await
        .expect("the lock's parent");
    admin.mkdir("/flood", &keep).await.expect("flood parent");

    // The observer's link holds back everything the leader sends it from here on.
    ensemble.link.set(Direction::Replies, Fault::Pause);
    let names: Vec<String> = (0..FLOOD).map(|i| format!("/flood/n{i}")).collect();
    let flood: Vec<_> = names
        .iter()
        .map(|name| admin.create(name, &[], &keep))
        .collect();
    for created in futures_util::future::join_all(flood).await {
        created.expect("flood");
    }
    let request = AcquireRequest::new(
        key,
        OwnerToken::generate().expect("token"),
        Duration::from_secs(10),
        true,
    );
    leader_side.set(Direction::Replies, Fault::Drop);
    let attempt = tokio::spawn({
        let backend = backend.clone();
        let request = request.clone();
        async move { backend.try_acquire(&request).await }
    });
    let by = Instant::now() + Duration::from_secs(10);
    while !admin
        .list_children(&parent)
        .await
        .expect("list")
        .iter()
        .any(|c| c.contains("-lock-"))
    {
        assert!(Instant::now() < by, "the create never reached the leader");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The client moves to the observer; the burst and the session's revalidation reach
    // it together, and the clean-up's listing is served while it applies the burst.
    // Closing the proxy resets the connection and refuses new ones: the client goes on to
    // the observer at once.
    drop(leader_side);
    let _ = attempt.await;
    let abandoning = tokio::spawn({
        let backend = backend.clone();
        let request = request.clone();
        async move { backend.abandon(&request).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    ensemble.link.heal();
    let _ = abandoning.await.expect("join");

    let by = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<String> = admin
            .list_children(&parent)
            .await
            .expect("list")
            .into_iter()
            .filter(|c| c.contains("-lock-"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < by,
            "the late create was left behind, holding the lock: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(backend);
}
