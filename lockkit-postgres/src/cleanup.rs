//! Taking rows away: a release (the grant's row, if it is still the grant's), an abandon
//! (whatever the acquisition left, granted or queued), and the sweep of rows expired long ago
//! on keys nobody tries any more.
//!
//! A release or an abandon is one statement, sent again by the core until it is answered
//! (deleting a row by its owner twice deletes it once). It runs the schema's rule, so it
//! grants whoever may hold after it and tells them ([`crate::wait`]); then it commits with
//! the disk flush a grant needs. Without a hand-over it commits without waiting for the
//! disk: a release lost in a crash leaves a row that expires with its TTL, which is safe;
//! the grant before it was on disk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit_core::Result;
use lockkit_core::backend::{OwnerToken, runtime};
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;

/// How often a client sweeps at most, and how many rows one sweep deletes at most.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SWEEP_ROWS: i32 = 1000;

impl PostgresBackend {
    /// Deletes the row of `owner` (only a granted one with `granted_only`); whether it was
    /// a live grant.
    pub(crate) async fn remove(&self, owner: &OwnerToken, granted_only: bool) -> Result<bool> {
        let owner = owner.digest_hex();
        let row = self
            .inner
            .session
            .query_one_as(
                &owner,
                if granted_only {
                    "a release"
                } else {
                    "abandoning an acquisition"
                },
                "SELECT lockkit.release($1, $2)",
                &[(&owner, Type::TEXT), (&granted_only, Type::BOOL)],
            )
            .await?;
        Ok(row.try_get::<_, bool>(0).unwrap_or(false))
    }

    /// Sweeps in the background, at most once per [`SWEEP_EVERY`] per client.
    pub(crate) fn sweep_now_and_then(&self, last: &AtomicU64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let before = last.load(Ordering::Relaxed);
        if now < before.saturating_add(SWEEP_EVERY.as_secs())
            || last
                .compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let backend = self.clone();
        runtime::spawn(async move {
            let swept = backend
                .inner
                .session
                .query(
                    "sweeping expired rows",
                    "SELECT lockkit.sweep($1)",
                    &[(&SWEEP_ROWS, Type::INT4)],
                )
                .await;
            if let Err(e) = swept {
                tracing::debug!(error = %e, "a sweep of expired rows failed; the next one retries");
            }
        });
    }
}
