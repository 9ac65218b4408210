//! Checks that secrets stay out of what lockkit prints: a process-wide `tracing` capture and
//! a search for every spelling of a secret.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};

use tracing_subscriber::fmt::format::FmtSpan;

use crate::token::OwnerToken;

/// Everything `tracing` emits in this process, at `TRACE` level and from every crate (lockkit,
/// the client libraries, tonic, h2, ...), with the fields of every span as it is created.
///
/// The subscriber is global, not thread-local, because lockkit does much of its work on its
/// own runtime thread (renewals, background releases, connection drivers), where a
/// `with_default` subscriber would see nothing. Install it once per test binary, before the
/// first lock call; tests of one binary share the buffer, so each test searches for secrets of
/// its own (random ones), and checks [`TraceCapture::contains`] for something its own run
/// must have logged, so that an empty capture cannot pass for a clean one.
#[derive(Clone)]
pub struct TraceCapture {
    buffer: Arc<StdMutex<Vec<u8>>>,
}

static CAPTURE: OnceLock<TraceCapture> = OnceLock::new();

impl TraceCapture {
    /// Installs the capture as the global subscriber (the first call) and returns it.
    ///
    /// # Panics
    /// When another global subscriber was installed first.
    pub fn install() -> TraceCapture {
        CAPTURE
            .get_or_init(|| {
                let capture = TraceCapture {
                    buffer: Arc::default(),
                };
                let writer = capture.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::TRACE)
                    .with_span_events(FmtSpan::NEW)
                    .with_thread_names(true)
                    .with_writer(move || writer.clone())
                    .finish();
                if let Err(e) = tracing::subscriber::set_global_default(subscriber) {
                    panic!("cannot install the trace capture: {e}");
                }
                capture
            })
            .clone()
    }

    /// The captured output so far.
    pub fn text(&self) -> String {
        let bytes = self
            .buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether the captured output contains `needle`.
    pub fn contains(&self, needle: &str) -> bool {
        self.text().contains(needle)
    }

    /// The captured lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for TraceCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl fmt::Debug for TraceCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = self
            .buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len();
        f.debug_struct("TraceCapture").field("bytes", &len).finish()
    }
}

/// The ways an owner token could be printed by mistake: its lowercase and uppercase hex, the
/// `Debug` of its bytes (`[12, 255, ...]`), and its bytes as one decimal `u128`.
pub fn owner_token_spellings(token: &OwnerToken) -> Vec<String> {
    let hex = token.expose_hex();
    let bytes: Vec<u8> = (0..16)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    let number = bytes.iter().fold(0u128, |n, b| (n << 8) | u128::from(*b));
    vec![
        hex.to_ascii_uppercase(),
        format!("{bytes:?}"),
        number.to_string(),
        hex,
    ]
}

/// The ways a password (or any secret string) could be printed by mistake: as written, as
/// the `Debug` of its bytes (`112, 119, ...`, the form a byte buffer holding it takes) and as
/// lowercase hex.
pub fn secret_spellings(secret: &str) -> Vec<String> {
    let bytes = format!("{:?}", secret.as_bytes());
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    vec![
        secret.to_owned(),
        bytes
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        hex,
    ]
}

/// Panics, naming `what` and quoting the place, if `text` contains any of `secrets`.
///
/// # Panics
/// When a secret is found.
#[track_caller]
pub fn assert_no_secret<S: AsRef<str>>(what: &str, text: &str, secrets: &[S]) {
    for secret in secrets {
        let secret = secret.as_ref();
        assert!(!secret.is_empty(), "an empty secret matches everything");
        if let Some(at) = text.find(secret) {
            let mut from = at.saturating_sub(200);
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            let mut to = (at + secret.len() + 200).min(text.len());
            while !text.is_char_boundary(to) {
                to += 1;
            }
            panic!(
                "{what} shows the secret {secret:?}: ...{}...",
                &text[from..to]
            );
        }
    }
}

/// The end of every secrets test: no secret in any of the `shown` texts (`Debug` and
/// `Display` output), nor in what `capture` recorded, and the capture did record the run (a
/// line naming `namespace`, and a renewal, which runs on lockkit's own thread).
///
/// # Panics
/// When a secret is found, or the capture missed the run.
#[track_caller]
pub fn assert_nothing_shown<S: AsRef<str>>(
    capture: &TraceCapture,
    namespace: &str,
    shown: &[String],
    secrets: &[S],
) {
    for text in shown {
        assert_no_secret("Debug/Display output", text, secrets);
    }
    assert!(
        capture.contains(namespace) && capture.contains("lockkit.renew"),
        "the capture missed the run: {}",
        capture.text()
    );
    assert_no_secret("the trace output", &capture.text(), secrets);
}

/// Runs a whole lock cycle on `locks` (and `other`, a second client of the same servers) for
/// the secret searches: acquire, a contended `try_lock`, a queued waiter, renewals past the
/// TTL, a hand `extend`, `inspect`, release, the waiter granted and released. Returns every
/// spelling of the owner tokens it used and what `Debug` showed of the guards, leases,
/// clients, backends and lock info on the way.
///
/// # Panics
/// When a step of the cycle fails.
pub async fn exercise(
    locks: &crate::LockClient,
    other: &crate::LockClient,
    ttl: std::time::Duration,
) -> (Vec<String>, Vec<String>) {
    let guard = locks
        .mutex("job")
        .expect("a valid key")
        .lock()
        .await
        .expect("the lock");
    let mut secrets = owner_token_spellings(crate::backend::lease_of(&guard).owner());
    let contended = other
        .mutex("job")
        .expect("a valid key")
        .try_lock()
        .await
        .expect("try_lock answers");
    assert!(contended.is_none(), "the lock was granted twice");
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            other
                .mutex("job")?
                .lock_timeout(std::time::Duration::from_secs(15))
                .await
        })
    };
    tokio::time::sleep(ttl * 2).await;
    guard.extend().await.expect("extend");
    let info = other.inspect("job").await.expect("inspect");
    let mut shown = vec![
        format!("{guard:?}"),
        format!("{:?}", crate::backend::lease_of(&guard)),
        format!("{info:?}"),
        format!("{locks:?} {other:?}"),
        format!("{:?}", locks.backend()),
    ];
    assert!(!guard.is_lost(), "the lock was lost while renewed");
    assert!(
        guard.release().await.expect("release"),
        "the lock was not held at release"
    );
    let next = waiter
        .await
        .expect("the waiter did not panic")
        .expect("the waiter was granted");
    secrets.extend(owner_token_spellings(
        crate::backend::lease_of(&next).owner(),
    ));
    shown.push(format!("{next:?} {:?}", crate::backend::lease_of(&next)));
    assert!(
        next.release().await.expect("release"),
        "the waiter's lock was not held"
    );
    (secrets, shown)
}
