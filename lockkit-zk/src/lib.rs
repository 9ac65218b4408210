#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod session;
#[cfg(feature = "tls")]
mod tls;

pub use backend::{MIN_TTL, ZkBackend};
pub use config::{ZkAcl, ZkConfig};
