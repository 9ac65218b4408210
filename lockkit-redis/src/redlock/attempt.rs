//! One Redlock acquisition attempt: the fan-out of the acquire script, the answers counted
//! until they decide, and the rollback of an attempt that did not win a majority.
//!
//! Measured before this design, a contended attempt spent most of its time waiting for nodes
//! that could not change its outcome, and then for its own rollback (docs/measurements.md,
//! "Redlock: where a contended attempt spent its time").
//!
//! # What an attempt does now
//! - It stops as soon as the answers decide: a majority granted, or so many nodes answered
//!   "contended" (or failed) that the silent ones cannot make a majority any more (3 of 5
//!   contended: the other 2 are not waited for).
//! - A failed attempt's rollback is *sent* at once, in the acquisition's lanes (see
//!   `lanes.rs`), to the nodes that answered and may hold its key (they granted, or failed),
//!   and not awaited: the waiter goes on to wait or retry while it runs. A node still silent
//!   rolls back in the lane slot of the attempt's own acquire, as soon as it answers and only
//!   if that answer may have left a key: sending every silent node a rollback cost two
//!   requests per contended attempt, almost all of them after a clean "contended", and on a
//!   CPU-bound machine more throughput than the early stop saved.
//! - Nothing is lost by not awaiting: a lane runs its requests in order on each node and
//!   pursues each for the TTL whether or not anyone waits; the acquisition's next attempt,
//!   its `abandon` (the core calls it when the acquisition gives up, and in the background,
//!   counted by `LockClient::close`, when the acquisition is dropped) and its release all
//!   queue behind the rollback in the same lanes, so none of them overtakes it and none of
//!   them answers before it on a node. (Like every laned straggler before, a rollback to a
//!   node that stays silent past `abandon`'s node timeout is still pursued after `close`
//!   returned, until the TTL ends what it could do.)
//!
//! # Queueing
//! A waiting acquisition's attempt also queues it on every node, at its turn (see `wait.rs`):
//! a free node grants only the first waiter of its queue, so later arrivals cannot take the
//! lock from a waiter, and a release hands each node's key over directly. A queued waiter's
//! rollback keeps its place, unless the attempt reached too few nodes for a majority: each
//! node gives the key to whoever is first there, the waiter again if nobody came before it (rolling it out of some nodes' queues let them hand the
//! key to later waiters, whose minorities then blocked everyone until entries lapsed: of
//! eight W2 runs of that version, one made 160 increments/s and one stalled past 30 s). A
//! `try_lock` neither queues nor keeps anything. A waiter cut off from a majority (its
//! attempt failed on so many nodes that no majority could answer) would keep the nodes it
//! still reaches for itself, their keys handed back to it by every release, so that the
//! others would need every remaining node: its rollback leaves those queues, and its attempts
//! do not queue until one reaches a majority again (its turn is kept for then).
//!
//! (Before the queues, an earlier version of these docs argued that hand-overs could not
//! pay on N independent nodes: the queues would disagree and each split would cost a
//! rollback. Ordering every node's queue by the same turn is what makes them agree; the
//! splits that remain resolve in favour of the earliest turn.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant};
use lockkit_core::{Error, FencingToken, Result};
use redis::Value;

use super::fanout::{self, FollowUp, NodeResult};
use super::{BACKEND, RedlockBackend, proposed_token};
use crate::scripts::{self, AcquireReply, Keys, millis};

/// What one node's acquire did, as the attempt knows it.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// No reply yet, and the attempt still counts on it.
    Pending,
    /// Replied: whether the node may hold the attempt's key (it granted, or failed in a way
    /// that may have applied the script).
    Answered { may_hold: bool },
    /// The attempt gave up before the reply: the node's own lane slot rolls it back.
    Lost,
}

/// Whether a reply to the acquire script may have left the attempt's key: anything but a
/// clean "contended".
fn may_hold(reply: &redis::RedisResult<Value>) -> bool {
    !matches!(
        reply
            .as_ref()
            .map(|value| scripts::acquire_reply(BACKEND, value)),
        Ok(Ok(AcquireReply::Contended(_)))
    )
}

/// What the answers of one attempt say so far, node by node.
#[derive(Debug)]
pub(super) struct Tally {
    /// Per node: `None` while it has not answered.
    answers: Vec<Option<Result<AcquireReply>>>,
    quorum: usize,
}

impl Tally {
    fn of(replies: &[Option<NodeResult<Value>>], quorum: usize) -> Tally {
        let answers = replies
            .iter()
            .map(|reply| {
                reply.as_ref().map(|reply| {
                    reply
                        .as_ref()
                        .map_err(crate::error::repeat)
                        .and_then(|value| scripts::acquire_reply(BACKEND, value))
                })
            })
            .collect();
        Tally { answers, quorum }
    }

    fn granted(&self) -> usize {
        self.tokens().len()
    }

