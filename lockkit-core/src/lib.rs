//! The core of [lockkit](https://docs.rs/lockkit): one lock API over Redis, etcd and
//! ZooKeeper.
//!
//! The crate root is the API for users of locks:
//! - [`LockClient`] (a backend with a namespace and [`LockOptions`]), [`Mutex`] (waiting with
//!   jittered backoff or backend notifications, reentrancy for a [`LockOwner`], cancel
//!   safety) and [`MutexGuard`] (fencing token, lost signal, renewal on lockkit's own
//!   background thread so that busy user tasks cannot starve it, background release);
//! - validated keys ([`LockKey`]), [`FencingToken`], [`LostSignal`], [`Tier`],
//!   [`Capabilities`], [`LockInfo`] and [`LockPage`] (what operators see), one [`Error`] type
//!   and [`WithLockError`];
//! - [`MemoryBackend`], an in-process backend with real semantics, for tests and examples.
//!
//! The backend-author API is in [`backend`]: the [`LockBackend`](backend::LockBackend) trait
//! (a few primitive operations: try one acquisition, wait for a change, renew, release,
//! inspect), the types it exchanges with the core, and what backends share. With the
//! `testing` feature, [`testing`] holds the conformance suite every backend runs.
//!
//! ```
//! use std::time::Duration;
//! use lockkit_core::{LockClient, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockkit_core::Result<()> {
//! let locks = LockClient::new(MemoryBackend::new());
//! let report = locks.mutex("daily-report")?.with_ttl(Duration::from_secs(30))?;
//! let token = report
//!     .with_lock(async |guard| {
//!         // Pass the fencing token along with every write the lock protects.
//!         guard.fencing_token().get()
//!     })
//!     .await?;
//! assert!(token >= 1);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod background;
mod backoff;
mod capabilities;
mod client;
mod error;
mod guard;
mod key;
mod lease;
mod memory;
pub mod metrics;
mod mutex;
mod options;
mod owner;
mod renewal;
mod token;
mod with_lock;

#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{LockInfo, LockPage};
pub use capabilities::{Capabilities, FencingGuarantee, Tier, WaitStrategy};
pub use client::LockClient;
pub use error::{Error, ErrorKind, Result};
pub use guard::{LostSignal, MutexGuard};
pub use key::LockKey;
pub use memory::MemoryBackend;
pub use mutex::Mutex;
pub use options::LockOptions;
pub use owner::LockOwner;
pub use token::FencingToken;
pub use with_lock::WithLockError;
