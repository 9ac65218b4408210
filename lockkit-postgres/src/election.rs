//! Elections on the mutex of their name: the leader is the live holder, its value a column
//! of its row (so it goes with the grant), and observers wake on the notifications of the
//! key's proclamations, hand-overs and releases. A grant by an attempt notifies nobody: a
//! candidate proclaims right after its grant, and that wakes the observers (a plain mutex
//! held on an election's name shows to them at their next read, within `max_wait`).

use std::time::Duration;

use lockkit_core::backend::{Leader, Lease};
use lockkit_core::{Error, ErrorKind, LockKey, Result};
use tokio_postgres::types::Type;

use crate::acquire::{Shape, channel_key};
use crate::backend::PostgresBackend;
use crate::error::BACKEND;
use crate::wait::Interest;

impl PostgresBackend {
    /// Stores `value` as what the grant of `lease` proclaims, if it is still live.
    pub(crate) async fn store_value(&self, lease: &Lease, value: &str) -> Result<bool> {
        let owner = lease.owner().digest_hex();
        let row = self
            .inner
            .session
            .query_one(
                "proclaiming a value",
                "SELECT lockkit.proclaim($1, $2)",
                &[(&owner, Type::TEXT), (&value, Type::TEXT)],
            )
            .await?;
        row.try_get::<_, bool>(0).map_err(|e| {
            Error::new(ErrorKind::Backend, BACKEND, "proclaiming a value").with_source(e)
        })
    }

    /// The leader of `key` and its value, read in one statement.
    pub(crate) async fn read_leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        Ok(self
            .holder(key)
            .await?
            .map(|holder| Leader::new(holder.info.fencing_token, holder.value)))
    }

    /// Waits until the leader of `key` may differ from `seen`. The leader is read after the
    /// board's marker is taken, so a change between the caller's read and this wait is seen
    /// either by the read or on the board.
    pub(crate) async fn watch_leader(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        if !self.config().listen {
            tokio::time::sleep(max_wait).await;
            return Ok(());
        }
        let marker = self.inner.board.marker();
        if self.read_leader(key).await?.as_ref() != seen {
            return Ok(());
        }
        let channel = channel_key(Shape::MUTEX.kind, key);
        self.inner
            .board
            .wait(&channel, marker, Interest::Any, max_wait)
            .await;
        Ok(())
    }
}
