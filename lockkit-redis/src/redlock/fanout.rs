//! How [`RedlockBackend`] asks every node at once: the fan-out, the answers gathered until
//! they decide the outcome, and the lanes (see `lanes.rs`) that carry every request that
//! changes a lock.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockkit_core::backend::{Backoff, OwnerToken};
use lockkit_core::{Error, ErrorKind};
use redis::Value;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::{BACKEND, RedlockBackend};
use crate::error::{from_redis, timed_out, unexpected};

/// How many times a gather whose deadline passed lets lockkit's other tasks run, taking the
/// answers they deliver, before it counts the nodes still silent as timed out.
const LATE_ROUNDS: usize = 3;

/// One node's answer, or why it gave none.
pub(super) type NodeResult<T> = std::result::Result<T, Error>;

/// Given a node's index and its reply to a laned request, the request to send it next in
/// the same lane slot, if any (see [`RedlockBackend::send_script`]).
pub(super) type FollowUp = Arc<
    dyn Fn(usize, &redis::RedisResult<Value>) -> Option<Arc<redis::ScriptInvocation<'static>>>
        + Send
        + Sync,
>;

/// `script` with its keys and arguments.
pub(super) fn invocation(
    script: &'static redis::Script,
    keys: &[&str],
    args: &[String],
) -> redis::ScriptInvocation<'static> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in args {
        invocation.arg(arg);
    }
    invocation
}

/// Runs a laned script on one node. A request that met a dropped connection (the node
/// restarted, or is down) was not applied: it is sent again, with backoff, until the lane
/// gives up on it. Every laned script may be repeated: a second acquire by the same owner
/// returns its grant, a second release finds nothing to delete.
async fn invoke_retrying(
    invocation: &redis::ScriptInvocation<'static>,
    con: &mut ConnectionManager,
) -> redis::RedisResult<Value> {
    let mut pause = Backoff::new(Duration::from_millis(20), Duration::from_millis(250));
    loop {
        match invocation.invoke_async::<Value>(con).await {
            Err(e) if e.is_connection_dropped() || e.is_connection_refusal() => {
                tokio::time::sleep(pause.next_delay()).await;
            }
            outcome => break outcome,
        }
    }
}

