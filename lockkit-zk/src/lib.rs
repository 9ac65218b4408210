//! The ZooKeeper backend of lockkit ([`Tier::Consensus`](lockkit_core::Tier::Consensus)):
//! locks as `EPHEMERAL_SEQUENTIAL` znodes in one session per backend, waiters watching only
//! their predecessor, the creating zxid (`czxid`) as the fencing token.
//!
//! ```no_run
//! use lockkit_core::LockClient;
//! use lockkit_zk::{ZkBackend, ZkConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockkit_core::Result<()> {
//! let config = ZkConfig::from_url("zk://z1:2181,z2:2181,z3:2181/lockkit")?;
//! let locks = LockClient::new(ZkBackend::connect(config).await?);
//! let guard = locks.mutex("nightly-report")?.lock().await?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! See [`ZkBackend`] for the algorithm and its guarantees, and [`ZkConfig`] for the options.
//!
//! # Security notes
//! - Node names carry a SHA-256 digest of each acquisition's owner token, never the token:
//!   whoever may list a lock sees the digests, and the lock namespaces and names.
//! - `zookeeper-client` logs every request's path at `debug` level: lock namespaces, names
//!   and those digests (no owner token, no password). Filter it with `zookeeper_client=info`
//!   (e.g. `RUST_LOG=info,zookeeper_client=info`) when lock names are confidential.
//! - Keep other clients away from the locks with `username`/`password` and creator-only ACLs
//!   ([`ZkAcl`]).

mod backend;
mod config;
mod error;
mod session;
#[cfg(feature = "tls")]
mod tls;

pub use backend::ZkBackend;
pub use config::{ZkAcl, ZkConfig};
