//! The etcd backend's operator operations: listing held locks a range page at a time, and
//! breaking a lock by deleting its holder's key.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use lockkit_core::backend::{LockPage, inspect_names, validate_listing};
use lockkit_core::{Error, LockKey, Result};

use crate::backend::EtcdBackend;
use crate::naming::prefix_end;

impl EtcdBackend {
    /// One range read of at most `limit` key names (keys only) under
    /// `<prefix>/<namespace>/<name-prefix>`, from the cursor: the key to start at. A lock's
    /// keys (its holder and its queue) are `<...>/<name>/<entry>`, adjacent in key order, so
    /// the page's locks are the names among them, and the next page starts after the last
    /// name's keys (`<name>0`: `0` follows `/`). Then each lock's holder and queue length,
    /// read concurrently ([`inspect`](lockkit_core::backend::LockBackend::inspect)).
    pub(crate) async fn list_page(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        validate_listing(namespace, prefix, limit)?;
        let root = format!("{}/{namespace}/", self.inner.config.prefix);
        let from = format!("{root}{prefix}");
        let start = match cursor {
            None => from.clone(),
            Some(cursor) if cursor.starts_with(&from) => cursor.to_owned(),
            Some(cursor) => {
                return Err(Error::invalid_config(format!(
                    "{cursor:?} is not a cursor of this listing"
                )));
            }
        };
        let end = prefix_end(from.as_bytes());
        let limit_keys = i64::try_from(limit).unwrap_or(i64::MAX);
        let response = self
            .read("listing locks", |mut client| {
                let (start, end) = (start.clone(), end.clone());
                async move {
                    let options = GetOptions::new()
                        .with_range(end)
                        .with_keys_only()
                        .with_limit(limit_keys);
                    client.get(start, Some(options)).await
                }
            })
            .await?;
        let mut names: Vec<String> = Vec::new();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let Some((name, _entry)) = key.strip_prefix(&root).and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            if names.last().is_none_or(|last| last != name) {
                names.push(name.to_owned());
            }
        }
        let next = match names.last() {
            Some(last) if response.more() => Some(format!("{root}{last}0")),
            _ => None,
        };
        inspect_names(self, namespace, &names, next).await
    }

    /// Deletes the holder's key (the lowest create revision of the lock) if it is still that
    /// key: the next waiter's watch on it fires, and the holder's next renewal check finds
    /// its key gone. The queue and other clients' keys stay.
    pub(crate) async fn break_lock(&self, key: &LockKey) -> Result<bool> {
        let response = self.read_holder(key, "reading the holder").await?;
        let Some(holder) = response.kvs().first() else {
            return Ok(false);
        };
        let (holder_key, revision) = (holder.key().to_vec(), holder.create_revision());
        // If the compare fails, the holder seen is gone already (released, or broken by
        // someone else): still "held", and a new holder is never broken unseen.
        self.call("breaking the lock", |mut client| {
            let holder_key = holder_key.clone();
            async move {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        holder_key.clone(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::delete(holder_key, None)]);
                client.txn(txn).await
            }
        })
        .await?;
        Ok(true)
    }
}
