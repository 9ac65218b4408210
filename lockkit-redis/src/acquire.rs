//! One attempt at a grant on one Redis server or a Sentinel primary: the mutex's attempt,
//! and the one way every kind of grant (a mutex, a permit, a read or the write lock) runs its
//! acquire script.
//!
//! - **The mutex's attempt** is one round trip, the `acquire` script
//!   (`scripts/queue.lua`, `mutex_prelude.lua` and `acquire.lua`): a lock that is the caller's already is
//!   its grant again (extended), a free lock goes to the first live waiter of its queue (the
//!   caller, or another it is handed to now), and otherwise the caller is refused with the
//!   holder's remaining TTL, queued first when it will wait. A non-fair attempt runs the
//!   same script without the queue's keys: a free lock is the caller's, whoever queues for
//!   it, and a waiter listens on the lock's release channel (every release and hand-over is
//!   published there) instead of queueing. A grant's fencing token is
//!   `max(counter + 1, server clock in µs)` (`next_token` in `common.lua`), so tokens keep
//!   increasing after the counter expires or is lost, unless the server's clock steps back.
//! - **Every kind's script** goes through [`RedisBackend::acquire_with`]: on its own, or with
//!   `min_replicas` in one pipeline with `WAIT` on the connection reserved for it, where a
//!   grant fewer replicas acknowledged is given back with the kind's release and reported as
//!   [`ErrorKind::QuorumNotReached`]. Each kind's reply type says how to read the reply and
//!   whether it is a grant ([`AcquireScriptReply`]).

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold};
use lockkit_core::{Error, ErrorKind, Result};
use redis::{Script, Value};

use crate::backend::RedisBackend;
use crate::connection::Epoch;
use crate::error::{BACKEND, refused_in_pipeline, unexpected};
use crate::scripts::{self, AcquireReply, Keys, millis};

/// The reply of a kind's acquire script, as [`RedisBackend::acquire_with`] reads it.
pub(crate) trait AcquireScriptReply: Sized {
    /// The request, as a timeout names it.
    const WHAT: &'static str;
    /// The script, as an error names it.
    const SCRIPT: &'static str;
    /// Reads the script's reply.
    fn parse(value: &Value) -> Result<Self>;
    /// Whether the reply grants the request.
    fn is_grant(&self) -> bool;

    /// The `[code, n]` a semaphore's or a read-write lock's script answers.
    fn code_and_number(value: &Value) -> Result<(i64, i64)> {
        match value {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(code), Value::Int(n)] => Ok((*code, *n)),
                _ => Err(unexpected(BACKEND, Self::SCRIPT)),
            },
            _ => Err(unexpected(BACKEND, Self::SCRIPT)),
        }
    }
}

impl AcquireScriptReply for AcquireReply {
    const WHAT: &'static str = "acquiring";
    const SCRIPT: &'static str = "the acquire script";

    fn parse(value: &Value) -> Result<Self> {
        scripts::acquire_reply(BACKEND, value)
    }

    fn is_grant(&self) -> bool {
        matches!(self, AcquireReply::Granted(_))
    }
}

/// Whether `request`'s waiter queues on the server and is handed its grant there (a fair
/// mutex's or semaphore's, any writer's), rather than listening for releases and attempting
/// again.
pub(crate) fn queues(request: &AcquireRequest) -> bool {
    request.hold == Hold::Write
        || (request.fair && matches!(request.hold, Hold::Exclusive | Hold::Permit { .. }))
}

/// A waiter registered before its attempt (see [`RedisBackend::register`]).
#[derive(Default)]
pub(crate) struct Waiter {
    /// Where the wait listens was subscribed by then, as of this notification count.
    marker: Option<u64>,
    /// The name a fair waiter's attempt queues under (see `Handover::attempting`).
    queued_as: Option<String>,
    /// A fair waiter's inbox, and the owner digest it is registered under.
    inbox: Option<(Arc<Epoch>, String)>,
}

impl Waiter {
    /// The attempt was granted: a fair waiter expects no hand-over any more.
    pub(crate) fn granted(&self, grant: Grant) -> Attempt {
        if let Some((epoch, digest)) = &self.inbox {
            epoch.notifier.inbox().forget(digest);
        }
        Attempt::Granted(grant)
    }