impl RedlockBackend {
    /// Runs `request` on every node at once (on the renewal connections if `renewal`), each
    /// bounded by `bound`, and waits for every answer.
    pub(super) async fn on_all<T, F, Fut>(
        &self,
        bound: Duration,
        renewal: bool,
        request: F,
    ) -> Vec<NodeResult<T>>
    where
        T: Send + 'static,
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        self.on_all_until(bound, renewal, request, |_| false)
            .await
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(unexpected(BACKEND, "a node"))))
            .collect()
    }

    /// As [`RedlockBackend::on_all`], but returns as soon as `enough` says the answers so
    /// far decide the outcome; the nodes that have not answered yet are `None`.
    ///
    /// The requests still pending then are driven to their end (or the bound) on lockkit's
    /// runtime. Only for requests whose order does not matter (reads, renewals, script
    /// loads); what changes a lock goes through [`RedlockBackend::fan_out`].
    pub(super) async fn on_all_until<T, F, Fut>(
        &self,
        bound: Duration,
        renewal: bool,
        request: F,
        enough: impl Fn(&[Option<NodeResult<T>>]) -> bool + Send + Sync,
    ) -> Vec<Option<NodeResult<T>>>
    where
        T: Send + 'static,
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        let deadline = Instant::now() + bound;
        let pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let connection = if renewal {
                    &node.renewals
                } else {
                    &node.connection
                };
                let reply = tokio::time::timeout_at(deadline, request(connection.clone()));
                async move {
                    let answer = match reply.await {
                        Ok(answer) => answer.map_err(|e| from_redis(BACKEND, e)),
                        Err(_) => Err(timed_out(BACKEND, "a node", bound)),
                    };
                    (i, answer)
                }
            })
            .collect();
        let (answers, pending) = self.gather(deadline, bound, pending, enough).await;
        if !pending.is_empty() {
            lockkit_core::backend::runtime::spawn(pending.for_each(|_| std::future::ready(())));
        }
        answers
    }

    /// Collects the answers of `pending` until `enough` says they decide the outcome or
    /// `deadline` passes (the nodes still silent then count as timed out after `bound`), and
    /// returns them with the requests still pending.
    pub(super) async fn gather<T, Fut>(
        &self,
        deadline: Instant,
        bound: Duration,
        mut pending: FuturesUnordered<Fut>,
        enough: impl Fn(&[Option<NodeResult<T>>]) -> bool + Send + Sync,
    ) -> (Vec<Option<NodeResult<T>>>, FuturesUnordered<Fut>)
    where
        Fut: Future<Output = (usize, NodeResult<T>)>,
    {
        let mut answers: Vec<Option<NodeResult<T>>> = self.nodes.iter().map(|_| None).collect();
        let late = tokio::time::timeout_at(deadline, async {
            while let Some((i, answer)) = pending.next().await {
                answers[i] = Some(answer);
                if enough(&answers) {
                    break;
                }
            }
        })
        .await
        .is_err();
        if late {
            // On a starved machine the timer and the answers come due in the same wake-up,
            // and the timer's task may run before the connections' drivers read them: let
            // those run, then take what arrived. (Callers count validity from the send, so a
            // late answer only shortens it.)
            for _ in 0..LATE_ROUNDS {
                tokio::task::yield_now().await;
                while let Some(Some((i, answer))) = pending.next().now_or_never() {
                    answers[i] = Some(answer);
                }
                if enough(&answers) || answers.iter().all(Option::is_some) {
                    break;
                }
            }
            for (answer, node) in answers.iter_mut().zip(self.nodes.iter()) {
                if answer.is_none() {
                    *answer = Some(Err(timed_out(BACKEND, &node.addr, bound)));
                }
            }
        }
        (answers, pending)
    }

    /// Sends one script that changes the lock of `keys[0]` to every node in the acquisition's
    /// lanes (see [`RedlockBackend::send_script`]) and gathers the answers until `enough` or
    /// the node timeout; the nodes that have not answered when this returns may still apply
    /// it, so callers treat them as "may hold". It runs on lockkit's runtime, where the
    /// lanes' tasks and the connections' drivers run: the caller is woken once, with the
    /// answers, instead of once per node (on a contended lock each wake-up is a switch
    /// between threads on the hand-over's path: 13 per hand-over were two thirds of the W2
    /// process's system calls).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fan_out(
        &self,
        owner: &OwnerToken,
        script: &'static redis::Script,
        keys: &[&str],
        args: &[String],
        ttl: Duration,
        follow_up: Option<FollowUp>,
        enough: impl Fn(&[Option<NodeResult<Value>>]) -> bool + Send + Sync + 'static,
    ) -> Vec<Option<NodeResult<Value>>> {
        let this = self.clone();
        let owner = owner.clone();
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        let args = args.to_vec();
        let nodes = self.nodes.len();
        let gathered = lockkit_core::backend::runtime::run(async move {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let now = Instant::now();
            let pending = this.send_script(&owner, script, &keys, &args, ttl, |_| true, follow_up);
            let bound = this.config.node_timeout;
            // The requests are in their lanes' tasks: dropping the pending answers sends
            // nothing less.
            this.gather(now + bound, bound, pending, enough).await.0
        })
        .await;
        gathered.unwrap_or_else(|e| {
            (0..nodes)
                .map(|_| Some(Err(crate::error::repeat(&e))))
                .collect()
        })
    }

    /// Puts one script that changes the lock of `keys[0]` in the lane of this acquisition
    /// (lock key and owner) on each node `to` picks, now, before returning: it reaches each
    /// node after the acquisition's earlier requests there and is pursued for `ttl` (the
    /// lock's TTL) whether or not anyone awaits the answers, so dropping them changes
    /// nothing about what is sent (see `lanes.rs`). A `follow_up` sees each node's reply in
    /// the request's lane slot and may return one more request for that node, sent at once
    /// in the same slot: before anything later in the lane.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_script(
        &self,
        owner: &OwnerToken,
        script: &'static redis::Script,
        keys: &[&str],
        args: &[String],
        ttl: Duration,
        to: impl Fn(usize) -> bool,
        follow_up: Option<FollowUp>,
    ) -> FuturesUnordered<impl Future<Output = (usize, NodeResult<Value>)> + Send + 'static> {
        let invocation = Arc::new(invocation(script, keys, args));
        // One lane per acquisition: its acquire, write-back and rollback or release must
        // stay in order; other acquisitions' requests need no order against them, and
        // queueing them in one lane per key made a release wait behind every waiter's retry.
        let lane = format!(
            "{}/{}",
            keys.first().copied().unwrap_or_default(),
            owner.digest_hex()
        );
        let now = Instant::now();
        let bound = self.config.node_timeout;
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| to(*i))
            .map(|(i, node)| {
                let mut con = node.connection.clone();
                let invocation = invocation.clone();
                let follow_up = follow_up.clone();
                let reply = node.lanes.submit(&lane, now + ttl.max(bound), async move {
                    let reply = invoke_retrying(&invocation, &mut con).await;
                    if let Some(next) = follow_up.and_then(|follow_up| follow_up(i, &reply)) {
                        let _ = invoke_retrying(&next, &mut con).await;
                    }
                    reply
                });
                async move {
                    let answer = match reply.await {
                        Ok(answer) => answer.map_err(|e| from_redis(BACKEND, e)),
                        Err(_) => Err(timed_out(BACKEND, "a node", ttl)),
                    };
                    (i, answer)
                }
            })
            .collect()
    }

    /// Runs one script that changes a lock on every node (see
    /// [`RedlockBackend::fan_out`]) and waits for every answer (or its timeout).
    pub(super) async fn script_on_all(
        &self,
        owner: &OwnerToken,
        script: &'static redis::Script,
        keys: &[&str],
        args: &[String],
        ttl: Duration,
    ) -> Vec<NodeResult<Value>> {
        self.fan_out(owner, script, keys, args, ttl, None, |_| false)
            .await
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(unexpected(BACKEND, "a node"))))
            .collect()
    }

    /// The error for too few answers, naming the nodes that failed and why.
    pub(super) fn quorum_error<T>(
        &self,
        what: &str,
        got: usize,
        replies: &[NodeResult<T>],
    ) -> Error {
        let errors: Vec<Option<&Error>> = replies.iter().map(|r| r.as_ref().err()).collect();
        self.quorum_error_of(what, got, &errors)
    }

    pub(super) fn quorum_error_of(
        &self,
        what: &str,
        got: usize,
        errors: &[Option<&Error>],
    ) -> Error {
        let need = self.quorum();
        let failed: Vec<String> = self
            .nodes
            .iter()
            .zip(errors)
            .filter_map(|(node, error)| error.map(|e| format!("{}: {}", node.addr, e.message())))
            .collect();
        Error::new(
            ErrorKind::QuorumNotReached { got, need },
            BACKEND,
            format!(
                "{what}: {got} of {} nodes agreed, {need} needed; failed: {}",
                self.nodes.len(),
                if failed.is_empty() {
                    "none".to_owned()
                } else {
                    failed.join("; ")
                }
            ),
        )
        .with_retryable(true)
    }
}
