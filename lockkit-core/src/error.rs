//! The one error type of lockkit: a kind, the backend it came from, a message and a source.

use std::fmt;

/// A boxed error source, as carried by [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `std::result::Result<T, lockkit_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, independent of the backend.
///
/// Match on it to decide what to do; [`Error::is_retryable`] answers the most common question.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The lock was not acquired before the wait deadline (`lock_timeout`, `wait_timeout`).
    /// A lock that is merely taken is not an error: `try_lock` answers `Ok(None)`.
    Timeout,
    /// The lock was held but is no longer: it expired, was taken away, or renewal failed past
    /// its validity deadline. Whatever the holder did after that point is unprotected. (A
    /// release that finds the lock gone is not an error: `release()` answers `Ok(false)`.)
    Lost,
    /// A quorum backend (Redlock) reached fewer nodes than it needs.
    QuorumNotReached {
        /// How many nodes agreed.
        got: usize,
        /// How many nodes are needed (a majority).
        need: usize,
    },
    /// The backend could not be reached, or did not answer within its timeout.
    Unavailable,
    /// The backend refused the credentials or the permissions are insufficient.
    Auth,
    /// The lock key is not valid (empty, too long, forbidden characters).
    InvalidKey,
    /// The configuration is not valid (unknown field or backend, bad URL, bad value).
    InvalidConfig,
    /// The backend cannot do what was asked (or it is not compiled in).
    Unsupported,
    /// Any other error reported by the backend.
    Backend,
}

impl ErrorKind {
    /// Whether an operation that failed with this kind may succeed if simply tried again.
    ///
    /// `Backend` errors are not retryable by default; a backend that knows better marks the
    /// individual error with [`Error::with_retryable`].
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::Timeout | ErrorKind::QuorumNotReached { .. } | ErrorKind::Unavailable
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Timeout => f.write_str("timed out waiting for the lock"),
            ErrorKind::Lost => f.write_str("lock lost"),
            ErrorKind::QuorumNotReached { got, need } => {
                write!(f, "quorum not reached ({got} of {need} needed nodes)")
            }
            ErrorKind::Unavailable => f.write_str("backend unavailable"),
            ErrorKind::Auth => f.write_str("authentication or permission failure"),
            ErrorKind::InvalidKey => f.write_str("invalid lock key"),
            ErrorKind::InvalidConfig => f.write_str("invalid configuration"),
            ErrorKind::Unsupported => f.write_str("unsupported"),
            ErrorKind::Backend => f.write_str("backend error"),
        }
    }
}

/// An error from lockkit or one of its backends.
///
/// It carries an [`ErrorKind`], the name of the backend that raised it (`"memory"`, `"redis"`,
/// `"etcd"`, ...), a human-readable message and, where there is one, the underlying error as
/// [`source`](std::error::Error::source). Messages never contain passwords or owner tokens.
pub struct Error {
    kind: ErrorKind,
    backend: &'static str,
    message: String,
    retryable: bool,
    source: Option<BoxError>,
}

impl Error {
    /// A new error of `kind` raised by `backend`, with a message for humans.
    pub fn new(kind: ErrorKind, backend: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind,
            backend,
            message: message.into(),
            retryable: kind.is_retryable(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Overrides whether the error is retryable (for example a `Backend` error that the client
    /// library classifies as transient).
    #[must_use]
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The backend that raised the error (`"memory"`, `"redis"`, `"etcd"`, `"zk"`, `"config"`, ...).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The message, without the kind or the backend.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether trying the same operation again may succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The error followed by each of its sources, `": "`-separated: for logs and command-line
    /// output, where nothing walks [`source`](std::error::Error::source). ([`Display`](fmt::Display)
    /// alone leaves the source out, so that error reporters that walk the chain, such as
    /// anyhow and eyre, do not print it twice.)
    pub fn display_chain(&self) -> impl fmt::Display + '_ {
        Chain(self)
    }

    /// A [`ErrorKind::InvalidConfig`] error, raised while loading configuration.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidConfig, "config", message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("backend", &self.backend)
            .field("message", &self.message)
            .field("retryable", &self.retryable);
        if let Some(source) = &self.source {
            d.field("source", &format_args!("{source}"));
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.backend, self.kind)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

struct Chain<'a>(&'a Error);

/// The error and each cause once: a cause whose text was already printed (a client error
/// that repeats the I/O error it wraps, a message that quotes its source) is left out.
impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut printed = self.0.to_string();
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !text.is_empty() && !printed.contains(&text) {
                printed.push_str(": ");
                printed.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&printed)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_defaults_follow_the_kind() {
        assert!(Error::new(ErrorKind::Unavailable, "redis", "x").is_retryable());
        assert!(
            Error::new(
                ErrorKind::QuorumNotReached { got: 2, need: 3 },
                "redlock",
                ""
            )
            .is_retryable()
        );
        assert!(!Error::new(ErrorKind::Auth, "redis", "x").is_retryable());
        assert!(!Error::new(ErrorKind::Lost, "redis", "x").is_retryable());
        assert!(
            Error::new(ErrorKind::Backend, "redis", "x")
                .with_retryable(true)
                .is_retryable()
        );
    }

    #[test]
    fn the_source_is_shown_once_by_a_chain_walking_reporter() {
        let e = Error::new(ErrorKind::Unavailable, "redis", "connect failed")
            .with_source(std::io::Error::other("connection refused"));
        assert_eq!(e.to_string(), "redis: backend unavailable: connect failed");
        let walked: Vec<String> =
            std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
                e.source()
            })
            .map(ToString::to_string)
            .collect();
        assert_eq!(walked.concat().matches("connection refused").count(), 1);
        assert_eq!(
            e.display_chain().to_string(),
            "redis: backend unavailable: connect failed: connection refused"
        );
    }

    #[test]
    fn a_chain_names_each_cause_once() {
        /// A client error that shows the I/O error it wraps, and is its own source's parent.
        #[derive(Debug)]
        struct Wrapping(std::io::Error);
        impl fmt::Display for Wrapping {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
        impl std::error::Error for Wrapping {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = || std::io::Error::other("Connection refused (os error 111)");
        let e = Error::new(
            ErrorKind::Unavailable,
            "redis",
            format!("connecting: {}", refused()),
        )
        .with_source(Wrapping(refused()));
        let chain = e.display_chain().to_string();
        assert_eq!(chain.matches("Connection refused").count(), 1, "{chain}");
    }

    #[test]
    fn display_names_backend_kind_and_message() {
        let e = Error::new(
            ErrorKind::QuorumNotReached { got: 2, need: 3 },
            "redlock",
            "node 4 timed out",
        );
        assert_eq!(
            e.to_string(),
            "redlock: quorum not reached (2 of 3 needed nodes): node 4 timed out"
        );
    }
}
