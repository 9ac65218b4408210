//! Fencing tokens (public, ordered) and owner tokens (secret, random).

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

/// A number that strictly increases across successive grants of one key on one backend.
///
/// Pass it along with every write to the resource the lock protects, and have the resource
/// reject a write whose token is lower than the highest it has seen: that turns a holder that
/// was paused past its lease (and so lost the lock without knowing) into a rejected write
/// instead of a corrupted one. How strong the promise is depends on the tier; see
/// [`Capabilities::fencing`](crate::Capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The secret that proves ownership of one grant: 128 bits from the operating system's CSPRNG.
///
/// Whoever knows it can release or extend the lock, so it never appears in `Debug` output,
/// errors or logs. Backends store it server-side through [`OwnerToken::expose_hex`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// Draws a fresh token from the operating system's CSPRNG.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`] if the operating system cannot supply randomness.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            Error::new(
                ErrorKind::Backend,
                "core",
                "the OS random number generator failed",
            )
            .with_source(e.to_string())
        })?;
        Ok(OwnerToken(bytes))
    }

    /// Rebuilds a token from the 32 lowercase hex digits of [`OwnerToken::expose_hex`].
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(OwnerToken(bytes))
    }

    /// The token as 32 lowercase hex digits, to be stored on the server. Keep it out of logs.
    pub fn expose_hex(&self) -> String {
        use fmt::Write as _;
        self.0.iter().fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }

    /// What a backend stores in place of the token where others can read it (a key's value,
    /// a node's name): the first 128 bits of SHA-256 over [`OwnerToken::expose_hex`], as 32
    /// lowercase hex digits (`printf %s {hex} | sha256sum | cut -c1-32`).
    ///
    /// It finds a request's own record as well as the token does and still ties the record
    /// to its owner (another token gives another digest), but reveals nothing: the token is
    /// 128 random bits, so the digest can be neither inverted nor guessed. Whoever can read
    /// the record learns only what it already shows.
    pub fn digest_hex(&self) -> String {
        use fmt::Write as _;
        let digest = ring::digest::digest(&ring::digest::SHA256, self.expose_hex().as_bytes());
        digest.as_ref()[..16]
            .iter()
            .fold(String::with_capacity(32), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn owner_tokens_are_unique_and_round_trip_through_hex() {
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let t = OwnerToken::generate().expect("os rng");
            let hex = t.expose_hex();
            assert_eq!(hex.len(), 32);
            assert_eq!(OwnerToken::from_hex(&hex), Some(t.clone()));
            assert!(seen.insert(t), "duplicate owner token");
        }
        assert_eq!(OwnerToken::from_hex("zz"), None);
        assert_eq!(OwnerToken::from_hex(&"g".repeat(32)), None);
    }

    /// The digest is SHA-256 of the hex spelling, cut to 128 bits
    /// (`printf %s 00112233445566778899aabbccddeeff | sha256sum`).
    #[test]
    fn the_digest_is_sha256_of_the_hex_cut_to_128_bits() {
        let t = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        assert_eq!(t.digest_hex(), "5947d7c33d783f94b3b4c1a96ebc8991");
        let other = OwnerToken::from_hex("00112233445566778899aabbccddeef0").expect("hex");
        assert_ne!(other.digest_hex(), t.digest_hex());
    }

    #[test]
    fn owner_token_debug_is_redacted() {
        let t = OwnerToken::generate().expect("os rng");
        let debug = format!("{t:?}");
        assert!(!debug.contains(&t.expose_hex()));
        assert_eq!(debug, "OwnerToken(<redacted>)");
    }
}
