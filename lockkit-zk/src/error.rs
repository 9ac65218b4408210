//! ZooKeeper client errors mapped to lockkit errors, by ZooKeeper error code.

use lockkit_core::{Error, ErrorKind};
use zookeeper_client as zk;

/// The backend name in errors, logs and metrics.
pub(crate) const BACKEND: &str = "zk";

/// Maps a client error of operation `what` to a lockkit error.
///
/// Retryable are the errors after which the same request can succeed: a lost connection
/// (the client reconnects), an expired session (the backend opens a new one), throttling and
/// timeouts. Permission errors are `Auth`; the rest are `Backend` and not retried.
pub(crate) fn map(what: &str, err: zk::Error) -> Error {
    let (kind, retryable) = match &err {
        zk::Error::NoAuth | zk::Error::AuthFailed | zk::Error::InvalidAcl => {
            (ErrorKind::Auth, false)
        }
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::NotReadOnly => (ErrorKind::Unavailable, true),
        zk::Error::Throttled => (ErrorKind::Backend, true),
        // A connection that breaks under a request (reset, refused) comes back as a custom
        // error wrapping the socket's I/O error: a lost connection. The client's other custom
        // errors are TLS and SASL set-up; SASL is not enabled, and the TLS files are checked
        // before connecting (`tls::options`).
        zk::Error::Custom(_) => (ErrorKind::Unavailable, true),
        _ => (ErrorKind::Backend, false),
    };
    let message = match kind {
        ErrorKind::Auth => format!(
            "{what}: the ensemble refused the request (wrong or missing digest credentials, or an ACL that does not admit them)"
        ),
        _ => format!("{what} failed"),
    };
    Error::new(kind, BACKEND, message)
        .with_retryable(retryable)
        .with_source(err)
}

/// The error for a request that did not answer within `request_timeout`.
pub(crate) fn timed_out(what: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        BACKEND,
        format!("{what}: no answer from the ensemble within request_timeout"),
    )
}

/// Whether `error` reports the session expired (its nodes are gone with it).
pub(crate) fn session_expired(error: &Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<zk::Error>())
        .is_some_and(|e| matches!(e, zk::Error::SessionExpired))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        let auth = map("create", zk::Error::NoAuth);
        assert_eq!(auth.kind(), ErrorKind::Auth);
        assert!(!auth.is_retryable());
        let lost = map("create", zk::Error::ConnectionLoss);
        assert_eq!(lost.kind(), ErrorKind::Unavailable);
        assert!(lost.is_retryable());
        let throttled = map("create", zk::Error::Throttled);
        assert_eq!(throttled.kind(), ErrorKind::Backend);
        assert!(throttled.is_retryable());
        let bad = map("create", zk::Error::NoChildrenForEphemerals);
        assert_eq!(bad.kind(), ErrorKind::Backend);
        assert!(!bad.is_retryable());
    }
}
