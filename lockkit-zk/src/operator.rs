//! The ZooKeeper backend's operator operations: listing held locks, and breaking a lock by
//! deleting its holder's node.

use lockkit_core::backend::{LockPage, inspect_names, validate_listing};
use lockkit_core::{LockKey, Result};
use zookeeper_client as zk;

use crate::backend::{ZkBackend, within};
use crate::error::map;
use crate::naming::{LockPaths, queue};

impl ZkBackend {
    /// ZooKeeper cannot page a node's children: one `getChildren` of the namespace node reads
    /// the lock names (one parent node per lock, not their queues), which are sorted and
    /// paged here; the cursor is the last name of the page before. Then each lock's holder
    /// and queue, read concurrently ([`inspect`](lockkit_core::backend::LockBackend::inspect)); parents left
    /// empty (they linger a while) are not listed.
    pub(crate) async fn list_page(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        validate_listing(namespace, prefix, limit)?;
        let session = self.session().await;
        let mut names = self.children(&session, &format!("/{namespace}")).await?;
        names.retain(|name| {
            name.starts_with(prefix) && cursor.is_none_or(|after| name.as_str() > after)
        });
        names.sort();
        let more = names.len() > limit;
        names.truncate(limit);
        let next = more.then(|| names.last().cloned()).flatten();
        inspect_names(self, namespace, &names, next).await
    }

    /// Deletes the node with the lowest sequence: the next waiter's watch on it fires, and
    /// the holder's next renewal finds its node gone. A node already gone means its holder
    /// left meanwhile: the lock was held all the same, and whoever holds it now is left alone.
    pub(crate) async fn break_lock(&self, key: &LockKey) -> Result<bool> {
        let session = self.session().await;
        let paths = LockPaths::new(key);
        let Some(holder) = queue(self.children(&session, &paths.parent).await?)
            .into_iter()
            .next()
        else {
            return Ok(false);
        };
        match within(
            self.timeout(),
            "delete the holder's node",
            session.client.delete(&paths.child(&holder), None),
        )
        .await?
        {
            Ok(()) | Err(zk::Error::NoNode) => Ok(true),
            Err(e) => Err(map("delete the holder's node", e)),
        }
    }
}
