//! What the ZooKeeper tests share: the ensemble's address, a raw admin client, and a TCP
//! proxy that can blackhole a client's connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockkit_core::testing::{backend_missing, endpoint};
use lockkit_zk::ZkConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use zookeeper_client as zk;

/// The chroot every test works under (the auth tests use their own).
pub(crate) const TEST_CHROOT: &str = "/lockkit-test";

/// The ensemble's configuration from `LOCKKIT_TEST_ZK_URL`, with short sessions for quick
/// tests; `None` (after `backend_missing`) when the ensemble is not up.
pub(crate) fn test_config() -> Option<ZkConfig> {
    let Some(url) = endpoint("LOCKKIT_TEST_ZK_URL") else {
        backend_missing("the ZooKeeper ensemble (LOCKKIT_TEST_ZK_URL)");
        return None;
    };
    let mut config = ZkConfig::from_url(&url).expect("LOCKKIT_TEST_ZK_URL");
    config.chroot = TEST_CHROOT.to_owned();
    config.session_timeout = Duration::from_secs(4);
    Some(config)
}

/// A raw client of the ensemble, rooted at `chroot` (created when missing).
pub(crate) async fn admin(config: &ZkConfig, chroot: &str) -> zk::Client {
    let connector = match (&config.username, &config.password) {
        (Some(user), Some(password)) => {
            zk::Client::connector().with_auth("digest", format!("{user}:{password}").as_bytes())
        }
        _ => zk::Client::connector(),
    };
    let client = connector
        .with_session_timeout(Duration::from_secs(10))
        .connect(&config.hosts.join(","))
        .await
        .expect("admin client");
    let acls = if config.username.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    };
    client
        .mkdir(chroot, &zk::CreateMode::Persistent.with_acls(acls))
        .await
        .expect("chroot");
    client.chroot(chroot).expect("chroot path")
}

/// Every znode under `/{namespace}`: key parents and lock nodes.
pub(crate) async fn znodes_under(
    admin: &zk::Client,
    namespace: &str,
) -> std::result::Result<Vec<String>, zk::Error> {
    let root = format!("/{namespace}");
    let parents = match admin.list_children(&root).await {
        Ok(parents) => parents,
        Err(zk::Error::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for parent in parents {
        let path = format!("{root}/{parent}");
        match admin.list_children(&path).await {
            Ok(children) => found.extend(children.iter().map(|c| format!("{path}/{c}"))),
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(e),
        }
        found.push(path);
    }
    Ok(found)
}

/// A TCP proxy in front of each server of the ensemble, whose traffic can be dropped in
/// both directions while the sockets stay open: to the client and to the servers it looks
/// like a dead network, not a closed connection.
pub(crate) struct Proxy {
    hosts: Vec<String>,
    blackholed: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Starts listening on a loopback port for each of `upstreams`.
    pub(crate) async fn start(upstreams: &[String]) -> Proxy {
        let blackholed = Arc::new(AtomicBool::new(false));
        let mut hosts = Vec::new();
        let mut tasks = Vec::new();
        for upstream in upstreams {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            hosts.push(listener.local_addr().expect("addr").to_string());
            let (upstream, blackholed) = (upstream.clone(), blackholed.clone());
            tasks.push(tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::spawn(pump(in_read, out_write, blackholed.clone()));
                    tokio::spawn(pump(out_read, in_write, blackholed.clone()));
                }
            }));
        }
        Proxy {
            hosts,
            blackholed,
            tasks,
        }
    }

    /// The proxy's addresses, in the order of the upstreams.
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.hosts.clone()
    }

    /// Drops (or passes again) all traffic through the proxy.
    pub(crate) fn set_blackholed(&self, on: bool) {
        self.blackholed.store(on, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    blackholed: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !blackholed.load(Ordering::SeqCst) && to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    // While blackholed a closing side stays silent, as a dead network would.
    if !blackholed.load(Ordering::SeqCst) {
        let _ = to.shutdown().await;
    }
}
