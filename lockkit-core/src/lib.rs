#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
pub mod backend;
mod background;
mod backoff;
mod capabilities;
mod client;
mod deadline;
mod election;
mod error;
mod guard;
mod held;
mod key;
mod lease;
mod memory;
mod methods;
pub mod metrics;
mod multi;
mod mutex;
mod options;
mod owner;
mod renewal;
mod rwlock;
mod semaphore;
mod token;
mod with_lock;

#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{LockInfo, LockPage};
pub use capabilities::{Capabilities, FencingGuarantee, Support, Tier, WaitStrategy};
pub use client::LockClient;
pub use election::{
    DEFAULT_RETRY_PAUSE, Election, Leader, LeaderChanges, Leadership, MAX_VALUE_LEN,
};
pub use error::{Error, ErrorKind, Result};
pub use guard::{LostSignal, MutexGuard};
pub use key::LockKey;
pub use memory::MemoryBackend;
pub use multi::MultiGuard;
pub use mutex::Mutex;
pub use options::LockOptions;
pub use owner::LockOwner;
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{MAX_PERMITS, Permit, Semaphore};
pub use token::FencingToken;
pub use with_lock::WithLockError;
