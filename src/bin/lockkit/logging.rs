//! Logs to stderr, through `tracing-subscriber`'s `fmt` layer and a [`Targets`] filter: the
//! `RUST_LOG` syntax without span and field filters (`warn`, `lockkit_redis=debug,info`),
//! which needs no `env-filter` feature (and its regex engine).

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// Installs the subscriber: `RUST_LOG` when set, else warnings from everything and, with
/// `verbose` 1, 2, 3, info, debug, trace from lockkit's own crates.
pub(crate) fn init(verbose: u8) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec
            .parse::<Targets>()
            .map_err(|e| format!("RUST_LOG={spec:?} is not a valid filter: {e}"))?,
        _ => {
            let ours = match verbose {
                0 => LevelFilter::WARN,
                1 => LevelFilter::INFO,
                2 => LevelFilter::DEBUG,
                _ => LevelFilter::TRACE,
            };
            // "lockkit" is a prefix of every lockkit crate's target (lockkit_core, ...).
            Targets::new()
                .with_default(LevelFilter::WARN)
                .with_target("lockkit", ours)
        }
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_target(true),
        )
        .with(filter)
        .try_init()
        .map_err(|e| format!("cannot install the logger: {e}"))
}
