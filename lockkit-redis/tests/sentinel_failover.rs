//! Sentinel failovers on a private group (primary, replica and one Sentinel).
//!
//! A backend follows a Sentinel's `+switch-master` announcement by itself, before any of its
//! requests fails: while the old primary still answers as a primary, held locks are renewed
//! and new ones granted on the new primary.
//!
//! A failover keeps a semaphore's bound when its holders reached the replica: the
//! promoted replica has the holders (scores, tokens and TTLs as the primary wrote them),
//! refuses a permit too many, and the holders renew there without losing their permits (nor
//! a mutex its lock, nor a read-write lock's writer its grant), once the old primary takes
//! no more writes (the test demotes it at once: the Sentinel takes ~10 s, the split-brain
//! window the crate documents).
//!
//! A grant answered by the old primary after the backend moved is not handed out.
//!
//! The renewals must follow the failover by themselves: a renewal pipeline answered
//! `READONLY` by the demoted primary now makes the backend ask the Sentinels, as any other
//! request's error does (before, the per-command error stayed in the pipeline's replies, the
//! renewals kept going to the old primary, and a backend with nothing but held locks lost
//! them all while the new primary expired them and granted again).
//!
//! It runs on a private group (primary, replica and one Sentinel, on 127.0.0.1, ports
//! 22400-22499, stopped by their PIDs), never on the shared one.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::{LockClient, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig};

const PORTS: std::ops::Range<u16> = 22400..22500;
const MASTER: &str = "lksem";
/// A primary that cannot be demoted: its `REPLICAOF` and `SLAVEOF` renamed away, so it answers
/// as a primary after a failover for as long as the test runs.
const UNDEMOTABLE: &[&str] = &[
    "--rename-command",
    "REPLICAOF",
    "",
    "--rename-command",
    "SLAVEOF",
    "",
];

/// What a private server is.
#[derive(Clone, Copy)]
enum Role {
    Primary,
    ReplicaOf(u16),
    /// A Sentinel (quorum 1) watching the primary on this port.
    SentinelOf(u16),
}

