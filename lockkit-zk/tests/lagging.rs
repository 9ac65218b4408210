//! Clean-up against a server that lags behind the leader: a private ensemble (two
//! participants and an observer whose link to the leader goes through a fault proxy) on
//! ports 21400-21499, stopped by its PIDs when the test ends, also when it fails.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::testing::{self};
use lockkit_core::{AcquireRequest, LockBackend, LockKey, OwnerToken};
use lockkit_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
/// How many commits the observer's link holds back before the create.
const FLOOD: usize = 10_000;
const CLIENT: [u16; 3] = [21401, 21402, 21403];
const QUORUM: [u16; 3] = [21411, 21412, 21413];
const ELECTION: [u16; 3] = [21421, 21422, 21423];

/// Servers 1 and 2 vote; server 3 is an observer that reaches them through `link`.
struct Ensemble {
    children: Vec<Child>,
    dir: PathBuf,
    link: FaultProxy,
}

impl Ensemble {
    async fn start() -> Option<Ensemble> {
        let installed = Path::new(ZOOKEEPER_JAR).is_file()
            && Command::new("java")
                .arg("-version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if !installed {
            testing::backend_missing("ZooKeeper (java and /usr/share/java/zookeeper.jar)");
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
            children: Vec::new(),
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
            std::fs::write(data.join("zoo.cfg"), config).expect("zoo.cfg");
            let log = std::fs::File::create(data.join("zk.log")).expect("log");
            let child = Command::new("java")
                .args([
                    "-Xms32m",
                    "-Xmx128m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-XX:-UsePerfData",
                    "-Djava.net.preferIPv4Stack=true",
                    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                    "-cp",
                    CLASSPATH,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                ])
                .arg(data.join("zoo.cfg"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start java");
            ensemble.children.push(child);
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
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `srvr` four-letter word's answer, or "" when the server does not answer.
fn srvr(port: u16) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(b"srvr");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
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
