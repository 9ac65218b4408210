//! Redlock's listing when nodes do not answer: a node that does not answer is skipped (a held
//! lock is on a majority of the others), but once more nodes were skipped than may fail, the
//! listing is an error, never a page that leaves out a lock held on the silent majority.
//!
//! The lister reaches three of the five nodes through fault proxies that swallow its
//! requests; the shared servers themselves are never paused.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::LockBackend;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockKey, LockOptions};
use lockkit_redis::RedlockBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_cannot_reach_a_majority_fails_instead_of_leaving_locks_out() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let common::Topology::Redlock(config) = &harness.topology else {
        panic!("the redlock harness runs on Redlock");
    };
    assert_eq!(config.nodes.len(), 5, "this test needs five nodes");
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let holder = LockClient::with_options(
        Arc::new(RedlockBackend::connect(config.clone()).await.unwrap()),
        &namespace,
        LockOptions::default().with_ttl(Duration::from_secs(20)),
    )
    .unwrap();
    let held = holder.mutex("listed").unwrap().lock().await.unwrap();
    // Held on the first three nodes only: the two the lister reaches do not have it.
    let key = common::lock_key(&LockKey::new(&namespace, "listed").unwrap());
    let mut nodes = harness.servers().await.unwrap();
    for node in &mut nodes[3..] {
        let _: i64 = redis::cmd("DEL").arg(&key).query_async(node).await.unwrap();
    }

    let mut proxies = Vec::new();
    let mut lister_config = config.clone();
    for slot in &mut lister_config.nodes[..3] {
        let proxy = FaultProxy::start(std::slice::from_ref(slot)).await.unwrap();
        *slot = proxy.hosts()[0].clone();
        proxies.push(proxy);
    }
    let lister = RedlockBackend::connect(lister_config).await.unwrap();
    for proxy in &proxies {
        proxy.set(Direction::Both, Fault::Blackhole);
    }
    let mut cursor = None;
    let listed = loop {
        match lister.list(&namespace, "", cursor.as_deref(), 10).await {
            Ok(page) => {
                assert!(
                    page.locks.is_empty(),
                    "listed through a minority: {:?}",
                    page.locks
                );
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break Ok(()),
                }
            }
            Err(e) => break Err(e),
        }
    };
    assert!(
        listed.is_err(),
        "with three of five nodes silent the listing answered 'no locks' while one was held"
    );
    for proxy in &proxies {
        proxy.heal();
    }
    held.release().await.unwrap();
}
