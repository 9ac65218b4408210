//! Validated lock names and the namespace they live in.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};

/// A validated lock name joined with the namespace it lives in.
///
/// Both parts are checked by the same rules: non-empty, at most [`LockKey::MAX_LEN`] bytes, neither
/// `.` nor `..`, and none of these characters:
///
/// - `/`, so a name stays one segment of an etcd prefix or a ZooKeeper path and no name can
///   escape its namespace;
/// - control characters (NUL, C0 and C1, DEL), the bidirectional controls (U+061C, U+200E,
///   U+200F, U+202A-U+202E, U+2066-U+2069) and the line and paragraph separators (U+2028,
///   U+2029), so a name cannot forge or reorder log lines or display as another name;
/// - what ZooKeeper cannot store in a path: the private-use block U+E000-U+F8FF,
///   U+FFF0-U+FFFF, and every character above U+FFFF (emoji among them: ZooKeeper checks
///   paths as UTF-16 and refuses surrogates). The rule is the same on every backend, so a
///   name that works on one works on all of them and switching backends by configuration
///   never turns a valid name into a server error.
///
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
    /// The longest lock name or namespace accepted, in bytes.
    pub const MAX_LEN: usize = 256;

    /// The namespace used when the configuration names none.
    pub const DEFAULT_NAMESPACE: &'static str = "lockkit";

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
    if segment.len() > LockKey::MAX_LEN {
        return fail(format!(
            "is {} bytes long; the limit is {}",
            segment.len(),
            LockKey::MAX_LEN
        ));
    }
    if segment == "." || segment == ".." {
        return fail(format!("may not be {segment:?}"));
    }
    if let Some((c, why)) = segment
        .chars()
        .find_map(|c| forbidden(c).map(|why| (c, why)))
    {
        return fail(format!("contains the forbidden character {c:?} ({why})"));
    }
    Ok(())
}

/// Why `c` may not occur in a namespace or lock name, if it may not (see [`LockKey`]).
fn forbidden(c: char) -> Option<&'static str> {
    match c {
        '/' => Some("the path separator"),
        c if c.is_control() => Some("a control character"),
        '\u{061C}'
        | '\u{200E}'
        | '\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2066}'..='\u{2069}' => Some("a bidirectional control character"),
        '\u{2028}' | '\u{2029}' => Some("a line or paragraph separator"),
        '\u{E000}'..='\u{F8FF}' | '\u{FFF0}'..='\u{FFFF}' | '\u{10000}'.. => {
            Some("ZooKeeper cannot store it in a path")
        }
        _ => None,
    }
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
        LockKey::new("ns", &"x".repeat(LockKey::MAX_LEN)).expect("max length");
    }

    #[test]
    fn rejects_hostile_names_with_a_reason() {
        assert!(rejects("").contains("is empty"));
        assert!(rejects(&"x".repeat(LockKey::MAX_LEN + 1)).contains("limit is 256"));
        assert!(rejects(&"x".repeat(10_000)).contains("10000 bytes"));
        assert!(rejects("a/b").contains("'/'"));
        assert!(rejects("/").contains("'/'"));
        assert!(rejects(".").contains("may not be"));
        assert!(rejects("..").contains("may not be"));
        assert!(rejects("nul\0byte").contains("\\0"));
        assert!(rejects("new\nline").contains("\\n"));
        assert!(rejects("esc\u{1b}").contains("forbidden"));
        assert!(rejects("del\u{7f}").contains("forbidden"));
        assert!(rejects("c1\u{85}").contains("control character"));
        assert!(rejects("tab\tname").contains("control character"));
    }

    #[test]
    fn rejects_names_that_display_as_others_or_break_log_lines() {
        for name in [
            "invoice-\u{202e}24",
            "a\u{2066}b\u{2069}",
            "rlm\u{200f}",
            "alm\u{61c}",
            "line\u{2028}sep",
            "para\u{2029}sep",
        ] {
            let why = rejects(name);
            assert!(
                why.contains("bidirectional") || why.contains("separator"),
                "{name:?}: {why}"
            );
        }
    }

    #[test]
    fn rejects_what_zookeeper_cannot_store_on_every_backend() {
        for name in [
            "emoji-\u{1f600}",
            "\u{e000}",
            "\u{f8ff}",
            "\u{fff0}",
            "\u{fffd}",
            "\u{10ffff}",
        ] {
            assert!(rejects(name).contains("ZooKeeper"), "{name:?}");
        }
        for name in ["\u{d7ff}", "\u{f900}", "\u{ffef}", "\u{feff}x"] {
            LockKey::new("ns", name).expect(name);
        }
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