    fn tokens(&self) -> Vec<FencingToken> {
        self.answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(AcquireReply::Granted(token))) => Some(*token),
                _ => None,
            })
            .collect()
    }

    fn contended(&self, i: usize) -> bool {
        matches!(self.answers[i], Some(Ok(AcquireReply::Contended(_))))
    }

    fn failed(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| matches!(a, Some(Err(_))))
            .count()
    }

    fn silent(&self) -> usize {
        self.answers.iter().filter(|a| a.is_none()).count()
    }

    /// Whether the answers so far decide the attempt: a majority granted, or the nodes that
    /// could still grant are fewer than a majority.
    pub(super) fn decided(&self) -> bool {
        self.granted() >= self.quorum || self.granted() + self.silent() < self.quorum
    }

    /// Whether so many nodes failed that no majority can answer at all: a quorum error,
    /// not contention. With every node answered this is the rule it always was (fewer than a
    /// majority granted or said "contended").
    fn unreachable(&self) -> bool {
        self.failed() > self.answers.len() - self.quorum
    }

    /// When the lock may free up for this acquisition: when enough of the holders' keys are
    /// gone that its own keys and the freed nodes make a majority.
    fn frees_up(&self, ttl: Duration) -> Duration {
        let mut holder_ttls: Vec<Duration> = self
            .answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(AcquireReply::Contended(left))) => Some(left.unwrap_or(ttl)),
                _ => None,
            })
            .collect();
        holder_ttls.sort();
        let needed = self.quorum.saturating_sub(self.granted()).saturating_sub(1);
        holder_ttls
            .get(needed)
            .or(holder_ttls.last())
            .copied()
            .unwrap_or(ttl)
    }

    fn errors(&self) -> Vec<Option<&Error>> {
        self.answers
            .iter()
            .map(|a| a.as_ref().and_then(|a| a.as_ref().err()))
            .collect()
    }
}

