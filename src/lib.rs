#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod connect;

pub use config::{BackendKind, LockkitConfig};
pub use connect::connect;

pub use lockkit_core::{
    BoxError, Capabilities, Error, ErrorKind, FencingGuarantee, FencingToken, Lease, LockBackend,
    LockClient, LockInfo, LockKey, LockOptions, LostSignal, MemoryBackend, Mutex, MutexGuard,
    Result, SharedBackend, Tier, WaitStrategy,
};

/// The core crate, for backend authors and the conformance suite.
pub use lockkit_core as core;

/// The etcd backend (feature `etcd`): [`EtcdBackend`](lockkit_etcd::EtcdBackend) and its
/// [`EtcdConfig`](lockkit_etcd::EtcdConfig).
#[cfg(feature = "etcd")]
pub use lockkit_etcd as etcd;
/// The Redis backends (`redis`, `redis-sentinel`, `redlock`), for building them directly.
#[cfg(feature = "redis")]
pub use lockkit_redis as redis;
/// The ZooKeeper backend (feature `zk`).
#[cfg(feature = "zk")]
pub use lockkit_zk as zk;
