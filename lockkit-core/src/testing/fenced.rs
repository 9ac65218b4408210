//! A fenced resource: a tiny storage service that keeps the highest fencing token it has
//! seen per key and refuses writes made with an older one, logging both.
//!
//! It runs in the test process and listens on loopback, so that worker processes write to
//! it over TCP the way a real service would be written to. The protocol is one line per
//! write, `WRITE <process> <key> <token>`, answered `STORED` or `REFUSED <highest>`.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::history::{Event, What, monotonic_ns};

#[derive(Debug, Default)]
struct Store {
    highest: HashMap<String, u64>,
    log: Vec<Event>,
}

/// The resource's server side. Dropping it stops the server.
#[derive(Debug)]
pub struct FencedResource {
    address: String,
    store: Arc<Mutex<Store>>,
    server: JoinHandle<()>,
}

impl FencedResource {
    /// Starts the resource on a fresh loopback port.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start() -> io::Result<FencedResource> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let store = Arc::new(Mutex::new(Store::default()));
        let shared = store.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(FencedResource {
            address,
            store,
            server,
        })
    }

    /// The `host:port` writers connect to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Writes to `key` with `token` on behalf of `process`; `true` if stored.
    pub fn write(&self, process: &str, key: &str, token: u64) -> bool {
        apply(&self.store, process, key, token)
    }

    /// The stored and refused writes so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .log
            .clone()
    }
}

impl Drop for FencedResource {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn apply(store: &Mutex<Store>, process: &str, key: &str, token: u64) -> bool {
    let mut store = store.lock().unwrap_or_else(PoisonError::into_inner);
    let highest = store.highest.entry(key.to_owned()).or_insert(0);
    let what = if token >= *highest {
        *highest = token;
        What::Stored { token }
    } else {
        What::Refused {
            token,
            highest: *highest,
        }
    };
    let stored = matches!(what, What::Stored { .. });
    store.log.push(Event {
        at_ns: monotonic_ns(),
        process: process.to_owned(),
        key: key.to_owned(),
        what,
    });
    stored
}

async fn serve(stream: TcpStream, store: Arc<Mutex<Store>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match line.split(' ').collect::<Vec<_>>().as_slice() {
            ["WRITE", process, key, token] => match token.parse() {
                Ok(token) if apply(&store, process, key, token) => "STORED".to_owned(),
                Ok(_) => {
                    let store = store.lock().unwrap_or_else(PoisonError::into_inner);
                    format!("REFUSED {}", store.highest.get(*key).copied().unwrap_or(0))
                }
                Err(_) => "ERROR bad token".to_owned(),
            },
            _ => "ERROR expected WRITE <process> <key> <token>".to_owned(),
        };
        if write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A writer's connection to a [`FencedResource`].
#[derive(Debug)]
pub struct FencedClient {
    process: String,
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl FencedClient {
    /// Connects `process` to the resource at `address`.
    ///
    /// # Errors
    /// When the resource cannot be reached, or `process` contains whitespace.
    pub async fn connect(address: &str, process: &str) -> io::Result<FencedClient> {
        if process.contains(char::is_whitespace) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a process name without whitespace",
            ));
        }
        let (read, write) = TcpStream::connect(address).await?.into_split();
        Ok(FencedClient {
            process: process.to_owned(),
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    /// Writes to `key` with `token`: `Ok(true)` if stored, `Ok(false)` if refused as stale.
    ///
    /// # Errors
    /// When the resource cannot be reached, answers nonsense, or `key` contains whitespace.
    pub async fn write(&mut self, key: &str, token: u64) -> io::Result<bool> {
        if key.contains(char::is_whitespace) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a key without whitespace",
            ));
        }
        self.write
            .write_all(format!("WRITE {} {key} {token}\n", self.process).as_bytes())
            .await?;
        match self.lines.next_line().await? {
            Some(line) if line == "STORED" => Ok(true),
            Some(line) if line.starts_with("REFUSED ") => Ok(false),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the fenced resource answered {other:?}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn keeps_the_highest_token_and_refuses_older_ones() {
        let resource = FencedResource::start().await.expect("resource");
        let mut a = FencedClient::connect(resource.address(), "a")
            .await
            .expect("a");
        let mut b = FencedClient::connect(resource.address(), "b")
            .await
            .expect("b");
        assert!(a.write("k", 5).await.expect("write"));
        assert!(a.write("k", 5).await.expect("write"));
        assert!(b.write("k", 7).await.expect("write"));
        assert!(!a.write("k", 5).await.expect("write"));
        assert!(a.write("other", 1).await.expect("write"));
        let refused: Vec<_> = resource
            .events()
            .into_iter()
            .filter(|e| matches!(e.what, What::Refused { .. }))
            .map(|e| (e.process, e.key, e.what))
            .collect();
        assert_eq!(
            refused,
            vec![(
                "a".to_owned(),
                "k".to_owned(),
                What::Refused {
                    token: 5,
                    highest: 7
                }
            )]
        );
        assert!(a.write("with space", 9).await.is_err());
    }
}