    /// The attempt of `request` was refused; the first of what kept it out ends after
    /// `retry_after`, if it said. The script wrote nothing for a try or a non-fair attempt;
    /// a fair waiter's attempt queued it.
    pub(crate) fn contended(
        &self,
        request: &AcquireRequest,
        retry_after: Option<Duration>,
    ) -> Attempt {
        let contention = match self.marker {
            Some(marker) => Contention::new().with_marker(marker),
            None => Contention::new(),
        };
        let contention = if request.wait && queues(request) {
            contention
        } else {
            contention.with_nothing_left()
        };
        Attempt::Contended(match retry_after {
            Some(retry_after) => contention.with_retry_after(retry_after),
            None => contention,
        })
    }
}

impl RedisBackend {
    /// One attempt at the mutex of `request.key`, fair or not.
    pub(crate) async fn try_acquire_mutex(&self, request: &AcquireRequest) -> Result<Attempt> {
        let keys = Keys::of(&request.key);
        let waiter = self.register(request, &keys.channel);
        let args = self.acquire_args(request, &waiter);
        let all = keys.acquire();
        let keys = if request.fair { &all[..] } else { &all[..2] };
        let reply = self
            .acquire_with(request, &self.publishing().acquire, keys, &args)
            .await?;
        Ok(match reply {
            AcquireReply::Granted(token) => waiter.granted(Grant::new(token, request.ttl)),
            AcquireReply::Contended(remaining) => waiter.contended(request, remaining),
        })
    }

    /// Registers `request`'s waiter, if it will wait, before the attempt that may queue it,
    /// so that no hand-over announced from then on is missed: a fair waiter on its backend's
    /// inbox, a non-fair one (or a kind that does not queue) on `channel`, what it listens on
    /// for releases. The marker tells the wait whether that was subscribed.
    pub(crate) fn register(&self, request: &AcquireRequest, channel: &str) -> Waiter {
        let Some(epoch) = request.wait.then(|| self.primary.epoch()) else {
            return Waiter::default();
        };
        let notifier = &epoch.notifier;
        if !queues(request) {
            return Waiter {
                marker: notifier.marker(channel),
                ..Waiter::default()
            };
        }
        let digest = request.owner.digest_hex();
        let queued_as = notifier.inbox().expect(&digest).attempting(&digest);
        Waiter {
            marker: notifier.marker(&notifier.inbox_channel(&request.key)),
            queued_as: Some(queued_as),
            inbox: Some((epoch.clone(), digest)),
        }
    }

    /// Runs a kind's acquire `script` with `keys` and `args` for `request`. With
    /// `min_replicas`, the script and `WAIT min_replicas replica_timeout` go in one pipeline
    /// on the connection reserved for it, and a grant fewer replicas acknowledged is given
    /// back (the kind's release, [`RedisBackend::release_on`]) and is an error. So is a
    /// grant answered after the backend followed a Sentinel failover (it may come from the
    /// old primary): a retryable `Unavailable`, the grant given back on the new primary.
    pub(crate) async fn acquire_with<R: AcquireScriptReply>(
        &self,
        request: &AcquireRequest,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<R> {
        // Taken before the request is sent: at worst an epoch older than the request's, which
        // only costs a needless retry below.
        let epoch = self.primary.epoch();
        let reply = self
            .invoke_acquire::<R>(request, script, keys, args)
            .await?;
        if !reply.is_grant() || self.primary.is_current(&epoch) {
            return Ok(reply);
        }
        // The backend followed a failover while the request was in flight: the grant may be
        // the old primary's, which the new one does not know. Not handed out; the next
        // attempt goes to the new primary (a grant the new one made is given back first).
        if let Err(e) = self
            .release_hold(&request.key, request.hold, &request.owner)
            .await
        {
            tracing::warn!(error = %e, "could not give back a grant made across a failover; it expires with its TTL");
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the backend moved to a new primary while acquiring: the grant, perhaps the old primary's, was not handed out",
        )
        .with_retryable(true))
    }

