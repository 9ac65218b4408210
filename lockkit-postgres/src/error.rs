//! PostgreSQL client errors mapped to lockkit errors by SQLSTATE.

use lockkit_core::{Error, ErrorKind};
use tokio_postgres::error::SqlState;

/// The backend name in errors, logs and metrics.
pub(crate) const BACKEND: &str = "postgres";

/// Maps an error of `tokio-postgres` raised while doing `what`.
///
/// A broken or refused connection, a server shutting down, a cancelled statement, a deadlock
/// or a serialization failure are retryable `Unavailable`; refused credentials and missing
/// rights are `Auth`; anything else a non-retryable `Backend` error. The message of the
/// source never holds the password (the client does not echo it).
pub(crate) fn map(what: &str, error: tokio_postgres::Error) -> Error {
    Error::new(kind(&error), BACKEND, format!("{what} failed")).with_source(error)
}

/// The kind of error [`map`] makes of `error`.
pub(crate) fn kind(error: &tokio_postgres::Error) -> ErrorKind {
    let Some(code) = error.code() else {
        // No SQLSTATE: the connection failed (refused, reset, closed) or timed out.
        return ErrorKind::Unavailable;
    };
    if *code == SqlState::INVALID_PASSWORD
        || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        || *code == SqlState::INSUFFICIENT_PRIVILEGE
    {
        return ErrorKind::Auth;
    }
    // Class 08 (connection exception), 53 (insufficient resources), 57 (operator
    // intervention: shutdown, cancel, a standby that is recovering), 40 (a deadlock or a
    // serialization failure: the transaction was rolled back and can be sent again), and a
    // read-only server (a standby, before its promotion).
    let class = &code.code()[..2];
    if matches!(class, "08" | "53" | "57" | "40") || *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Backend
    }
}

/// The error for a statement that did not answer within the request timeout.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        BACKEND,
        format!("{what} got no answer within the request timeout of {timeout:?}"),
    )
}
