//! What an operator sees and does: who holds a lock, the held locks of a namespace page by
//! page, and breaking a lock.

use std::time::Duration;

use lockkit_core::backend::{LockInfo, LockPage, validate_listing};
use lockkit_core::{Error, ErrorKind, LockKey, Result};
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::acquire::{Shape, token};
use crate::backend::PostgresBackend;
use crate::error::BACKEND;

/// A mutex's live holder, as the server tells it.
#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) info: LockInfo,
    pub(crate) value: Option<String>,
}

fn read(what: &'static str) -> impl Fn(tokio_postgres::Error) -> Error {
    move |e| Error::new(ErrorKind::Backend, BACKEND, what).with_source(e)
}

fn remaining(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0).unsigned_abs())
}

impl PostgresBackend {
    /// The live holder of the mutex `key` (or the leader of the election `key`), if any.
    pub(crate) async fn holder(&self, key: &LockKey) -> Result<Option<Holder>> {
        let (namespace, name) = (key.namespace(), key.name());
        let row: Row = self
            .inner
            .session
            .query_one(
                "reading a lock's holder",
                "SELECT o_seq, o_remaining_ms, o_value, o_waiters FROM lockkit.holder($1, $2, $3)",
                &[
                    (&namespace, Type::TEXT),
                    (&name, Type::TEXT),
                    (&Shape::MUTEX.kind, Type::INT2),
                ],
            )
            .await?;
        let what = "reading a lock's holder";
        let Some(seq) = row.try_get::<_, Option<i64>>(0).map_err(read(what))? else {
            return Ok(None);
        };
        let remaining_ms: i64 = row.try_get(1).map_err(read(what))?;
        let value: Option<String> = row.try_get(2).map_err(read(what))?;
        let waiters: i64 = row.try_get(3).map_err(read(what))?;
        let info = LockInfo::new(token(seq)?)
            .with_remaining_ttl(remaining(remaining_ms))
            .with_waiters(usize::try_from(waiters).unwrap_or(0));
        Ok(Some(Holder { info, value }))
    }

    /// One page of the held mutexes of `namespace` whose names start with `prefix`, after
    /// the name `cursor`.
    pub(crate) async fn list_page(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        validate_listing(namespace, prefix, limit)?;
        if let Some(cursor) = cursor.filter(|c| !c.starts_with(prefix)) {
            return Err(Error::invalid_config(format!(
                "{cursor:?} is not a cursor of this listing"
            )));
        }
        let limit_rows = i32::try_from(limit).unwrap_or(i32::MAX);
        let what = "listing locks";
        let rows = self
            .inner
            .session
            .query(
                what,
                "SELECT name, seq, remaining_ms, waiters FROM lockkit.list($1, $2, $3, $4)",
                &[
                    (&namespace, Type::TEXT),
                    (&prefix, Type::TEXT),
                    (&cursor, Type::TEXT),
                    (&limit_rows, Type::INT4),
                ],
            )
            .await?;
        let mut locks = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            let name: String = row.try_get(0).map_err(read(what))?;
            let seq: i64 = row.try_get(1).map_err(read(what))?;
            let remaining_ms: i64 = row.try_get(2).map_err(read(what))?;
            let waiters: i64 = row.try_get(3).map_err(read(what))?;
            if let Ok(key) = LockKey::new(namespace, &name) {
                let info = LockInfo::new(token(seq)?)
                    .with_remaining_ttl(remaining(remaining_ms))
                    .with_waiters(usize::try_from(waiters).unwrap_or(0));
                locks.push((key, info));
            }
            last = Some(name);
        }
        let next = last.filter(|_| rows.len() >= limit);
        Ok(LockPage::new(locks, next))
    }

    /// Deletes the live holder's row of the mutex `key`, whoever holds it; whether it was
    /// held. Its waiters are woken; its holder finds out at its next renewal.
    pub(crate) async fn break_lock(&self, key: &LockKey) -> Result<bool> {
        let (namespace, name) = (key.namespace(), key.name());
        let row = self
            .inner
            .session
            .query_one(
                "breaking a lock",
                "SELECT lockkit.force_release($1, $2)",
                &[(&namespace, Type::TEXT), (&name, Type::TEXT)],
            )
            .await?;
        row.try_get::<_, bool>(0).map_err(read("breaking a lock"))
    }
}
