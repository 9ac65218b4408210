//! The etcd backend of [lockkit](https://docs.rs/lockkit) (tier
//! [`consensus`](lockkit_core::Tier::Consensus)).
//!
//! [`EtcdBackend`] implements [`LockBackend`](lockkit_core::backend::LockBackend) on an etcd v3
//! cluster the way etcd's own `concurrency` package does: one session lease per client kept
//! alive in the background, a key per contender under the lock's prefix, the lowest create
//! revision holds the lock, each waiter watches only its predecessor, and the create revision
//! is the fencing token. See [`EtcdBackend`] for the algorithm and the README for the failure
//! modes.
//!
//! ```no_run
//! use lockkit_core::LockClient;
//! use lockkit_etcd::{EtcdBackend, EtcdConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockkit_core::Result<()> {
//! let config = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/billing")?;
//! let backend = EtcdBackend::connect(config).await?;
//! let locks = LockClient::new(backend.clone());
//! let guard = locks.mutex("invoice-42")?.lock().await?;
//! // A write that lands only while the lock is still held:
//! backend
//!     .txn_if_held(&guard, [lockkit_etcd::etcd_client::TxnOp::put("invoice-42/state", "paid", None)])
//!     .await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod cleanup;
mod config;
mod error;
mod naming;
mod operator;
mod session;
mod wait;

pub use backend::EtcdBackend;
pub use config::EtcdConfig;

/// The etcd client crate this backend is built on, for [`EtcdBackend::txn_if_held`] and
/// [`EtcdBackend::client`].
pub use etcd_client;
