//! Redlock's fencing-token write-back: when the granting nodes disagree on the token, the
//! maximum is written back so that a majority holds it before the grant is returned, and the
//! next grant's token is larger whatever the clocks say.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use lockkit_core::{LockClient, LockOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_nodes_get_the_maximum_token_written_back() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(
        harness.backend().await.unwrap(),
        &namespace,
        LockOptions::default(),
    )
    .unwrap();
    let mut nodes = harness.servers().await.unwrap();
    let fence = format!("{{{namespace}/fenced}}:fence");
    let now_us = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };

    // Two nodes (a minority) have counters far ahead of every clock. A grant whose majority
    // includes one of them gets a token only they had: it must be written back.
    let mut checked = false;
    for attempt in 0..20u64 {
        let ahead = now_us() + 1_000_000_000_000 * (attempt + 1);
        for node in &mut nodes[..2] {
            let _: () = redis::cmd("SET")
                .arg(&fence)
                .arg(ahead)
                .arg("PX")
                .arg(3_600_000)
                .query_async(node)
                .await
                .unwrap();
        }
        let guard = locks.mutex("fenced").unwrap().lock().await.unwrap();
        let token = guard.fencing_token().get();
        if token > ahead {
            let mut at_least = 0;
            for node in &mut nodes {
                let counter: Option<u64> = redis::cmd("GET")
                    .arg(&fence)
                    .query_async(node)
                    .await
                    .unwrap();
                at_least += usize::from(counter.is_some_and(|c| c >= token));
            }
            assert!(
                at_least >= 3,
                "token {token} was granted but only {at_least} of 5 counters hold it"
            );
            guard.release().await.unwrap();
            let next = locks.mutex("fenced").unwrap().lock().await.unwrap();
            assert!(
                next.fencing_token().get() > token,
                "the next token went back"
            );
            next.release().await.unwrap();
            checked = true;
            break;
        }
        guard.release().await.unwrap();
    }
    assert!(
        checked,
        "no grant in 20 tries included a node that was ahead"
    );
}
