#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod cleanup;
mod config;
mod election;
mod error;
mod naming;
mod operator;
mod renewal;
mod rwlock;
mod semaphore;
mod session;
#[cfg(feature = "tls")]
mod tls;
mod wait;

pub use backend::{MIN_TTL, ZkBackend};
pub use config::{ZkAcl, ZkConfig};
