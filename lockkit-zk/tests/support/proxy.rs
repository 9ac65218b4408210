//! A TCP proxy that can blackhole a client's connections (`#[path]`-included by the tests
//! that need it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP proxy in front of each server of the ensemble, whose traffic can be dropped in
/// both directions while the sockets stay open: to the client and to the servers it looks
/// like a dead network, not a closed connection.
pub(crate) struct Proxy {
    hosts: Vec<String>,
    blackholed: Arc<AtomicBool>,
    replies_dropped: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts listening on a loopback port for each of `upstreams`.
    pub(crate) async fn start(upstreams: &[String]) -> Proxy {
        let blackholed = Arc::new(AtomicBool::new(false));
        let replies_dropped = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let mut hosts = Vec::new();
        let mut tasks = Vec::new();
        for upstream in upstreams {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            hosts.push(listener.local_addr().expect("addr").to_string());
            let (upstream, blackholed, replies_dropped, connections) = (
                upstream.clone(),
                blackholed.clone(),
                replies_dropped.clone(),
                connections.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    let requests = tokio::spawn(pump(in_read, out_write, blackholed.clone(), None));
                    let replies = tokio::spawn(pump(
                        out_read,
                        in_write,
                        blackholed.clone(),
                        Some(replies_dropped.clone()),
                    ));
                    connections
                        .lock()
                        .expect("connections")
                        .extend([requests, replies]);
                }
            }));
        }
        Proxy {
            hosts,
            blackholed,
            replies_dropped,
            tasks,
            connections,
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

    /// Closes every connection made so far (new ones are accepted), as a restarting server
    /// or a middlebox that resets its flows would.
    pub(crate) fn reset_connections(&self) {
        for connection in self.connections.lock().expect("connections").drain(..) {
            connection.abort();
        }
    }

    /// Drops (or passes again) only what the servers send: requests still arrive and take
    /// effect, their replies are lost.
    #[allow(
        dead_code,
        reason = "every test binary compiles this file; only tests/backend.rs drops replies"
    )]
    pub(crate) fn set_replies_dropped(&self, on: bool) {
        self.replies_dropped.store(on, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.reset_connections();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    blackholed: Arc<AtomicBool>,
    also_dropped_when: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let dropped = blackholed.load(Ordering::SeqCst)
                    || also_dropped_when
                        .as_ref()
                        .is_some_and(|flag| flag.load(Ordering::SeqCst));
                if !dropped && to.write_all(&buf[..n]).await.is_err() {
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
