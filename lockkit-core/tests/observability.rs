//! Metrics and traces: acquisitions, contention and losses are counted, and no owner token
//! ever reaches the trace output. One test, because it installs process-wide recorders.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::TraceCapture;
use lockkit_core::{LockClient, LockOptions, MemoryBackend, metrics};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// One metric: name, labels, value.
type Sample = (String, Vec<(String, String)>, DebugValue);

fn counter(snapshot: &[Sample], name: &str, label: Option<(&str, &str)>) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name && label.is_none_or(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, value)| match value {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_contention_and_losses_are_counted_and_tokens_never_traced() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("install the metrics recorder");
    let capture = TraceCapture::install();

    let memory = MemoryBackend::new();
    let options = LockOptions::default().with_ttl(Duration::from_millis(300));
    let locks =
        LockClient::with_options(Arc::new(memory.clone()), "observed", options).expect("client");
    let guard = locks.mutex("job").expect("key").lock().await.expect("lock");
    let secret = lockkit_core::backend::lease_of(&guard).owner().expose_hex();
    assert!(
        locks
            .mutex("job")
            .expect("key")
            .try_lock()
            .await
            .expect("try")
            .is_none()
    );
    memory.force_release(guard.key());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires");
    assert!(!guard.release().await.expect("release"));
    // A hold that ends with a release, and an acquisition cancelled while it waits.
    let busy = locks
        .mutex("busy")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    let waiting = locks.mutex("busy").expect("key");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), waiting.lock())
            .await
            .is_err()
    );
    assert!(busy.release().await.expect("release"));
    locks.close().await;

    let full = snapshotter.snapshot().into_vec();
    for name in metrics::ALL {
        let (_, unit, description, _) = full
            .iter()
            .find(|(key, ..)| key.key().name() == name)
            .unwrap_or_else(|| panic!("{name} was never recorded"));
        assert!(
            unit.is_some() && description.is_some(),
            "{name} is not described"
        );
    }
    let snapshot: Vec<_> = full
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, value)
        })
        .collect();
    assert_eq!(
        counter(
            &snapshot,
            metrics::ACQUIRE_TOTAL,
            Some(("outcome", "granted"))
        ),
        2,
        "job and busy"
    );
    assert_eq!(
        counter(
            &snapshot,
            metrics::ACQUIRE_TOTAL,
            Some(("outcome", "contended"))
        ),
        1
    );
    assert!(counter(&snapshot, metrics::CONTENDED_TOTAL, None) >= 1);
    assert_eq!(
        counter(&snapshot, metrics::LOST_TOTAL, Some(("backend", "memory"))),
        1
    );
    assert!(
        snapshot
            .iter()
            .any(|(n, _, _)| n == metrics::ACQUIRE_SECONDS)
    );
    assert_eq!(
        counter(
            &snapshot,
            metrics::ACQUIRE_TOTAL,
            Some(("outcome", "cancelled"))
        ),
        1,
        "the acquisition dropped while waiting"
    );
    assert!(
        snapshot
            .iter()
            .all(|(_, labels, _)| labels.iter().any(|(k, v)| k == "tier" && v == "local")),
        "a series without its tier label"
    );
    let held: Vec<f64> = snapshot
        .iter()
        .filter(|(n, ..)| n == metrics::HELD_LOCKS)
        .map(|(.., value)| match value {
            DebugValue::Gauge(g) => g.into_inner(),
            _ => f64::NAN,
        })
        .collect();
    assert_eq!(held, [0.0], "the held-locks gauge once every hold ended");
    let holds = snapshot
        .iter()
        .find_map(|(n, _, value)| match value {
            DebugValue::Histogram(h) if n == metrics::HOLD_SECONDS => Some(h.len()),
            _ => None,
        })
        .unwrap_or(0);
    assert_eq!(holds, 2, "one hold lost, one released");

    let traces = capture.text();
    assert!(
        traces.contains("lockkit.acquire"),
        "no acquire span in the traces:\n{traces}"
    );
    assert!(
        traces.contains("lock lost"),
        "the loss was not traced:\n{traces}"
    );
    assert!(
        !traces.contains(&secret),
        "an owner token reached the traces"
    );
}
