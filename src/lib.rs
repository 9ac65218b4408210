#![doc = include_str!("../README.md")]
// On docs.rs (nightly rustdoc with `--cfg docsrs`, see Cargo.toml), `doc_cfg` marks every
// feature-gated item with its feature by itself (the backend modules and `LockkitConfig`'s
// fields); no `doc(cfg(...))` needed.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod connect;

pub use config::{BackendKind, LockkitConfig};
pub use connect::connect;

pub use lockkit_core::{
    Capabilities, DEFAULT_RETRY_PAUSE, Election, Error, ErrorKind, FencingGuarantee, FencingToken,
    Leader, LeaderChanges, Leadership, LockClient, LockInfo, LockKey, LockOptions, LockOwner,
    LockPage, LostSignal, MAX_PERMITS, MAX_VALUE_LEN, MemoryBackend, MultiGuard, Mutex, MutexGuard,
    Permit, ReadGuard, Result, RwLock, Semaphore, Support, Tier, WaitStrategy, WithLockError,
    WriteGuard,
};

/// The backend-author API: the [`LockBackend`](backend::LockBackend) trait a backend
/// implements, the types it exchanges with the core, and the helpers backends share. Users of
/// locks do not need it.
pub use lockkit_core::backend;
/// The metric names lockkit records.
pub use lockkit_core::metrics;

/// The etcd backend (feature `etcd`): [`EtcdBackend`](lockkit_etcd::EtcdBackend) and its
/// [`EtcdConfig`](lockkit_etcd::EtcdConfig).
#[cfg(feature = "etcd")]
pub use lockkit_etcd as etcd;
/// The PostgreSQL backend (feature `postgres`): [`PostgresBackend`](lockkit_postgres::PostgresBackend)
/// and its [`PostgresConfig`](lockkit_postgres::PostgresConfig).
#[cfg(feature = "postgres")]
pub use lockkit_postgres as postgres;
/// The Redis backends (`redis`, `redis-sentinel`, `redis-cluster`, `redlock`), for building them
/// directly.
#[cfg(feature = "redis")]
pub use lockkit_redis as redis;
/// The ZooKeeper backend (feature `zk`).
#[cfg(feature = "zk")]
pub use lockkit_zk as zk;
