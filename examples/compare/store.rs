//! W2's protected value where services keep it: in the store the lock lives in. Each worker
//! reads the counter and writes it plus one over a connection of its own, inside the lock, as
//! a service would update a row or a key it protects:
//!
//! - Redis tiers: `GET`, then `SET` + 1, on the server that decides the tier's locks (the one
//!   server, the Sentinel primary, the Cluster primary of the counter's slot, Redlock's first
//!   node);
//! - etcd: a range read, then a put;
//! - ZooKeeper: `sync`, `getData`, then `setData` on a persistent node (a worker's
//!   connection may be to a follower that has not applied the previous holder's write yet:
//!   without the `sync` its read could be stale, an update lost with the lock intact);
//! - PostgreSQL: a `SELECT`, then an `UPDATE` to the value read plus one, of a row of the
//!   suite's own table (`postgres_floors.rs`), each committed on its own;
//! - memory: an in-process counter, read, a yield, written (the memory tier has no store).
//!
//! Every contender (lockkit, its floor, its peer) has a counter of its own, read once more at
//! the end: anything short of one increment per grant is a lost update. A slow answer from
//! a loaded server is slow, not a failure: the counter's connections wait 10 s for a reply
//! (redis-rs's default is 500 ms).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::floor_servers::{cluster_primary, sentinel_primary, url_host, url_hosts, zk_with_node};
use crate::floors::BoxError;

/// Where one contender's counter lives.
pub(crate) enum Store {
    Memory(Arc<AtomicU64>),
    Redis {
        host: String,
        key: String,
    },
    #[cfg(feature = "etcd")]
    Etcd {
        hosts: Vec<String>,
        key: String,
    },
    Zk {
        hosts: String,
        path: String,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        config: Box<lockkit::postgres::tokio_postgres::Config>,
        name: String,
    },
}

/// One worker's connection to a [`Store`]'s counter.
pub(crate) enum Counter {
    Memory(Arc<AtomicU64>),
    Redis {
        con: ConnectionManager,
        key: String,
    },
    #[cfg(feature = "etcd")]
    Etcd {
        client: Box<lockkit::etcd::etcd_client::Client>,
        key: String,
    },
    Zk {
        client: zookeeper_client::Client,
        path: String,
    },
    #[cfg(feature = "postgres")]
    Postgres(Box<crate::postgres_floors::Counter>),
}

impl Store {
    /// A counter of its own for `contender` on `target`'s servers (`url`; `None`: memory),
    /// at zero.
    pub(crate) async fn create(
        target: &str,
        url: Option<&str>,
        contender: &str,
    ) -> Result<Store, BoxError> {
        let name = format!("w2-counter-{contender}-{:08x}", rand::random::<u32>());
        let Some(url) = url else {
            return Ok(Store::Memory(Arc::default()));
        };
        let store = match target {
            "redis" | "redis-sentinel" | "redis-cluster" | "redlock-5" => {
                let key = format!("{{compare/{name}}}");
                let host = match target {
                    "redis-sentinel" => sentinel_primary(url).await?,
                    "redis-cluster" => cluster_primary(url, &key).await?,
                    _ => url_host(url)?,
                };
                Store::Redis { host, key }
            }
            #[cfg(feature = "etcd")]
            "etcd-3" => Store::Etcd {
                hosts: url_hosts(url)?,
                key: format!("lockkit-compare/{name}"),
            },
            "zk-3" => {
                let hosts = url_hosts(url)?.join(",");
                let path = format!("/lockkit-compare-{name}");
                zk_with_node(&hosts, &path, b"0").await?;
                return Ok(Store::Zk { hosts, path });
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let config = Box::new(crate::postgres_floors::config(url)?);
                crate::postgres_floors::create_counter(&config, &name).await?;
                return Ok(Store::Postgres { config, name });
            }
            _ => return Err(format!("no store for the target {target:?}").into()),
        };
        store.counter().await?.write(0).await?;
        Ok(store)
    }