    /// [`RedisBackend::acquire_with`]'s request itself.
    async fn invoke_acquire<R: AcquireScriptReply>(
        &self,
        request: &AcquireRequest,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<R> {
        if self.config.min_replicas == 0 {
            let mut invocation = script.prepare_invoke();
            invocation.key(keys).arg(args);
            let invocation = &invocation;
            let reply = self
                .primary
                .request(R::WHAT, |mut con| async move {
                    invocation.invoke_async::<Value>(&mut con).await
                })
                .await?;
            return R::parse(&reply);
        }
        let mut invocation = redis::cmd("EVALSHA");
        invocation
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        let (reply, acked) = self.invoke_replicated(&invocation, R::SCRIPT).await?;
        let reply = R::parse(&reply)?;
        if !reply.is_grant() || acked >= self.config.min_replicas as usize {
            return Ok(reply);
        }
        if let Err(e) = self
            .release_hold(&request.key, request.hold, &request.owner)
            .await
        {
            tracing::warn!(error = %e, hold = ?request.hold, "could not give back an unreplicated grant; it expires with its TTL");
        }
        Err(self.unreplicated(acked))
    }

    /// The arguments of the acquire script for `request` (its keys are [`Keys::acquire`]).
    fn acquire_args(&self, request: &AcquireRequest, waiter: &Waiter) -> [String; 8] {
        let [queue, name, inbox] = self.queue_args(waiter);
        [
            request.owner.expose_hex(),
            millis(request.ttl).to_string(),
            millis(self.config.fence_ttl).to_string(),
            String::new(),
            queue,
            name,
            inbox,
            String::new(),
        ]
    }

    /// The queue's arguments of a kind's acquire script for `waiter`: whether it queues
    /// (`"1"`, or empty), the name it queues under (see `Handover::attempting`), and the
    /// inbox its hand-over is announced on (empty while its waiters poll).
    pub(crate) fn queue_args(&self, waiter: &Waiter) -> [String; 3] {
        match &waiter.queued_as {
            Some(name) => {
                let inbox = match &waiter.inbox {
                    Some((epoch, _)) if self.notifies() => epoch.notifier.inbox().name().to_owned(),
                    _ => String::new(),
                };
                ["1".to_owned(), name.clone(), inbox]
            }
            None => Default::default(),
        }
    }

    /// A script's `invocation` and `WAIT min_replicas replica_timeout` in one pipeline, on
    /// the connection reserved for it (`WAIT` counts that connection's writes and blocks it).
    /// Returns the script's reply and how many replicas acknowledged it.
    async fn invoke_replicated(
        &self,
        invocation: &redis::Cmd,
        script: &str,
    ) -> Result<(Value, usize)> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.add_command(invocation.clone());
        pipe.cmd("WAIT")
            .arg(self.config.min_replicas)
            .arg(millis(self.config.replica_timeout));
        let pipe = &pipe;
        let replies = self
            .primary
            .request_on(
                "acquiring",
                |epoch| epoch.replication.clone(),
                |mut con| async move {
                    let replies = scripts::query_reloading(pipe, &mut con).await?;
                    scripts::primary_moved(&replies).map_or(Ok(replies), Err)
                },
            )
            .await?;
        match replies.as_slice() {
            [Value::ServerError(e), _] => Err(refused_in_pipeline(script, e)),
            [reply, Value::Int(acked)] => Ok((reply.clone(), usize::try_from(*acked).unwrap_or(0))),
            _ => Err(unexpected(BACKEND, &format!("{script} and WAIT"))),
        }
    }

    /// The error of a grant that `acked` replicas acknowledged, fewer than `min_replicas`,
    /// and that was given back.
    fn unreplicated(&self, acked: usize) -> Error {
        let need = self.config.min_replicas as usize;
        Error::new(
            ErrorKind::QuorumNotReached { got: acked, need },
            BACKEND,
            format!(
                "the grant reached {acked} replica(s) within {:?}, min_replicas = {need}: it was given back",
                self.config.replica_timeout
            ),
        )
        .with_retryable(true)
    }
}
