//! Renewals: every lease of a client in one statement per tick (`lockkit.renew` over two
//! arrays), so 10,000 held locks cost one round trip a tick, not 10,000.
//!
//! A renewal moves a live grant's expiry to its TTL from the server's now, which is no
//! earlier than the send time the core counts from; it commits with the grants'
//! durability, so that a crash cannot bring back an earlier expiry the holder no longer
//! counts on. A lease the statement does not return is lost: expired, released or broken.

use std::collections::HashSet;
use std::time::Duration;

use lockkit_core::backend::{Lease, Renewal};
use lockkit_core::{Error, Result};
use tokio_postgres::types::Type;

use crate::acquire::millis;
use crate::backend::PostgresBackend;

impl PostgresBackend {
    /// Renews `leases`; the answers are in their order.
    pub(crate) async fn renew_all(&self, leases: &[Lease]) -> Result<Vec<Renewal>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let owners: Vec<String> = leases.iter().map(|l| l.owner().digest_hex()).collect();
        let ttls = leases
            .iter()
            .map(|l| millis("a TTL", l.ttl()))
            .collect::<Result<Vec<i64>>>()?;
        let rows = self
            .inner
            .session
            .query(
                "a renewal",
                "SELECT lockkit.renew($1, $2)",
                &[(&owners, Type::TEXT_ARRAY), (&ttls, Type::INT8_ARRAY)],
            )
            .await?;
        self.sweep_now_and_then(&self.inner.last_sweep);
        let extended: HashSet<String> = rows
            .iter()
            .filter_map(|row| row.try_get::<_, String>(0).ok())
            .collect();
        Ok(owners
            .iter()
            .zip(&ttls)
            .map(|(owner, ttl_ms)| {
                if extended.contains(owner) {
                    Renewal::Extended(Duration::from_millis(ttl_ms.unsigned_abs()))
                } else {
                    Renewal::Lost
                }
            })
            .collect())
    }

    /// Whether `lease` still holds its grant, asked of the server.
    pub(crate) async fn holds(&self, lease: &Lease) -> Result<bool> {
        let owner = lease.owner().digest_hex();
        let row = self
            .inner
            .session
            .query_one(
                "checking a grant",
                "SELECT lockkit.holds($1)",
                &[(&owner, Type::TEXT)],
            )
            .await?;
        row.try_get::<_, bool>(0).map_err(|e| {
            Error::new(
                lockkit_core::ErrorKind::Backend,
                crate::error::BACKEND,
                "checking a grant",
            )
            .with_source(e)
        })
    }
}