    /// A worker's connection to the counter, made before it is timed.
    pub(crate) async fn counter(&self) -> Result<Counter, BoxError> {
        Ok(match self {
            Store::Memory(shared) => Counter::Memory(shared.clone()),
            Store::Redis { host, key } => Counter::Redis {
                con: ConnectionManager::new_with_config(
                    redis::Client::open(format!("redis://{host}"))?,
                    ConnectionManagerConfig::new()
                        .set_response_timeout(Some(Duration::from_secs(10))),
                )
                .await?,
                key: key.clone(),
            },
            #[cfg(feature = "etcd")]
            Store::Etcd { hosts, key } => Counter::Etcd {
                client: Box::new(
                    lockkit::etcd::etcd_client::Client::connect(hosts.clone(), None).await?,
                ),
                key: key.clone(),
            },
            Store::Zk { hosts, path } => Counter::Zk {
                client: zookeeper_client::Client::connect(hosts).await?,
                path: path.clone(),
            },
            #[cfg(feature = "postgres")]
            Store::Postgres { config, name } => Counter::Postgres(Box::new(
                crate::postgres_floors::Counter::connect(config, name).await?,
            )),
        })
    }

    /// The counter's value now.
    pub(crate) async fn value(&self) -> Result<u64, BoxError> {
        self.counter().await?.read().await
    }

    /// Removes the counter.
    pub(crate) async fn clean_up(self) {
        let Ok(counter) = self.counter().await else {
            return;
        };
        match counter {
            Counter::Memory(_) => {}
            Counter::Redis { mut con, key } => {
                let _: redis::RedisResult<i64> =
                    redis::cmd("DEL").arg(&key).query_async(&mut con).await;
            }
            #[cfg(feature = "etcd")]
            Counter::Etcd { mut client, key } => {
                let _ = client.delete(key, None).await;
            }
            Counter::Zk { client, path } => {
                let _ = client.delete(&path, None).await;
            }
            #[cfg(feature = "postgres")]
            Counter::Postgres(counter) => counter.delete().await,
        }
    }
}

impl Counter {
    /// The critical section: reads the counter, writes it plus one.
    pub(crate) async fn increment(&mut self) -> Result<(), BoxError> {
        let seen = self.read().await?;
        self.write(seen + 1).await
    }

    async fn read(&mut self) -> Result<u64, BoxError> {
        Ok(match self {
            Counter::Memory(shared) => {
                let seen = shared.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                seen
            }
            Counter::Redis { con, key } => {
                let value: Option<u64> = redis::cmd("GET").arg(&*key).query_async(con).await?;
                value.unwrap_or(0)
            }
            #[cfg(feature = "etcd")]
            Counter::Etcd { client, key } => {
                let reply = client.get(key.as_str(), None).await?;
                match reply.kvs().first() {
                    Some(kv) => std::str::from_utf8(kv.value())?.parse()?,
                    None => 0,
                }
            }
            Counter::Zk { client, path } => {
                client.sync(path).await?;
                let (data, _) = client.get_data(path).await?;
                std::str::from_utf8(&data)?.parse()?
            }
            #[cfg(feature = "postgres")]
            Counter::Postgres(counter) => counter.read().await?,
        })
    }

    async fn write(&mut self, value: u64) -> Result<(), BoxError> {
        match self {
            Counter::Memory(shared) => shared.store(value, Ordering::SeqCst),
            Counter::Redis { con, key } => {
                let () = redis::cmd("SET")
                    .arg(&*key)
                    .arg(value)
                    .query_async(con)
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Counter::Etcd { client, key } => {
                client.put(key.as_str(), value.to_string(), None).await?;
            }
            Counter::Zk { client, path } => {
                client
                    .set_data(path, value.to_string().as_bytes(), None)
                    .await?;
            }
            #[cfg(feature = "postgres")]
            Counter::Postgres(counter) => counter.write(value).await?,
        }
        Ok(())
    }
}
