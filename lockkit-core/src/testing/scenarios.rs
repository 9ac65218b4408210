//! The registry of the conformance suite's scenarios (each module of `testing` holds those
//! of one primitive; each reads as the behaviour it proves), and the helpers they share.

use std::time::{Duration, Instant};

use super::cancel::*;
use super::election::{
    a_cancelled_campaign_leaves_nothing_behind, a_crashed_leader_is_replaced_after_its_ttl,
    a_deposed_leader_cannot_proclaim, observe_ends_on_the_current_leader_in_term_order,
    one_leader_at_a_time_with_increasing_terms, resign_hands_over_at_once,
    run_as_leader_cancels_the_work_when_leadership_is_lost, the_leader_shows_its_proclaimed_value,
};
use super::fairness::{
    a_non_fair_waiter_is_woken_by_a_release, cancelled_non_fair_acquisitions_leave_nothing_behind,
    fair_and_non_fair_acquirers_exclude_each_other,
    fair_permit_waiters_are_granted_in_the_order_they_came,
    fair_waiters_are_granted_in_the_order_they_came,
    waiting_writers_are_granted_in_the_order_they_came,
};
use super::multi::{
    a_cancelled_lock_all_leaves_nothing_behind, lock_all_over_overlapping_sets_never_deadlocks,
    lock_all_reports_the_loss_of_any_part, lock_all_takes_nothing_when_a_part_is_taken,
};
use super::mutex::*;
use super::operator::{
    force_release_breaks_the_lock_and_the_holder_reports_lost,
    list_shows_the_held_locks_by_prefix_page_by_page,
};
use super::rwlock::{
    a_crashed_reader_frees_the_lock_after_its_ttl, a_stream_of_readers_does_not_starve_a_writer,
    a_waiting_writer_blocks_new_readers, a_writer_that_gave_up_does_not_block_readers,
    an_rwlock_is_independent_of_the_mutex_and_semaphore_of_its_name,
    readers_share_and_a_writer_excludes_everyone, readers_share_until_a_writer_comes,
    renewal_keeps_a_write_lock_past_its_ttl,
};
use super::semaphore::{
    a_cancelled_permit_acquisition_leaves_nothing_behind,
    a_crashed_holder_frees_its_permit_after_its_ttl, a_permit_release_wakes_a_waiter,
    a_semaphore_admits_exactly_its_permits, a_semaphore_and_the_mutex_of_its_name_are_independent,
    a_semaphore_never_admits_more_than_its_permits, disagreeing_permit_counts_are_refused,
    fair_and_non_fair_permit_holders_never_exceed_the_permits, renewal_keeps_a_permit_past_its_ttl,
};
use super::validity::{
    a_reentrant_share_is_handed_out_with_useful_validity,
    a_short_grant_that_cannot_be_confirmed_is_given_back_and_taken_again,
    a_short_leadership_grant_is_confirmed_before_it_is_handed_out,
    a_short_mutex_grant_is_confirmed_before_it_is_handed_out,
    a_short_permit_or_rwlock_grant_is_confirmed_before_it_is_handed_out,
    lock_all_hands_out_every_part_with_useful_validity,
};
use super::{Failure, Harness, Outcome, Scenario};
use crate::client::LockClient;
use crate::options::LockOptions;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// Every scenario, by name, in the order [`run_all`](super::run_all) runs them.
        pub static SCENARIOS: &[(&str, Scenario)] = &[
            $((stringify!($name), |h| Box::pin($name(h)))),*
        ];
    };
}

crate::__conformance_scenarios!([scenarios] []);

/// A long TTL: a lock that is freed before it runs out was freed on purpose.
pub(super) const LONG_TTL: Duration = Duration::from_secs(60);

/// A fresh random namespace, so scenarios never see each other's keys.
pub(super) fn namespace() -> String {
    format!("lk-test-{:08x}", rand::random::<u32>())
}

pub(super) fn options(h: &dyn Harness) -> LockOptions {
    LockOptions::default()
        .with_ttl(h.ttl())
        .with_backoff(Duration::from_millis(5), Duration::from_millis(100))
}

pub(super) async fn clients(
    h: &dyn Harness,
    ns: &str,
    n: usize,
) -> Result<Vec<LockClient>, Failure> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(h.client(ns, options(h)).await?);
    }
    Ok(out)
}

/// Generous bound for anything that should happen within a few TTLs.
pub(super) fn patience(h: &dyn Harness) -> Duration {
    h.ttl() * 4 + Duration::from_secs(10)
}

pub(super) async fn expect_no_leftovers(h: &dyn Harness, ns: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = h.leftovers(ns).await?;
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "records left on the server under {ns}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