impl RedlockBackend {
    /// One attempt (see the module docs).
    pub(super) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let keys = Keys::of(&request.key);
        let quorum = self.quorum();
        let marker = self.notifications.load(Ordering::SeqCst);
        // A waiter is registered before the attempt that queues it, so that it misses no
        // hand-over announced from then on.
        let digest = request.owner.digest_hex();
        // A non-fair attempt neither queues nor waits for a hand-over: it takes a free lock
        // whoever queues for it, and its waiter listens for releases (`wait.rs`).
        let handover = (request.wait && request.fair).then(|| self.inbox.expect(&digest));
        let queued_as = handover
            .as_ref()
            .map(|handover| handover.attempting(&digest));
        let slots = Arc::new(StdMutex::new(vec![Slot::Pending; self.nodes.len()]));
        // A waiter cut off from a majority does not queue (see the module docs).
        let queues = handover.as_ref().filter(|handover| !handover.is_cut_off());
        let (queue, inbox, turn) = match queues {
            Some(handover) => (
                "1".to_owned(),
                self.inbox.name().to_owned(),
                handover.turn().to_string(),
            ),
            None => (String::new(), String::new(), String::new()),
        };
        let queued_as = queued_as.unwrap_or_default();
        // A queued waiter's rollback keeps its place (`keep`): the keys go to whoever is
        // first in each node's queue, itself again if nobody came before it. One that
        // reached too few nodes leaves the queue instead (`leave`).
        // A non-fair attempt's rollback is published: split votes leave every contender
        // with a minority, and their rollbacks are what frees the lock for the next try.
        let leave_args = self.release_args(
            &request.owner,
            (!request.fair).then_some(keys.channel.as_str()),
        );
        let mut keep_args = leave_args.clone();
        if queues.is_some() {
            keep_args.extend([
                millis(request.ttl).to_string(),
                queued_as.clone(),
                inbox.clone(),
                turn.clone(),
            ]);
        }
        let rollback = |args: &[String]| {
            Arc::new(fanout::invocation(
                &scripts::classic().release,
                &keys.release()[..4],
                args,
            ))
        };
        let (keep, leave) = (rollback(&keep_args), rollback(&leave_args));
        let cut_off = Arc::new(AtomicBool::new(false));
        let follow_up: FollowUp = {
            let (slots, cut_off) = (slots.clone(), cut_off.clone());
            Arc::new(move |i, reply| {
                let may_hold = may_hold(reply);
                let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
                match slots[i] {
                    // The attempt gave up before this node answered: its key, if it got one,
                    // goes now, in the same lane slot.
                    Slot::Lost => may_hold.then(|| {
                        if cut_off.load(Ordering::SeqCst) {
                            leave.clone()
                        } else {
                            keep.clone()
                        }
                    }),
                    _ => {
                        slots[i] = Slot::Answered { may_hold };
                        None
                    }
                }
            })
        };
        // Returns as soon as the answers decide: with a majority granted, the stragglers'
        // keys are ours and go with the release, which is sent to every node.
        let all = keys.acquire();
        let replies = self
            .fan_out(
                &request.owner,
                &scripts::classic().acquire,
                if request.fair { &all[..] } else { &all[..2] },
                &[
                    request.owner.expose_hex(),
                    millis(request.ttl).to_string(),
                    millis(self.config.fence_ttl).to_string(),
                    proposed_token().to_string(),
                    queue,
                    queued_as,
                    inbox,
                    turn,
                ],
                request.ttl,
                Some(follow_up),
                move |answers| Tally::of(answers, quorum).decided(),
            )
            .await;
        let tally = Tally::of(&replies, quorum);
        let unreachable = tally.unreachable();
        if let Some(handover) = &handover {
            handover.set_cut_off(unreachable);
        }
        let tokens = tally.tokens();
        if let Some(token) = tokens
            .iter()
            .copied()
            .max()
            .filter(|_| tokens.len() >= quorum)
        {
            self.inbox.forget(&digest);
            // A majority whose counters are already at the token needs no write-back.
            if tokens.iter().filter(|t| **t == token).count() >= quorum {
                return Ok(Attempt::Granted(Grant::new(
                    token,
                    self.validity(request.ttl),
                )));
            }
            return match self.raise_fences(request, token).await {
                Ok(()) => Ok(Attempt::Granted(Grant::new(
                    token,
                    self.validity(request.ttl),
                ))),
                Err(e) => {
                    self.release_on_all(&request.key, &request.owner, request.ttl)
                        .await;
                    Err(e)
                }
            };
        }
        // The nodes that answered and may hold a key get the rollback now; those still
        // silent roll back in their own lane slot once they answer (see `follow_up`).
        let answered_holding: Vec<usize> = {
            let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
            // Under the slots' lock, so that a node that answers late rolls back as the
            // answered ones do.
            cut_off.store(unreachable, Ordering::SeqCst);
            slots
                .iter_mut()
                .enumerate()
                .filter_map(|(i, slot)| match *slot {
                    Slot::Pending => {
                        *slot = Slot::Lost;
                        None
                    }
                    Slot::Answered { may_hold } => may_hold.then_some(i),
                    Slot::Lost => None,
                })
                .collect()
        };
        let rollback_args = if unreachable { &leave_args } else { &keep_args };
        self.roll_back(request, rollback_args, &answered_holding);
        if unreachable {
            let got = tally.granted() + (0..replies.len()).filter(|i| tally.contended(*i)).count();
            return Err(self.quorum_error_of("acquiring", got, &tally.errors()));
        }
        Ok(Attempt::Contended(
            Contention::new()
                .with_retry_after(tally.frees_up(request.ttl))
                .with_marker(marker),
        ))
    }

    /// Sends the release of a failed attempt (its `args`) to `nodes` in the acquisition's
    /// lanes, and returns without awaiting the answers (see the module docs).
    fn roll_back(&self, request: &AcquireRequest, args: &[String], nodes: &[usize]) {
        if nodes.is_empty() {
            return;
        }
        let keys = Keys::of(&request.key);
        let sent = self.send_script(
            &request.owner,
            &scripts::classic().release,
            &keys.release()[..4],
            args,
            request.ttl,
            |i| nodes.contains(&i),
            None,
        );
        // Each request lives in its lane's task: nobody needs its answer.
        drop(sent);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::error::unexpected;

    fn granted() -> Option<NodeResult<Value>> {
        Some(Ok(Value::Array(vec![Value::Int(1), Value::Int(7)])))
    }

    fn contended(pttl: i64) -> Option<NodeResult<Value>> {
        Some(Ok(Value::Array(vec![Value::Int(0), Value::Int(pttl)])))
    }

    fn failed() -> Option<NodeResult<Value>> {
        Some(Err(unexpected(BACKEND, "a test node")))
    }

    #[test]
    fn three_of_five_contended_decide_without_the_other_two() {
        let tally = Tally::of(
            &[contended(900), None, contended(800), contended(700), None],
            3,
        );
        assert!(tally.decided());
        assert!(!tally.unreachable());
    }

    #[test]
    fn an_attempt_that_can_still_win_is_not_decided() {
        let tally = Tally::of(&[contended(900), granted(), contended(800), None, None], 3);
        assert!(
            !tally.decided(),
            "two silent nodes and one grant can still make 3"
        );
    }

    #[test]
    fn a_majority_granted_decides() {
        let tally = Tally::of(&[granted(), granted(), None, granted(), None], 3);
        assert!(tally.decided());
    }

    #[test]
    fn failures_with_contention_are_contention_unless_no_majority_answers() {
        let contention = Tally::of(&[failed(), contended(500), failed(), None, None], 3);
        assert!(contention.decided());
        assert!(!contention.unreachable());
        let down = Tally::of(&[failed(), granted(), failed(), granted(), failed()], 3);
        assert!(down.decided());
        assert!(down.unreachable());
    }

    #[test]
    fn the_lock_frees_up_when_enough_holder_keys_are_gone_for_a_majority() {
        let ttl = Duration::from_secs(10);
        // One node is ours: two more must free up, the second-shortest holder TTL.
        let tally = Tally::of(
            &[
                granted(),
                contended(300),
                contended(100),
                contended(200),
                None,
            ],
            3,
        );
        assert_eq!(tally.frees_up(ttl), Duration::from_millis(200));
        // Too few holders known: the longest known one, not the whole TTL.
        let partial = Tally::of(&[failed(), contended(300), failed(), None, None], 3);
        assert_eq!(partial.frees_up(ttl), Duration::from_millis(300));
    }
}
