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

    let snapshot: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
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
        1
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
