//! Maps redis client errors onto lockkit's [`ErrorKind`]s.

use lockkit_core::{Error, ErrorKind};
use redis::{RedisError, RetryMethod, ServerErrorKind};

/// The backend name in errors, logs and metrics.
pub(crate) const BACKEND: &str = "redis";

/// Converts a redis client error, saying whether a retry can help.
pub(crate) fn from_redis(backend: &'static str, error: RedisError) -> Error {
    let (kind, retryable) = classify(&error);
    Error::new(kind, backend, describe(&error))
        .with_retryable(retryable)
        .with_source(error)
}

fn classify(error: &RedisError) -> (ErrorKind, bool) {
    use redis::ErrorKind as K;
    if error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_io_error()
    {
        return (ErrorKind::Unavailable, true);
    }
    if matches!(error.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || error
            .detail()
            .is_some_and(|d| d.contains("can't run this command"))
    {
        return (ErrorKind::Auth, false);
    }
    match error.kind() {
        K::AuthenticationFailed => (ErrorKind::Auth, false),
        K::Server(ServerErrorKind::NoPerm) => (ErrorKind::Auth, false),
        K::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown) => {
            (ErrorKind::Unavailable, true)
        }
        K::InvalidClientConfig => (ErrorKind::InvalidConfig, false),
        K::MasterNameNotFoundBySentinel | K::EmptySentinelList => (ErrorKind::Unavailable, true),
        _ => (
            ErrorKind::Backend,
            matches!(
                error.retry_method(),
                RetryMethod::Reconnect | RetryMethod::RetryImmediately | RetryMethod::WaitAndRetry
            ),
        ),
    }
}

fn describe(error: &RedisError) -> String {
    match error.kind() {
        redis::ErrorKind::AuthenticationFailed => {
            "authentication failed: check the username and password".to_owned()
        }
        _ if error.code() == Some("WRONGPASS") => {
            "authentication failed: check the username and password".to_owned()
        }
        _ if error.code() == Some("NOAUTH") => {
            "the server requires a password and none was configured".to_owned()
        }
        _ if error.code() == Some("NOPERM") => {
            "the Redis user lacks a permission lockkit needs (EVALSHA, SCRIPT LOAD, PUBLISH and SUBSCRIBE, or on a Redis Cluster SPUBLISH and SSUBSCRIBE, on its keys and channels)".to_owned()
        }
        // The backend's name is in the error already.
        _ => error.to_string(),
    }
}

/// The error of one request of a pipeline that the server refused (`what` names it), keeping
/// the server's error as its source: a Redis Cluster's `MOVED` or `ASK` is told apart by it.
pub(crate) fn refused_in_pipeline(what: &str, error: &redis::ServerError) -> Error {
    Error::new(
        ErrorKind::Backend,
        BACKEND,
        format!("{what} failed: {error}"),
    )
    .with_retryable(true)
    .with_source(RedisError::from(error.clone()))
}

/// Whether `error` is the server refusing to `SELECT` a database it does not have.
pub(crate) fn is_missing_database(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|d| d.contains("DB index is out of range"))
}

/// The error when every server asked (`failures`: each one's address and error) failed:
/// `Unavailable` (retryable), unless they all refused the same way for a reason retries
/// cannot fix (credentials, a name or server that is not what the configuration says), which
/// is then that error, not an outage. `what` says what was asked.
pub(crate) fn none_answered(
    backend: &'static str,
    what: &str,
    failures: &[(String, Error)],
) -> Error {
    let kind = match failures.first() {
        Some((_, first))
            if !first.is_retryable() && failures.iter().all(|(_, e)| e.kind() == first.kind()) =>
        {
            first.kind()
        }
        _ => ErrorKind::Unavailable,
    };
    let details: Vec<String> = failures
        .iter()
        .map(|(server, e)| format!("{server}: {}", e.message()))
        .collect();
    Error::new(kind, backend, format!("{what}: {}", details.join("; ")))
        .with_retryable(kind == ErrorKind::Unavailable)
}

/// The error for a request that got no answer in time.
pub(crate) fn timed_out(backend: &'static str, what: &str, after: std::time::Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        backend,
        format!("{what}: no answer within {after:?}"),
    )
    .with_retryable(true)
}

/// The error for an answer lockkit did not expect (a script of another version, a proxy).
pub(crate) fn unexpected(backend: &'static str, what: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        backend,
        format!("unexpected reply to {what}"),
    )
}

/// The same error again, for each lease of a failed batch (errors hold a source and do not
/// clone).
pub(crate) fn repeat(error: &Error) -> Error {
    let again = Error::new(error.kind(), error.backend(), error.message())
        .with_retryable(error.is_retryable());
    // A Redis error clones, and says where a cluster's slot went.
    match std::error::Error::source(error).and_then(|s| s.downcast_ref::<RedisError>()) {
        Some(redis) => again.with_source(redis.clone()),
        None => again,
    }
}
