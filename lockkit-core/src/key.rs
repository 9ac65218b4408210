//! Validated lock names and the namespace they live in.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};

/// The longest lock name or namespace accepted, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// The namespace used when the configuration names none.
pub const DEFAULT_NAMESPACE: &str = "lockkit";

/// A validated lock name joined with the namespace it lives in.
///
/// Both parts are checked by the same rules: non-empty, at most [`MAX_KEY_LEN`] bytes, no
/// control characters (NUL included), no `/`, and neither `.` nor `..`. That keeps a name one
/// segment of an etcd prefix or a ZooKeeper path, so no name can escape its namespace.
/// Each backend maps the key to its own key space (see the backend's docs).
///
/// ```
/// use lockkit_core::LockKey;
///
/// let key = LockKey::new("billing", "invoice-42").unwrap();
/// assert_eq!(key.name(), "invoice-42");
/// assert_eq!(key.to_string(), "billing/invoice-42");
/// assert!(LockKey::new("billing", "../etc").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    namespace: Arc<str>,
    name: Arc<str>,
}

impl LockKey {
    /// Validates `namespace` and `name` and joins them.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] naming the rule that was broken.
    pub fn new(namespace: &str, name: &str) -> Result<Self> {
        validate_segment("namespace", namespace)?;
        validate_segment("lock name", name)?;
        Ok(LockKey {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    /// The namespace part.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The lock name, without the namespace.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({self})")
    }
}

/// Checks one namespace or name segment against the rules documented on [`LockKey`].
///
/// # Errors
/// [`ErrorKind::InvalidKey`] naming the rule that was broken.
pub fn validate_segment(what: &str, segment: &str) -> Result<()> {
    let fail = |why: String| {
        Err(Error::new(
            ErrorKind::InvalidKey,
            "core",
            format!("{what} {why}"),
        ))
    };
    if segment.is_empty() {
        return fail("is empty".into());
    }
    if segment.len() > MAX_KEY_LEN {
        return fail(format!(
            "is {} bytes long; the limit is {MAX_KEY_LEN}",
            segment.len()
        ));
    }
    if segment == "." || segment == ".." {
        return fail(format!("may not be {segment:?}"));
    }
    if let Some(c) = segment.chars().find(|c| *c == '/' || c.is_control()) {
        return fail(format!("contains the forbidden character {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejects(name: &str) -> String {
        let err = LockKey::new("ns", name).expect_err(name);
        assert_eq!(err.kind(), ErrorKind::InvalidKey);
        err.to_string()
    }

    #[test]
    fn accepts_ordinary_names() {
        for name in [
            "a",
            "orders:42",
            "job.nightly",
            "with space",
            "ünïcödé",
            "{tag}x",
            "...",
            "a..b",
        ] {
            LockKey::new("ns", name).expect(name);
        }
        LockKey::new("ns", &"x".repeat(MAX_KEY_LEN)).expect("max length");
    }

    #[test]
    fn rejects_hostile_names_with_a_reason() {
        assert!(rejects("").contains("is empty"));
        assert!(rejects(&"x".repeat(MAX_KEY_LEN + 1)).contains("limit is 256"));
        assert!(rejects(&"x".repeat(10_000)).contains("10000 bytes"));
        assert!(rejects("a/b").contains("'/'"));
        assert!(rejects("/").contains("'/'"));
        assert!(rejects(".").contains("may not be"));
        assert!(rejects("..").contains("may not be"));
        assert!(rejects("nul\0byte").contains("\\0"));
        assert!(rejects("new\nline").contains("\\n"));
        assert!(rejects("esc\u{1b}").contains("forbidden"));
        assert!(rejects("del\u{7f}").contains("forbidden"));
    }

    #[test]
    fn rejects_bad_namespaces() {
        assert_eq!(
            LockKey::new("", "a").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert!(
            LockKey::new("a/b", "a")
                .unwrap_err()
                .to_string()
                .contains("namespace")
        );
    }
}
