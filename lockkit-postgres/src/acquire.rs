//! The one attempt loop: every kind of grant is a row in its key's queue, and one rule of
//! the schema (`lockkit.grant_ready`, run by `lockkit.attempt` and by every release under
//! the key's advisory lock) grants every row that what is ahead of it lets in.
//!
//! The kind decides only that evaluation ([`Shape`]): a mutex or a writer needs nothing
//! ahead, a reader no writer ahead, a permit fewer rows ahead than the semaphore's permits.
//! Grants therefore go in queue order, and a row's place in the queue (a number from the
//! sequence `lockkit.fence`) is its fencing token: whatever was granted before it is ahead
//! of it, with a smaller number. A `try_lock` that would wait leaves nothing. A waiter's
//! grant comes from the release that let it in (a hand-over, [`crate::wait`]), so it costs
//! the waiter no attempt; its row is refreshed by each of its attempts, and its wait ends in
//! time for that. A waiter that goes away without abandoning holds the queue up for at most
//! its TTL.

use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold};
use lockkit_core::{Error, ErrorKind, FencingToken, LockKey, Result};
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;
use crate::error::BACKEND;
use crate::wait::Interest;

const ATTEMPT: &str = "SELECT o_granted, o_seq, o_retry_ms, o_permits, o_left \
     FROM lockkit.attempt($1, $2, $3, $4, $5, $6, $7, $8)";

/// How a kind of hold is kept in the schema: which lock of the name (`kind`: 0 the mutex,
/// 1 the semaphore, 2 the read-write lock), and what the row holds (`hold`: 0 exclusive,
/// 1 permit, 2 read, 3 write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) kind: i16,
    hold: i16,
    permits: i32,
}

impl Shape {
    /// The mutex (and an election) of a name.
    pub(crate) const MUTEX: Shape = Shape {
        kind: 0,
        hold: 0,
        permits: 0,
    };

    pub(crate) fn of(hold: Hold) -> Result<Shape> {
        Ok(match hold {
            Hold::Exclusive => Shape::MUTEX,
            Hold::Permit { permits } => Shape {
                kind: 1,
                hold: 1,
                permits: i32::try_from(permits).map_err(|_| {
                    Error::invalid_config(format!("a semaphore of {permits} permits is too large"))
                })?,
            },
            Hold::Read => Shape {
                kind: 2,
                hold: 2,
                permits: 0,
            },
            Hold::Write => Shape {
                kind: 2,
                hold: 3,
                permits: 0,
            },
            other => return Err(other.unsupported(BACKEND)),
        })
    }
}

/// How a key is named in notifications: `<kind>/<namespace>/<name>`.
pub(crate) fn channel_key(kind: i16, key: &LockKey) -> String {
    format!("{kind}/{}/{}", key.namespace(), key.name())
}

/// A duration in whole milliseconds, for the server (rounded down: the server never keeps a
/// row longer than the client counts on).
pub(crate) fn millis(what: &str, duration: Duration) -> Result<i64> {
    i64::try_from(duration.as_millis())
        .map_err(|_| Error::invalid_config(format!("{what} of {duration:?} is too long")))
}

/// A number the server returned as a fencing token.
pub(crate) fn token(seq: i64) -> Result<FencingToken> {
    u64::try_from(seq).map(FencingToken).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("the server returned the negative fencing token {seq}"),
        )
    })
}

impl PostgresBackend {
    pub(crate) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let shape = Shape::of(request.hold)?;
        let ttl_ms = millis("a TTL", request.ttl)?;
        let owner = request.owner.digest_hex();
        let (namespace, name) = (request.key.namespace(), request.key.name());
        let marker = self.inner.board.marker();
        let row = self
            .inner
            .session
            .query_one_as(
                &owner,
                "an acquisition attempt",
                ATTEMPT,
                &[
                    (&namespace, Type::TEXT),
                    (&name, Type::TEXT),
                    (&shape.kind, Type::INT2),
                    (&owner, Type::TEXT),
                    (&shape.hold, Type::INT2),
                    (&shape.permits, Type::INT4),
                    (&ttl_ms, Type::INT8),
                    (&request.wait, Type::BOOL),
                ],
            )
            .await?;
        let read = |e| {
            Error::new(ErrorKind::Backend, BACKEND, "reading an attempt's answer").with_source(e)
        };
        let granted: bool = row.try_get(0).map_err(read)?;
        let seq: Option<i64> = row.try_get(1).map_err(read)?;
        let retry_ms: Option<i64> = row.try_get(2).map_err(read)?;
        let recorded: Option<i32> = row.try_get(3).map_err(read)?;
        let left: bool = row.try_get(4).map_err(read)?;
        if let (Hold::Permit { permits }, Some(recorded)) = (request.hold, recorded) {
            return Err(Hold::permits_mismatch(
                BACKEND,
                &request.key,
                permits,
                u32::try_from(recorded).unwrap_or(0),
            ));
        }
        if granted {
            let seq = seq.ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    BACKEND,
                    "a grant came without its token",
                )
            })?;
            return Ok(Attempt::Granted(Grant::new(
                token(seq)?,
                Duration::from_millis(ttl_ms.unsigned_abs()),
            )));
        }
        let mut contention = Contention::new().with_marker(marker);
        if let Some(retry_ms) = retry_ms {
            contention =
                contention.with_retry_after(Duration::from_millis(retry_ms.max(0).unsigned_abs()));
        }
        if let Some(seq) = seq {
            contention = contention.with_entry(seq);
        }
        if left {
            contention = contention.with_nothing_left();
        }
        Ok(Attempt::Contended(contention))
    }

    /// Waits until what keeps `request` out may have gone (see [`crate::wait`]); with the
    /// grant when a release handed the lock over to this request's row meanwhile. That
    /// release came after the attempt that queued the row (it would have found the row
    /// granted), and kept the row's expiry, which that attempt set: valid as if that attempt
    /// had been granted, which is how the core counts it.
    pub(crate) async fn wait(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        // The next attempt refreshes the row: well before it expires.
        let max_wait = max_wait.min(request.ttl / 3);
        // Only a hand-over of the row this attempt has: one of a row an earlier attempt had
        // (it expired since) is no grant. (A queued attempt always names its row.)
        let (true, Some(row)) = (self.config().listen, contention.entry) else {
            tokio::time::sleep(max_wait).await;
            return Ok(None);
        };
        let key = Shape::of(request.hold)
            .map(|shape| channel_key(shape.kind, &request.key))
            .unwrap_or_default();
        let owner = request.owner.digest_hex();
        let marker = contention.marker.unwrap_or(0);
        let interest = Interest::Handover { row, owner: &owner };
        let handed = self
            .inner
            .board
            .wait(&key, marker, interest, max_wait)
            .await;
        let Some(seq) = handed else {
            return Ok(None);
        };
        let ttl_ms = millis("a TTL", request.ttl)?;
        Ok(Some(Grant::new(
            token(seq)?,
            Duration::from_millis(ttl_ms.unsigned_abs()),
        )))
    }
}
