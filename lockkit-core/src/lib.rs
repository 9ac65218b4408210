//! The core of [lockkit](https://docs.rs/lockkit): one lock API over Redis, etcd and
//! ZooKeeper.
//!
//! This crate holds what every backend shares:
//! - the contract a backend implements, [`LockBackend`]: a few primitive operations
//!   (try one acquisition, wait for a change, renew, release, inspect);
//! - the machinery built once on top of it: [`LockClient`], [`Mutex`] (waiting with jittered
//!   backoff or backend notifications, reentrancy, cancel safety), [`MutexGuard`] (fencing
//!   token, lost signal, background release) and the shared renewal scheduler, which runs on
//!   lockkit's own background thread so that busy user tasks cannot starve it;
//! - validated keys ([`LockKey`]), [`FencingToken`], [`Lease`], [`Tier`], [`Capabilities`], one
//!   [`Error`] type;
//! - [`MemoryBackend`], an in-process backend with real semantics;
//! - with the `testing` feature, the conformance suite every backend runs ([`testing`]).
//!
//! ```
//! use std::time::Duration;
//! use lockkit_core::{LockClient, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockkit_core::Result<()> {
//! let locks = LockClient::new(MemoryBackend::new());
//! let report = locks.mutex("daily-report")?.with_ttl(Duration::from_secs(30));
//! let total = report
//!     .with_lock(|lease| async move {
//!         // Pass lease.fencing_token() along with every write the lock protects.
//!         lease.fencing_token().get()
//!     })
//!     .await?;
//! assert!(total >= 1);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
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
mod renewal;
pub mod runtime;
mod token;
pub mod url;

#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{
    AcquireRequest, Attempt, Contention, Grant, LockBackend, LockInfo, Renewal, SharedBackend,
};
pub use capabilities::{Capabilities, FencingGuarantee, Tier, WaitStrategy};
pub use client::LockClient;
pub use error::{BoxError, Error, ErrorKind, Result};
pub use guard::{LostSignal, MutexGuard};
pub use key::{DEFAULT_NAMESPACE, LockKey, MAX_KEY_LEN, validate_segment};
pub use lease::{Lease, clock_drift, validity_deadline};
pub use memory::MemoryBackend;
pub use mutex::Mutex;
pub use options::LockOptions;
pub use token::{FencingToken, OwnerToken};

/// Re-exported so backends implement [`LockBackend`] with the same macro version.
pub use async_trait::async_trait;
/// Re-exported for backends that attach session tokens to grants.
pub use tokio_util::sync::CancellationToken;
