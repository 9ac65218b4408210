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
mod request;
mod rwlock;
mod semaphore;
mod session;
mod wait;

pub use backend::EtcdBackend;
pub use config::EtcdConfig;

/// The etcd client crate this backend is built on, for [`EtcdBackend::txn_if_held`] and
/// [`EtcdBackend::client`].
pub use etcd_client;
