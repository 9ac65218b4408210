//! A TCP fault proxy: placed between clients and servers (or between cluster members), it
//! passes, delays, drops or holds back their traffic, switchable while connections are open.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the proxy does to the bytes flowing in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything at once.
    Pass,
    /// Forward everything, each chunk `base` plus a uniform random part of `jitter` late, in
    /// order.
    Delay {
        /// The delay every chunk gets.
        base: Duration,
        /// The upper bound of the random extra delay per chunk.
        jitter: Duration,
    },
    /// Read and discard: the sender sees its writes succeed, the receiver hears nothing, and
    /// the connection stays open.
    Drop,
    /// [`Fault::Drop`] for the bytes of open connections; a new connection is accepted but
    /// never reaches the server. Peers that close are not told to the other side: to both
    /// ends it looks like a dead network.
    Blackhole,
    /// Stop reading: the bytes wait in the kernel's buffers (the sender blocks once they are
    /// full) and flow again, nothing lost, when the fault is lifted.
    Pause,
}

/// Which way a [`Fault`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: requests.
    Requests,
    /// Server to client: replies.
    Replies,
    /// Both ways.
    Both,
}

/// A loopback TCP proxy in front of one or more upstream servers (one listening port each).
///
/// Faults apply to every connection through the proxy, open or new. Dropping the proxy
/// closes its ports and every connection through it.
#[derive(Debug)]
pub struct FaultProxy {
    hosts: Vec<String>,
    requests: watch::Sender<Fault>,
    replies: watch::Sender<Fault>,
    listeners: Vec<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl FaultProxy {
    /// Starts listening on a fresh loopback port for each of `upstreams` (`host:port`),
    /// passing traffic through.
    ///
    /// # Errors
    /// When a loopback port cannot be bound.
    pub async fn start(upstreams: &[String]) -> io::Result<FaultProxy> {
        let (requests, _) = watch::channel(Fault::Pass);
        let (replies, _) = watch::channel(Fault::Pass);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let mut proxy = FaultProxy {
            hosts: Vec::new(),
            requests,
            replies,
            listeners: Vec::new(),
            connections,
        };
        for upstream in upstreams {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            proxy.hosts.push(listener.local_addr()?.to_string());
            let (upstream, requests, replies, connections) = (
                upstream.clone(),
                proxy.requests.subscribe(),
                proxy.replies.subscribe(),
                proxy.connections.clone(),
            );
            proxy.listeners.push(tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let link = tokio::spawn(link(
                        inbound,
                        upstream.clone(),
                        requests.clone(),
                        replies.clone(),
                    ));
                    let mut open = connections.lock().unwrap_or_else(PoisonError::into_inner);
                    open.retain(|task: &JoinHandle<()>| !task.is_finished());
                    open.push(link);
                }
            }));
        }
        Ok(proxy)
    }

    /// The proxy's `host:port` addresses, in the order of the upstreams.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.clone()
    }

    /// Applies `fault` to the traffic in `direction` (the other direction is left as it is).
    pub fn set(&self, direction: Direction, fault: Fault) {
        if direction != Direction::Replies {
            self.requests.send_replace(fault);
        }
        if direction != Direction::Requests {
            self.replies.send_replace(fault);
        }
    }

    /// Passes all traffic again.
    pub fn heal(&self) {
        self.set(Direction::Both, Fault::Pass);
    }

    /// Resets every open connection (both ends get a TCP RST, as from a middlebox that drops
    /// its flows or a crashed host coming back); new connections are accepted as before.
    pub fn reset(&self) {
        let open = std::mem::take(
            &mut *self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for link in open {
            link.abort();
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        for listener in &self.listeners {
            listener.abort();
        }
        self.reset();
    }
}

/// One proxied connection. Both sockets linger 0, so that aborting this task resets them.
async fn link(
    inbound: TcpStream,
    upstream: String,
    requests: watch::Receiver<Fault>,
    replies: watch::Receiver<Fault>,
) {
    if *requests.borrow() == Fault::Blackhole {
        // Hold the connection open and silent until the link is reset or the proxy dropped.
        let _silent = inbound;
        return std::future::pending::<()>().await;
    }
    let Ok(outbound) = TcpStream::connect(&upstream).await else {
        return;
    };
    for stream in [&inbound, &outbound] {
        let _ = stream.set_zero_linger();
        let _ = stream.set_nodelay(true);
    }
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let up = pump(in_read, out_write, requests);
    let down = pump(out_read, in_write, replies);
    // One direction ending (a peer closed) ends the other only after it drains.
    tokio::join!(up, down);
}

/// Copies `from` to `to` under the direction's current fault.
async fn pump(mut from: OwnedReadHalf, to: OwnedWriteHalf, mut fault: watch::Receiver<Fault>) {
    let (delayed, queue) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut last_due = Instant::now();
        loop {
            while *fault.borrow_and_update() == Fault::Pause {
                if fault.changed().await.is_err() {
                    return;
                }
            }
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
                // A pause set while waiting for bytes must stop this read.
                _ = fault.changed() => continue,
            };
            // Bytes read just as a pause began are held back with the rest.
            while *fault.borrow_and_update() == Fault::Pause {
                if fault.changed().await.is_err() {
                    return;
                }
            }
            let now = Instant::now();
            let due = match *fault.borrow() {
                Fault::Pass | Fault::Pause => now,
                Fault::Delay { base, jitter } => now + base + jitter.mul_f64(rand::random::<f64>()),
                Fault::Drop | Fault::Blackhole => continue,
            };
            last_due = last_due.max(due);
            if delayed.send((last_due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        if *fault.borrow() == Fault::Blackhole {
            std::future::pending::<()>().await;
        }
    };
    tokio::join!(read, write_in_order(to, queue));
}

/// Writes what `queue` brings, each chunk at its due time.
async fn write_in_order(
    mut to: OwnedWriteHalf,
    mut queue: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
) {
    while let Some((due, bytes)) = queue.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&bytes).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server; returns its address.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.into_split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    /// Sends `ping` and waits up to `patience` for the echo.
    async fn round_trip(stream: &mut TcpStream, patience: Duration) -> Option<Duration> {
        let started = Instant::now();
        stream.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        match tokio::time::timeout(patience, stream.read_exact(&mut buf)).await {
            Ok(Ok(_)) if &buf == b"ping" => Some(started.elapsed()),
            _ => None,
        }
    }

    async fn proxied() -> (FaultProxy, TcpStream) {
        let proxy = FaultProxy::start(&[echo().await]).await.expect("proxy");
        let stream = TcpStream::connect(&proxy.hosts()[0])
            .await
            .expect("connect");
        (proxy, stream)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn passes_and_delays() {
        let (proxy, mut stream) = proxied().await;
        assert!(
            round_trip(&mut stream, Duration::from_secs(5))
                .await
                .is_some()
        );
        proxy.set(
            Direction::Replies,
            Fault::Delay {
                base: Duration::from_millis(200),
                jitter: Duration::from_millis(50),
            },
        );
        let took = round_trip(&mut stream, Duration::from_secs(5))
            .await
            .expect("a delayed echo");
        assert!(took >= Duration::from_millis(200), "{took:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn drops_and_blackholes() {
        let (proxy, mut stream) = proxied().await;
        proxy.set(Direction::Requests, Fault::Drop);
        assert_eq!(
            round_trip(&mut stream, Duration::from_millis(300)).await,
            None
        );
        proxy.heal();
        assert!(
            round_trip(&mut stream, Duration::from_secs(5))
                .await
                .is_some()
        );
        proxy.set(Direction::Both, Fault::Blackhole);
        let mut fresh = TcpStream::connect(&proxy.hosts()[0])
            .await
            .expect("connect");
        assert_eq!(
            round_trip(&mut fresh, Duration::from_millis(300)).await,
            None
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_pause_holds_bytes_back_and_loses_none() {
        let (proxy, mut stream) = proxied().await;
        proxy.set(Direction::Requests, Fault::Pause);
        assert_eq!(
            round_trip(&mut stream, Duration::from_millis(300)).await,
            None
        );
        proxy.heal();
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf))
            .await
            .expect("the held-back echo")
            .expect("read");
        assert_eq!(&buf, b"ping");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn reset_closes_open_connections() {
        let (proxy, mut stream) = proxied().await;
        assert!(
            round_trip(&mut stream, Duration::from_secs(5))
                .await
                .is_some()
        );
        proxy.reset();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("the reset arrives");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}
