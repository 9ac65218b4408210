//! A Redis Cluster's nodes and slots, as `CLUSTER NODES` describes them: the primaries, who
//! serves a slot, and moving a slot to another primary.

use std::time::Duration;

use lockkit_redis::RedisConfig;

use super::connect;

/// The primaries of the cluster that `config`'s nodes belong to (see [`cluster_nodes`]).
pub async fn cluster_primaries(config: &RedisConfig) -> redis::RedisResult<Vec<String>> {
    Ok(cluster_nodes(config)
        .await
        .into_iter()
        .filter(|node| node.primary)
        .map(|node| node.addr)
        .collect())
}

/// A node of a Redis Cluster, as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pub id: String,
    /// `host:port`.
    pub addr: String,
    pub primary: bool,
    /// A replica's primary (its id).
    pub of: Option<String>,
    /// The slot ranges a primary serves.
    pub slots: Vec<(u16, u16)>,
}

/// The nodes of the cluster that `config`'s nodes belong to, failed ones left out, from the
/// first configured node that answers.
pub async fn cluster_nodes(config: &RedisConfig) -> Vec<ClusterNode> {
    for node in &config.hosts {
        let Ok(mut con) = connect(node).await else {
            continue;
        };
        let Ok(nodes) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async::<String>(&mut con)
            .await
        else {
            continue;
        };
        return nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = *fields.get(2)?;
                if flags.contains("fail") {
                    return None;
                }
                Some(ClusterNode {
                    id: (*fields.first()?).to_owned(),
                    addr: fields.get(1)?.split('@').next()?.to_owned(),
                    primary: flags.contains("master"),
                    of: fields
                        .get(3)
                        .filter(|id| **id != "-")
                        .map(|id| (*id).to_owned()),
                    // "0-5460", "5461", and "[slot->-id]" for a slot being migrated.
                    slots: fields
                        .iter()
                        .skip(8)
                        .filter(|f| !f.starts_with('['))
                        .filter_map(|f| match f.split_once('-') {
                            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                            None => f.parse().ok().map(|n| (n, n)),
                        })
                        .collect(),
                })
            })
            .collect();
    }
    panic!("no node of the cluster answered CLUSTER NODES");
}

/// The node that serves `slot` now, as the first node that answers sees it; `None` while
/// none does (its primary failed and no replica took over yet).
pub async fn cluster_owner(config: &RedisConfig, slot: u16) -> Option<ClusterNode> {
    cluster_nodes(config)
        .await
        .into_iter()
        .find(|node| node.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
}

/// The primary that serves `slot`, and another primary to move it to.
pub async fn owner_and_another_primary(
    config: &RedisConfig,
    slot: u16,
) -> (ClusterNode, ClusterNode) {
    let owner = cluster_owner(config, slot)
        .await
        .expect("the slot's primary");
    let another = cluster_nodes(config)
        .await
        .into_iter()
        .find(|n| n.primary && n.id != owner.id)
        .expect("another primary");
    (owner, another)
}

/// Moves `slot` from the node `from` to the node `to`, keys and all, as `redis-cli --cluster
/// reshard` does (`SETSLOT ... IMPORTING / MIGRATING`, `MIGRATE` in batches, `SETSLOT ... NODE`).
pub async fn migrate_slot(slot: u16, from: &ClusterNode, to: &ClusterNode) {
    let mut source = connect(&from.addr).await.unwrap();
    let mut target = connect(&to.addr).await.unwrap();
    let setslot = |state: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    let () = setslot("IMPORTING", &from.id)
        .query_async(&mut target)
        .await
        .unwrap();
    let () = setslot("MIGRATING", &to.id)
        .query_async(&mut source)
        .await
        .unwrap();
    let (host, port) = to.addr.rsplit_once(':').unwrap();
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(10)
            .query_async(&mut source)
            .await
            .unwrap();
        if keys.is_empty() {
            break;
        }
        // A few keys at a time, with pauses between batches, so that clients meet the
        // migration half done (ASK, TRYAGAIN).
        let () = redis::cmd("MIGRATE")
            .arg(host)
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut source)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let () = setslot("NODE", &to.id)
        .query_async(&mut target)
        .await
        .unwrap();
    let () = setslot("NODE", &to.id)
        .query_async(&mut source)
        .await
        .unwrap();
}
