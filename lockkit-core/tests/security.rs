//! The security properties the core owns, on the memory backend: owner tokens are 128 random
//! bits from the OS and never repeat; hostile lock names are refused before any backend is
//! called; no owner token shows in `Debug`, `Display`, errors or `tracing` output.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::OwnerToken;
use lockkit_core::testing::{Recording, TraceCapture, assert_nothing_shown, owner_token_spellings};
use lockkit_core::{Error, ErrorKind, LockClient, LockKey, LockOptions, MemoryBackend};

const DRAWS: usize = 1_000_000;

/// 10^6 tokens: no two alike, each 128 bits (32 hex digits), and every one of the 128 bit
/// positions is set in about half of them (a stuck or biased bit, or a generator with fewer
/// than 128 bits of output, fails this).
#[test]
fn a_million_owner_tokens_are_distinct_and_use_all_128_bits() {
    let mut seen = HashSet::with_capacity(DRAWS);
    let mut ones = [0usize; 128];
    for _ in 0..DRAWS {
        let token = OwnerToken::generate().expect("the OS RNG");
        let hex = token.expose_hex();
        assert_eq!(hex.len(), 32, "not 128 bits: {}", hex.len() * 4);
        let value = u128::from_str_radix(&hex, 16).expect("hex");
        for (bit, count) in ones.iter_mut().enumerate() {
            *count += usize::from(value >> bit & 1 == 1);
        }
        assert!(
            seen.insert(value),
            "a duplicate owner token after {} draws",
            seen.len()
        );
    }
    // Binomial(10^6, 1/2): the standard deviation is 500, so 5000 is ten of them.
    for (bit, count) in ones.iter().enumerate() {
        assert!(
            count.abs_diff(DRAWS / 2) < 5_000,
            "bit {bit} was set in {count} of {DRAWS} tokens"
        );
    }
}

/// A test cannot tell a CSPRNG from a good PRNG, so this one reads the source: tokens are
/// drawn with `getrandom` (the OS generator: getrandom(2) on Linux) and with nothing else.
/// It trips when someone swaps in `rand` or a seeded generator.
#[test]
fn owner_tokens_come_from_the_os_rng() {
    let source = include_str!("../src/token.rs");
    let generate = &source[source
        .find("pub fn generate()")
        .expect("OwnerToken::generate")..];
    let body = &generate[..generate.find("\n    }\n").expect("end of generate")];
    assert!(
        body.contains("getrandom::fill(&mut bytes)"),
        "OwnerToken::generate no longer fills its bytes from getrandom:\n{body}"
    );
    assert!(body.contains("[0u8; 16]"), "not 16 bytes:\n{body}");
    for other in ["rand::", "thread_rng", "SmallRng", "StdRng", "seed"] {
        assert!(
            !source.contains(other),
            "token.rs mentions {other}: owner tokens must come from the OS RNG only"
        );
    }
}

/// Every acquisition, of one key or many, draws a new token through the public API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acquisition_gets_a_fresh_owner_token() {
    let locks = LockClient::new(MemoryBackend::new());
    let mut seen = HashSet::new();
    for i in 0..5_000 {
        let guard = locks
            .mutex(&format!("k{}", i % 3))
            .unwrap()
            .lock()
            .await
            .unwrap();
        assert!(seen.insert(lockkit_core::backend::lease_of(&guard).owner().expose_hex()));
        assert!(guard.release().await.unwrap());
    }
}

/// The hostile names: path tricks, NUL and other control characters, log-line forgers,
/// what ZooKeeper cannot store, and 10 kB.
fn hostile_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "",
        "/",
        "a/b",
        "/etc/passwd",
        ".",
        "..",
        "nul\0byte",
        "\0",
        "new\nline",
        "cr\rlf",
        "tab\t",
        "esc\u{1b}[2J",
        "bell\u{7}",
        "del\u{7f}",
        "c1\u{9b}",
        "rlo\u{202e}txt.exe",
        "isolate\u{2066}",
        "line\u{2028}sep",
        "emoji\u{1f512}",
        "private\u{e000}",
        "\u{fffe}",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    names.push("k".repeat(10 * 1024));
    names.push("k".repeat(LockKey::MAX_LEN + 1));
    names.push(format!("{}/..", "k".repeat(100)));
    names
}

/// Every hostile name is `InvalidKey` through every entry point that takes a name, the message
/// does not repeat the name, and not one call reaches the backend. Hostile namespaces are
/// refused when the client is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_are_invalid_key_before_any_backend_call() {
    let backend = Arc::new(Recording::new(Arc::new(MemoryBackend::new())));
    let locks = LockClient::with_options(backend.clone(), "ns", LockOptions::default()).unwrap();
    for name in hostile_names() {
        let shown = name.escape_debug().to_string();
        let errors = [
            locks.mutex(&name).map(|_| ()).unwrap_err(),
            locks.inspect(&name).await.map(|_| ()).unwrap_err(),
            locks
                .with_lock(&name, async |_| {})
                .await
                .map_err(Error::from)
                .unwrap_err(),
            LockKey::new("ns", &name).map(|_| ()).unwrap_err(),
        ];
        for err in errors {
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{shown}: {err}");
            assert!(!err.is_retryable(), "{shown}");
            if name.chars().count() > 3 {
                assert!(
                    !err.to_string().contains(&name) && !format!("{err:?}").contains(&shown),
                    "the error repeats the hostile name: {err:?}"
                );
            }
        }
        let err = LockClient::with_options(backend.clone(), &name, LockOptions::default())
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidKey,
            "namespace {shown}: {err}"
        );
    }
    assert_eq!(backend.calls(), [], "a hostile name reached the backend");
    let guard = locks.mutex("ordinary").unwrap().lock().await.unwrap();
    assert!(guard.release().await.unwrap());
    assert!(backend.calls().len() >= 2, "the recording records");
}

/// The owner token of a grant shows nowhere: not in the `Debug` of the guard, the lease, the
/// client or the lock info, not in the errors of a lost lock, and not in anything traced
/// (at TRACE level, from every thread) while it was acquired, contended, renewed, lost and
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_tokens_stay_out_of_debug_errors_and_traces() {
    let capture = TraceCapture::install();
    let memory = MemoryBackend::new();
    let namespace = format!("sec-{:08x}", rand::random::<u32>());
    let ttl = Duration::from_millis(300);
    let locks = LockClient::with_options(
        Arc::new(memory.clone()),
        &namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .unwrap();
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    let secrets = owner_token_spellings(lockkit_core::backend::lease_of(&guard).owner());
    assert!(
        locks
            .mutex("job")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::sleep(ttl).await;
    guard.extend().await.unwrap();
    let info = locks.inspect("job").await.unwrap();
    let mut shown = vec![
        format!("{guard:?}"),
        format!("{:?}", lockkit_core::backend::lease_of(&guard)),
        format!("{:?}", lockkit_core::backend::lease_of(&guard).owner()),
        format!("{locks:?}"),
        format!("{info:?}"),
        guard.fencing_token().to_string(),
        guard.key().to_string(),
    ];
    memory.force_release(guard.key());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires");
    let lost = guard.extend().await.unwrap_err();
    shown.push(format!("{lost} {lost:?}"));
    assert!(!guard.release().await.unwrap());

    assert_nothing_shown(&capture, &namespace, &shown, &secrets);
}