/// A redis-server (or Sentinel) of this test, killed by its PID when dropped.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Server {
    /// Starts `redis-server` as `role` on a free port of [`PORTS`].
    fn start(role: Role) -> Server {
        Server::start_with(role, &[])
    }

    /// As [`Server::start`], with more arguments for a Redis server.
    fn start_with(role: Role, args: &[&str]) -> Server {
        let offset = rand::random::<u16>() % PORTS.len() as u16;
        for i in 0..PORTS.len() as u16 {
            let port = PORTS.start + (offset + i) % PORTS.len() as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("lk-sem-failover-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut command = Command::new("redis-server");
            if let Role::SentinelOf(primary) = role {
                let file = dir.join("sentinel.conf");
                let config = format!(
                    "bind 127.0.0.1\nport {port}\ndir {}\nsentinel monitor {MASTER} 127.0.0.1 {primary} 1\nsentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 3000\n",
                    dir.display()
                );
                std::fs::write(&file, config).unwrap();
                command.arg(&file).arg("--sentinel");
            } else {
                command
                    .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--save", "", "--appendonly", "no"])
                    .args(["--repl-diskless-sync-delay", "0"])
                    .arg("--dir")
                    .arg(&dir)
                    .args(args);
                if let Role::ReplicaOf(primary) = role {
                    command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
                }
            }
            let mut child = command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let by = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // the port was taken meanwhile: the next one
                }
                if common::private::serves(port, child.id()) {
                    return Server { child, port, dir };
                }
                if Instant::now() > by {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the private redis-server on {port} did not answer");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("no free port in {PORTS:?}");
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits up to 30 s for `check` to hold, naming `what` if it never does.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let by = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < by, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn info(addr: &str, section: &str) -> String {
    match common::connect(addr).await {
        Ok(mut con) => redis::cmd("INFO")
            .arg(section)
            .query_async(&mut con)
            .await
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

async fn sentinel_master(sentinel: &str) -> Option<String> {
    let mut con = common::connect(sentinel).await.ok()?;
    let (host, port): (String, String) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER)
        .query_async(&mut con)
        .await
        .ok()?;
    Some(format!("{host}:{port}"))
}

async fn zcard(addr: &str, key: &str) -> i64 {
    let mut con = common::connect(addr).await.unwrap();
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap()
}

/// A primary (started with `primary_args` on top), its replica and a Sentinel watching them,
/// each killed by its PID when dropped.
struct Group {
    primary: Server,
    replica: Server,
    sentinel: Server,
    namespace: String,
}

impl Group {
    /// Starts the group and waits until the replica is linked and the Sentinel knows it;
    /// `None` (after saying so) without a redis-server command.
    async fn start(primary_args: &[&str]) -> Option<Group> {
        if !common::private::redis_server_installed() {
            return None;
        }
        let primary = Server::start_with(Role::Primary, primary_args);
        let replica = Server::start(Role::ReplicaOf(primary.port));
        let sentinel = Server::start(Role::SentinelOf(primary.port));
        let (r, s) = (replica.addr(), sentinel.addr());
        until("the replica's link", || async {
            info(&r, "replication")
                .await
                .contains("master_link_status:up")
        })
        .await;
        until("the Sentinel to know the replica", || async {
            let Ok(mut con) = common::connect(&s).await else {
                return false;
            };
            let replicas: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(MASTER)
                .query_async(&mut con)
                .await;
            replicas.is_ok_and(|r| r.len() == 1)
        })
        .await;
        Some(Group {
            primary,
            replica,
            sentinel,
            namespace: format!("lk-test-{:08x}", rand::random::<u32>()),
        })
    }

    /// The primary's, the replica's and the Sentinel's `host:port`.
    fn addrs(&self) -> (String, String, String) {
        (
            self.primary.addr(),
            self.replica.addr(),
            self.sentinel.addr(),
        )
    }

    /// A client of the group's namespace through its Sentinel, with grants of `ttl`.
    async fn client(&self, ttl: Duration) -> LockClient {
        self.client_with(ttl, |_| ()).await
    }

    /// As [`Group::client`], with the backend's configuration changed by `tune`.
    async fn client_with(&self, ttl: Duration, tune: impl FnOnce(&mut RedisConfig)) -> LockClient {
        let url = format!("redis+sentinel://{}/{MASTER}", self.sentinel.addr());
        let mut config = RedisConfig::from_url(&url).unwrap();
        tune(&mut config);
        let backend = RedisBackend::connect(config).await.unwrap();
        LockClient::with_options(
            Arc::new(backend),
            &self.namespace,
            LockOptions::default().with_ttl(ttl),
        )
        .unwrap()
    }

    /// Makes the Sentinel start a failover (it answers NOGOODSLAVE until it has talked to
    /// the replica itself).
    async fn fail_over(&self) {
        let s = self.sentinel.addr();
        until("the Sentinel to start the failover", || async {
            let Ok(mut con) = common::connect(&s).await else {
                return false;
            };
            let started: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER)
                .query_async(&mut con)
                .await;
            started.is_ok()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_after_the_holders_replicated_keeps_at_most_the_permits() {
    let Some(group) = Group::start(&[]).await else {
        return;
    };
    let (p, r, s) = group.addrs();
    // Long enough to outlast the failover: the holders' copies on the replica are those of
    // their last renewal before the promotion.
    let ttl = Duration::from_secs(15);
    let (a, b, c) = (
        group.client(ttl).await,
        group.client(ttl).await,
        group.client(ttl).await,
    );
    let first = a.semaphore("pool", 2).unwrap().acquire().await.unwrap();
    let second = b.semaphore("pool", 2).unwrap().acquire().await.unwrap();
    // A mutex and a read-write lock's writer held over the failover too: their renewals
    // take the same way.
    let locked = a.mutex("pool").unwrap().lock().await.unwrap();
    let written = b.rwlock("pool").unwrap().write().await.unwrap();
    let holders = format!("{}:sem:holders", common::lock_key(&a.key("pool").unwrap()));
    let writers = format!("{}:rw:holders", common::lock_key(&a.key("pool").unwrap()));
    let lock_key = common::lock_key(&a.key("pool").unwrap());
    until("the holders and the locks on the replica", || async {
        zcard(&r, &holders).await == 2
            && exists(&r, &lock_key).await
            && zcard(&r, &writers).await == 1
    })
    .await;

    group.fail_over().await;
    until("the replica's promotion", || async {
        sentinel_master(&s).await.as_deref() == Some(r.as_str())
            && info(&r, "replication").await.contains("role:master")
    })
    .await;
    assert_eq!(
        zcard(&r, &holders).await,
        2,
        "the promoted replica lost holders"
    );

    // The Sentinel demotes the old primary only after ~10 s here; the holders' backends
    // follow the Sentinel's announcement before that (the next test), but a renewal sent
    // between the promotion and the announcement still lands on the old primary. Demoting it
    // at once, as the test does, makes that impossible: the holders' renewals can only reach
    // the new primary.
    let mut old = common::connect(&p).await.unwrap();
    let (host, port) = r.split_once(':').unwrap();
    let () = redis::cmd("REPLICAOF")
        .arg(host)
        .arg(port)
        .query_async(&mut old)
        .await
        .unwrap();
    until("the old primary's demotion", || async {
        info(&p, "replication").await.contains("role:slave")
    })
    .await;

    let third = c.semaphore("pool", 2).unwrap();
    // Past the TTL: the holders' copies on the promoted replica live on only by renewals
    // that reached it.
    let watch_until = Instant::now() + ttl + Duration::from_secs(1);
    while Instant::now() < watch_until {
        if let Ok(Some(granted)) = third.try_acquire().await {
            panic!(
                "a third permit of two was granted after the failover (token {}): the holders' renewals did not reach the new primary",
                granted.fencing_token()
            );
        }
        assert!(zcard(&r, &holders).await <= 2, "more holders than permits");
        if let Ok(Some(read)) = c.rwlock("pool").unwrap().try_read().await {
            panic!(
                "a reader was granted beside the writer after the failover (token {}): the writer's renewals did not reach the new primary",
                read.fencing_token()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!locked.is_lost(), "the mutex was lost over the failover");
    assert!(
        locked.is_held().await.unwrap(),
        "the new primary does not have the lock"
    );
    assert!(locked.release().await.unwrap());
    assert!(
        !written.is_lost(),
        "the write lock was lost over the failover"
    );
    assert!(
        written.is_held().await.unwrap(),
        "the new primary does not have the write lock"
    );
    assert!(written.release().await.unwrap());
    assert!(
        !first.is_lost(),
        "a holder lost its permit over the failover"
    );
    assert!(
        !second.is_lost(),
        "a holder lost its permit over the failover"
    );
    // A request may fail once on the old primary (READONLY) while the client finds the new.
    let mut held = first.is_held().await;
    let by = Instant::now() + Duration::from_secs(10);
    while held.is_err() && Instant::now() < by {
        tokio::time::sleep(Duration::from_millis(100)).await;
        held = first.is_held().await;
    }
    assert!(held.unwrap(), "the new primary does not count a holder");
    assert!(first.release().await.unwrap());
    let granted = tokio::time::timeout(Duration::from_secs(10), third.acquire())
        .await
        .expect("no permit after a release on the new primary")
        .unwrap();
    assert!(granted.fencing_token() > second.fencing_token());
    assert!(granted.release().await.unwrap());
    assert!(second.release().await.unwrap());
    drop(group);
}

/// A backend follows the Sentinel's `+switch-master` announcement without a failed request.
/// The old primary here cannot be demoted (its `REPLICAOF` and `SLAVEOF` are renamed away), so
/// it answers as a primary for as long as the test runs, as an old primary does until the
/// Sentinels reach it (about 10 s on the compose topology, longer when failovers flap). A
/// backend that moved only when a request failed would renew its lock there all along while
/// the new primary expired it and granted it to another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_follows_the_announcement_while_the_old_primary_still_answers() {
    let Some(group) = Group::start(UNDEMOTABLE).await else {
        return;
    };
    let (p, r, s) = group.addrs();
    // Renewed every 5 s: the copy the replica has at its promotion lives 10 s or more, time
    // enough for the announcement and the next renewal, on a busy machine too.
    let ttl = Duration::from_secs(15);
    let a = group.client(ttl).await;
    let held = a.mutex("held").unwrap().lock().await.unwrap();
    let held_key = common::lock_key(&a.key("held").unwrap());
    until("the lock on the replica", || async {
        exists(&r, &held_key).await
    })
    .await;

    group.fail_over().await;
    until("the announcement", || async {
        sentinel_master(&s).await.as_deref() == Some(r.as_str())
    })
    .await;
    assert!(
        info(&p, "replication").await.contains("role:master"),
        "the old primary was demoted: the test shows nothing"
    );

    // `a` sent nothing since the failover, and no request of it will fail: its grants reach
    // the new primary only if it followed the announcement (within the few milliseconds it
    // takes to check the new primary's role and connect, a grant may still land on the old).
    let mut probes = 0;
    until("a grant of the old client on the new primary", || {
        probes += 1;
        let (a, r) = (&a, &r);
        async move {
            let name = format!("probe-{probes}");
            let Ok(Some(guard)) = a.mutex(&name).unwrap().try_lock().await else {
                return false;
            };
            let key = common::lock_key(&a.key(&name).unwrap());
            let on_new = exists(r, &key).await;
            assert!(guard.release().await.unwrap());
            on_new
        }
    })
    .await;

    // The held lock is renewed on the new primary: nobody gets it there, past its TTL.
    let b = group.client(ttl).await;
    let watch_until = Instant::now() + ttl + Duration::from_secs(1);
    while Instant::now() < watch_until {
        if let Ok(Some(granted)) = b.mutex("held").unwrap().try_lock().await {
            panic!(
                "the held lock was granted again on the new primary (token {}): its renewals went to the old one",
                granted.fencing_token()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!held.is_lost(), "the lock was lost over the failover");
    assert!(held.release().await.unwrap());
    drop(group);
}

/// An acquire in flight on the old primary when the backend follows the announcement (the
/// old primary holds its writes back with `CLIENT PAUSE WRITE`, and cannot be demoted) is
/// answered by that primary with a grant once it resumes. That grant is the old primary's:
/// the new one does not know it and would grant the lock to another client. It is not handed
/// out: the acquisition returns a grant made on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_old_primary_makes_after_the_move_is_not_handed_out() {
    let Some(group) = Group::start(UNDEMOTABLE).await else {
        return;
    };
    let (p, r, s) = group.addrs();
    let pause = Duration::from_secs(8);
    // The acquire waits on the paused primary without timing out.
    let a = group
        .client_with(Duration::from_secs(15), |config| {
            config.response_timeout = pause * 2;
        })
        .await;
    let warm = a.mutex("warm").unwrap().lock().await.unwrap();
    assert!(warm.release().await.unwrap());

    let mut admin = common::connect(&p).await.unwrap();
    let paused_at = Instant::now();
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause.as_millis() as u64)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let raced = a.mutex("raced").unwrap();
    let acquiring = tokio::spawn(async move { raced.lock().await });
    group.fail_over().await;
    until("the announcement", || async {
        sentinel_master(&s).await.as_deref() == Some(r.as_str())
    })
    .await;
    // The backend follows within a few milliseconds of the announcement; the old primary is
    // still paused, the acquire still in flight there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        paused_at.elapsed() < pause && !acquiring.is_finished(),
        "the failover outlasted the pause ({:?}): the test shows nothing",
        paused_at.elapsed()
    );

    let guard = tokio::time::timeout(pause * 3, acquiring)
        .await
        .expect("the acquisition never ended")
        .unwrap()
        .unwrap();
    let key = common::lock_key(&a.key("raced").unwrap());
    assert!(
        info(&p, "replication").await.contains("role:master"),
        "the old primary was demoted: the test shows nothing"
    );
    assert!(
        exists(&r, &key).await,
        "the grant handed out is not on the new primary: the old primary's was handed out"
    );
    assert!(guard.release().await.unwrap());
    drop(group);
}

async fn exists(addr: &str, key: &str) -> bool {
    let mut con = common::connect(addr).await.unwrap();
    redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap()
}
