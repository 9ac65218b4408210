//! The servers' own counts of the requests a renewal sends, read before and after the hold:
//! - ZooKeeper: `cons`, per connection, for this process's session alone (`recved=`): every
//!   request of the session, pings included;
//! - Redis (single, Sentinel's primary, each Redlock node): `INFO commandstats`, the calls of
//!   `EVALSHA` (the renewal script; scripts are run by their SHA). Server-wide: other clients'
//!   scripts in the same window count too;
//! - etcd: each member's `/metrics`, `grpc_server_handled_total` of `Txn` (a renewal tick
//!   is read transactions). Server-wide as well.

use lockkit::{Error, ErrorKind, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Where a tier's counters are read, and what they count.
#[derive(Debug)]
pub(crate) enum Counters {
    Redis(Vec<String>),
    Etcd(Vec<String>),
    Zk { hosts: Vec<String>, session: i64 },
}

fn error(message: String) -> Error {
    Error::new(ErrorKind::Backend, "held_locks", message)
}

/// The `host:port` list of a URL (`scheme://[user@]h1:p1,h2:p2/...`).
pub(crate) fn hosts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?']).next().unwrap_or_default();
    let rest = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    rest.split(',')
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Counters {
    /// What the counter counts, for the table.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            Counters::Redis(_) => "EVALSHA calls, server-wide",
            Counters::Etcd(_) => "Txn calls, server-wide",
            Counters::Zk { .. } => "requests of this session",
        }
    }

    /// The Redis tiers' nodes: the URL's, or for Sentinel the primary it names.
    pub(crate) async fn redis(url: &str) -> Result<Counters> {
        let nodes = hosts(url);
        if !url.starts_with("redis+sentinel://") {
            return Ok(Counters::Redis(nodes));
        }
        let master = url
            .split_once("://")
            .and_then(|(_, rest)| rest.split_once('/'))
            .map(|(_, name)| name.split('?').next().unwrap_or_default().to_owned())
            .ok_or_else(|| error(format!("no master name in {url}")))?;
        let sentinel = nodes
            .first()
            .ok_or_else(|| error(format!("no sentinel in {url}")))?;
        let mut con = redis_connection(sentinel).await?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&master)
            .query_async(&mut con)
            .await
            .map_err(|e| error(format!("sentinel {sentinel}: {e}")))?;
        match addr.as_slice() {
            [host, port] => Ok(Counters::Redis(vec![format!("{host}:{port}")])),
            _ => Err(error(format!("sentinel {sentinel} knows no {master}"))),
        }
    }

    /// A Redis Cluster's primaries, as the first node of the URL lists them now.
    pub(crate) async fn redis_cluster(url: &str) -> Result<Counters> {
        let seed = hosts(url)
            .into_iter()
            .next()
            .ok_or_else(|| error(format!("no node in {url}")))?;
        let mut con = redis_connection(&seed).await?;
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut con)
            .await
            .map_err(|e| error(format!("{seed}: CLUSTER NODES: {e}")))?;
        // "<id> <host:port@bus> <flags> ..."
        let primaries = nodes
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace().skip(1);
                let addr = fields.next()?.split('@').next()?;
                let flags = fields.next()?;
                (flags.contains("master") && !flags.contains("fail")).then(|| addr.to_owned())
            })
            .collect();
        Ok(Counters::Redis(primaries))
    }

    /// The counter's value now, summed over the servers.
    pub(crate) async fn read(&self) -> Result<u64> {
        let mut total = 0;
        match self {
            Counters::Redis(nodes) => {
                for node in nodes {
                    let mut con = redis_connection(node).await?;
                    let info: String = redis::cmd("INFO")
                        .arg("commandstats")
                        .query_async(&mut con)
                        .await
                        .map_err(|e| error(format!("{node}: INFO: {e}")))?;
                    total += info
                        .lines()
                        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                        .and_then(|rest| rest.split(',').next())
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
            Counters::Etcd(members) => {
                for member in members {
                    let text = ask(member, "GET /metrics HTTP/1.0\r\n\r\n").await?;
                    total += text
                        .lines()
                        .filter(|l| {
                            l.starts_with("grpc_server_handled_total{")
                                && l.contains("grpc_method=\"Txn\"")
                        })
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum::<f64>() as u64;
                }
            }
            Counters::Zk { hosts, session } => {
                let sid = format!("sid=0x{session:x},");
                for host in hosts {
                    let text = ask(host, "cons").await?;
                    total += text
                        .lines()
                        .filter(|l| l.contains(&sid))
                        .filter_map(|l| l.split("recved=").nth(1)?.split(',').next())
                        .filter_map(|n| n.parse::<u64>().ok())
                        .sum::<u64>();
                }
            }
        }
        Ok(total)
    }
}

async fn redis_connection(node: &str) -> Result<redis::aio::MultiplexedConnection> {
    redis::Client::open(format!("redis://{node}"))
        .map_err(|e| error(format!("{node}: {e}")))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| error(format!("{node}: {e}")))
}

/// Sends `request` to `host` and reads the answer until the server closes the connection
/// (ZooKeeper's four-letter words and an HTTP/1.0 request both end that way).
async fn ask(host: &str, request: &str) -> Result<String> {
    let mut stream = TcpStream::connect(host)
        .await
        .map_err(|e| error(format!("{host}: {e}")))?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| error(format!("{host}: {e}")))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| error(format!("{host}: {e}")))?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}
