#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod cleanup;
mod config;
mod election;
mod error;
mod operator;
mod renewal;
mod session;
mod tls;
mod wait;

pub use backend::PostgresBackend;
pub use config::PostgresConfig;

/// The PostgreSQL client crate this backend is built on.
pub use tokio_postgres;
