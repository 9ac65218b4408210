#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod cleanup;
mod cluster;
mod config;
mod connection;
mod election;
mod error;
mod eviction;
mod lanes;
mod listing;
mod notify;
mod redlock;
mod renewal;
mod rwlock;
mod scripts;
mod semaphore;
mod wait;

pub use backend::RedisBackend;
pub use cluster::RedisClusterBackend;
pub use config::{RedisConfig, RedlockConfig};
pub use redlock::RedlockBackend;
