//! etcd client errors mapped to lockkit errors by gRPC status code.

use lockkit_core::{Error, ErrorKind};
use tonic::Code;

/// The backend name in errors, logs and metrics.
pub(crate) const BACKEND: &str = "etcd";

/// Maps an error of `etcd-client` raised while doing `what`.
///
/// gRPC codes that a retry can cure (no leader, a member down, a timeout, overload) become
/// retryable `Unavailable`; refused credentials and permissions become `Auth`; malformed
/// endpoints `InvalidConfig`; anything else a non-retryable `Backend` error.
pub(crate) fn map(what: &str, error: etcd_client::Error) -> Error {
    Error::new(kind(&error), BACKEND, format!("{what} failed")).with_source(error)
}

/// The kind of error [`map`] makes of `error`.
pub(crate) fn kind(error: &etcd_client::Error) -> ErrorKind {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => status_kind(status),
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) | E::WatchError(_) => {
            ErrorKind::Unavailable
        }
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) => ErrorKind::InvalidConfig,
        _ => ErrorKind::Backend,
    }
}

fn status_kind(status: &tonic::Status) -> ErrorKind {
    let message = status.message();
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Cancelled => ErrorKind::Unavailable,
        // The connection broke under the request (tonic reports h2 and I/O failures so).
        Code::Unknown if std::error::Error::source(status).is_some() => ErrorKind::Unavailable,
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::Auth,
        // etcd 3.4 answers a wrong password with InvalidArgument, and a login on a cluster
        // without authentication with FailedPrecondition.
        Code::InvalidArgument | Code::FailedPrecondition
            if message.contains("authentication") || message.contains("user name") =>
        {
            ErrorKind::Auth
        }
        _ => ErrorKind::Backend,
    }
}

/// Whether the server says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_gone(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == Code::NotFound && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

/// Whether the request failed before reaching any member (its connection was refused), so
/// sending it again cannot apply it twice.
pub(crate) fn never_sent(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == Code::Unavailable && status.message().contains("connect error")
        }
        _ => false,
    }
}

/// The error for a request that did not answer within the request timeout.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        BACKEND,
        format!("{what} got no answer within the request timeout of {timeout:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(code: Code, message: &str) -> (ErrorKind, bool) {
        let e = map(
            "test",
            etcd_client::Error::GRpcStatus(tonic::Status::new(code, message)),
        );
        (e.kind(), e.is_retryable())
    }

    #[test]
    fn grpc_codes_map_to_kinds_and_retryability() {
        assert_eq!(
            kind_of(Code::Unavailable, "etcdserver: no leader"),
            (ErrorKind::Unavailable, true)
        );
        assert_eq!(
            kind_of(Code::DeadlineExceeded, "etcdserver: request timed out"),
            (ErrorKind::Unavailable, true)
        );
        assert_eq!(
            kind_of(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            ),
            (ErrorKind::Auth, false)
        );
        assert_eq!(
            kind_of(Code::PermissionDenied, "etcdserver: permission denied"),
            (ErrorKind::Auth, false)
        );
        assert_eq!(
            kind_of(
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request"
            ),
            (ErrorKind::Backend, false)
        );
        let gone = etcd_client::Error::GRpcStatus(tonic::Status::new(
            Code::NotFound,
            "etcdserver: requested lease not found",
        ));
        assert!(is_lease_gone(&gone));
        let refused =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("tcp connect error"));
        assert!(never_sent(&refused));
        assert!(!never_sent(&etcd_client::Error::GRpcStatus(
            tonic::Status::unavailable("etcdserver: no leader")
        )));
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )));
        assert_eq!(broken.code(), Code::Unknown);
        assert_eq!(
            map("test", etcd_client::Error::GRpcStatus(broken)).kind(),
            ErrorKind::Unavailable
        );
        assert!(!is_lease_gone(&etcd_client::Error::WatchError("x".into())));
    }
}
