//! What a cluster's answer says about where a key lives: a `MOVED` slot, a migration in
//! progress (`ASK`, `TRYAGAIN`), a cluster that cannot serve the slot (`CLUSTERDOWN`), or an
//! unreachable primary.

use lockkit_core::{Error, ErrorKind};
use redis::{RedisError, ServerErrorKind};

use super::slots::Addr;

/// Why a request on a key's primary should go again, and where.
#[derive(Debug, PartialEq)]
pub(crate) enum Reroute {
    /// The slot lives on another primary now (`MOVED`); the request did not run.
    Moved(Addr),
    /// The slot is being migrated and the request's keys are not all on one side yet
    /// (`ASK`, `TRYAGAIN`); the request did not run. It runs once the migration of those
    /// keys (or of the whole slot) is over.
    Migrating,
    /// The primary did not answer or the cluster cannot serve the slot now (a failover):
    /// the cluster's map is read again, and the request goes to the slot's new primary if
    /// it has one.
    Unreachable,
}

impl Reroute {
    /// What `error` says, if it says the key's primary should be looked up again.
    pub(crate) fn of(error: &Error) -> Option<Reroute> {
        if let Some(redis) = redis_error(error) {
            match redis.kind() {
                redis::ErrorKind::Server(ServerErrorKind::Moved) => {
                    // "MOVED <slot> <host>:<port>"
                    let addr = redis.redirect_node().and_then(|(addr, _slot)| {
                        let (host, port) = addr.rsplit_once(':')?;
                        Some((host.to_owned(), port.parse().ok()?))
                    });
                    return Some(addr.map_or(Reroute::Unreachable, Reroute::Moved));
                }
                redis::ErrorKind::Server(ServerErrorKind::Ask | ServerErrorKind::TryAgain) => {
                    return Some(Reroute::Migrating);
                }
                redis::ErrorKind::Server(ServerErrorKind::ClusterDown) => {
                    return Some(Reroute::Unreachable);
                }
                _ => {}
            }
        }
        (error.kind() == ErrorKind::Unavailable).then_some(Reroute::Unreachable)
    }
}

/// Whether `error` is a cluster's answer that a key's slot is served elsewhere or not served
/// now (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`), which the next attempt follows: not a
/// refusal, and not an outage.
pub(crate) fn redirected(error: &Error) -> bool {
    error.kind() != ErrorKind::Unavailable && Reroute::of(error).is_some()
}

/// The redis client error behind `error`, if it has one.
fn redis_error(error: &Error) -> Option<&RedisError> {
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(redis) = e.downcast_ref::<RedisError>() {
            return Some(redis);
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> Error {
        let redis = RedisError::from((
            redis::ErrorKind::Server(match code {
                "MOVED" => ServerErrorKind::Moved,
                "ASK" => ServerErrorKind::Ask,
                "TRYAGAIN" => ServerErrorKind::TryAgain,
                _ => ServerErrorKind::ClusterDown,
            }),
            "cluster",
            detail.to_owned(),
        ));
        crate::error::from_redis(crate::error::BACKEND, redis)
    }

    #[test]
    fn redirects_are_told_apart() {
        assert_eq!(
            Reroute::of(&server("MOVED", "3999 127.0.0.1:7002")),
            Some(Reroute::Moved(("127.0.0.1".to_owned(), 7002)))
        );
        assert_eq!(
            Reroute::of(&server("ASK", "3999 127.0.0.1:7002")),
            Some(Reroute::Migrating)
        );
        assert_eq!(
            Reroute::of(&server("TRYAGAIN", "")),
            Some(Reroute::Migrating)
        );
        assert_eq!(
            Reroute::of(&server("CLUSTERDOWN", "")),
            Some(Reroute::Unreachable)
        );
        let lost = Error::new(ErrorKind::Lost, "redis", "gone");
        assert_eq!(Reroute::of(&lost), None);
    }

    #[test]
    fn a_redirect_is_neither_a_refusal_nor_an_outage() {
        for (code, detail) in [
            ("MOVED", "3999 127.0.0.1:7002"),
            ("ASK", "3999 127.0.0.1:7002"),
            ("TRYAGAIN", ""),
            ("CLUSTERDOWN", ""),
        ] {
            assert!(redirected(&server(code, detail)), "{code}");
        }
        let outage = Error::new(ErrorKind::Unavailable, "redis", "timed out");
        assert!(!redirected(&outage), "an outage polls a while");
        let refused = crate::error::from_redis(
            crate::error::BACKEND,
            RedisError::from((redis::ErrorKind::Server(ServerErrorKind::NoPerm), "denied")),
        );
        assert!(!redirected(&refused), "a refusal polls");
    }
}
