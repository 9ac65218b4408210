#![doc = include_str!("../README.md")]
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
