//! The Sentinels that name a Sentinel-managed [`Primary`]: asked where the primary is when a
//! request fails ([`Sentinels::resolve`]), and listened to, so that each Sentinel's
//! `+switch-master` announcement moves the backend to the new primary before any request
//! fails ([`watch`]).
//!
//! Why listen as well as ask: after a failover the old primary goes on answering as a primary
//! until the Sentinels demote it (about 10 s after a `SENTINEL FAILOVER` on the compose
//! topology, longer when failovers flap). A client that moves only when a request fails goes
//! on granting and renewing there all that time, while the new primary grants the same keys
//! and expires the renewed ones. Following the announcement narrows that split brain to the
//! time between the promotion and its announcement; `min_replicas` and fenced writes are what
//! protect the writes within it.
//!
//! An announced address is followed only if the server there says it is a primary (`ROLE`).
//! Every Sentinel announces each switch it learns of, and one that learns late announces the
//! newest configuration it is told (the Sentinels' hello messages carry the sender's current
//! one), so a stale address comes only from a Sentinel cut off between two quick failovers; the
//! next announcement, or the first request the stale server refuses, corrects it. A
//! subscription that was down may have missed an announcement: each new one first asks its
//! Sentinel where the primary is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use lockkit_core::{Error, ErrorKind, Result};
use redis::ProtocolVersion;
use tokio::sync::watch;

use super::{Dialer, Primary};

/// The Sentinels of a primary and how to ask them.
pub(crate) struct Sentinels {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) master: String,
    /// The Sentinels' own credentials (not the Redis servers').
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// Which Sentinel to ask first next time.
    pub(crate) next: AtomicUsize,
}

/// The channel on which a Sentinel announces a failover's end:
/// `<master name> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// A subscription that dropped is opened again after this long.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// A subscription the Sentinel refused (its ACL lacks `SUBSCRIBE` or the channel) is tried
/// again after this long: the ACL may be mended, but not every second.
const REFUSED_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A subscribed connection is checked this often (`PING`), so that a Sentinel that stopped
/// answering without closing the connection is noticed and its subscription opened again.
const PING_EVERY: Duration = Duration::from_secs(15);

impl Sentinels {
    /// The primary's address: the first answer, asking the Sentinels in turn (starting with a
    /// different one each time, so one stale Sentinel cannot pin us), that names a server
    /// which says it is a primary (`ROLE`).
    pub(super) async fn resolve(&self, dialer: &Dialer) -> Result<(String, u16)> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..self.hosts.len() {
            let (host, port) = &self.hosts[(start + i) % self.hosts.len()];
            let failure = match self.ask(dialer, host, *port).await {
                Ok(addr) => match is_primary(dialer, &addr).await {
                    Ok(true) => return Ok(addr),
                    Ok(false) => Error::new(
                        ErrorKind::Unavailable,
                        dialer.backend,
                        format!("it names {}:{}, which is not a primary", addr.0, addr.1),
                    )
                    .with_retryable(true),
                    Err(e) => e,
                },
                Err(e) => e,
            };
            failures.push((format!("{host}:{port}"), failure));
        }
        // Every Sentinel refusing the same way (an unknown master name, credentials) is that
        // error, not an outage.
        Err(crate::error::none_answered(
            dialer.backend,
            &format!("no Sentinel named a primary for {:?}", self.master),
            &failures,
        ))
    }

    /// The dialer of the Sentinels themselves: their credentials, database 0.
    fn dialer(&self, dialer: &Dialer) -> Dialer {
        Dialer {
            username: self.username.clone(),
            password: self.password.clone(),
            db: 0,
            ..dialer.clone()
        }
    }

    /// The primary's address as the Sentinel at `host:port` knows it.
    async fn ask(&self, dialer: &Dialer, host: &str, port: u16) -> Result<(String, u16)> {
        let sentinel = self.dialer(dialer);
        let client = sentinel.client(sentinel.info(host, port, ProtocolVersion::RESP2)?)?;
        let master = self.master.clone();
        let reply: Option<(String, String)> = sentinel
            .bounded("asking a Sentinel", async move {
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&master)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        let Some((host, port)) = reply else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                dialer.backend,
                format!(
                    "the Sentinel does not know a primary named {:?}",
                    self.master
                ),
            ));
        };
        Ok((host, parse_port(dialer, &port)?))
    }
}

/// Listens to every Sentinel of `primary` for `+switch-master`, one task each on lockkit's
/// runtime, until `stop`'s sender is dropped (with the primary).
pub(super) fn watch(primary: &Arc<Primary>, sentinels: &Sentinels, stop: &watch::Receiver<()>) {
    for host in &sentinels.hosts {
        let primary = Arc::downgrade(primary);
        let host = host.clone();
        let mut stop = stop.clone();
        lockkit_core::backend::runtime::spawn(async move {
            let mut warned = false;
            loop {
                let listened = tokio::select! {
                    _ = stop.changed() => return,
                    listened = listen(&primary, &host) => listened,
                };
                let e = match listened {
                    Ok(()) => return,
                    Err(e) => e,
                };
                // Once per Sentinel: a Sentinel that is down stays down for a while, and
                // requests still find a moved primary by failing.
                if !warned {
                    warned = true;
                    tracing::warn!(sentinel = %format!("{}:{}", host.0, host.1), error = %e,
                        "not listening to a Sentinel's failover announcements; retrying");
                } else {
                    tracing::debug!(error = %e, "a Sentinel subscription failed again");
                }
                let pause = if e.is_retryable() {
                    RESUBSCRIBE_AFTER
                } else {
                    REFUSED_RETRY_AFTER
                };
                tokio::select! {
                    _ = stop.changed() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        });
    }
}

/// One subscription to the Sentinel at `host`: follows each announcement for our master
/// until the connection fails (an error) or the primary is gone (`Ok`).
async fn listen(primary: &Weak<Primary>, host: &(String, u16)) -> Result<()> {
    let Some((dialer, master)) = primary.upgrade().and_then(|primary| {
        let sentinels = primary.sentinels.as_ref()?;
        Some((sentinels.dialer(&primary.dialer), sentinels.master.clone()))
    }) else {
        return Ok(());
    };
    let client = dialer.client(dialer.info(&host.0, host.1, ProtocolVersion::RESP2)?)?;
    let pubsub = dialer
        .bounded("subscribing to a Sentinel's announcements", async move {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(SWITCH_MASTER).await?;
            Ok(pubsub)
        })
        .await?;
    let (mut sink, mut messages) = pubsub.split();
    // Announcements made while this subscription was down.
    let known = match primary.upgrade() {
        Some(primary) => match &primary.sentinels {
            Some(sentinels) => sentinels.ask(&primary.dialer, &host.0, host.1).await?,
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    follow(primary, known).await;
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(message) = message else {
                    return Err(Error::new(ErrorKind::Unavailable, dialer.backend,
                        "the Sentinel closed the subscription").with_retryable(true));
                };
                let Ok(payload) = message.get_payload::<String>() else { continue };
                match switched_to(&payload, &master) {
                    Some((host, port)) => follow(primary, (host, parse_port(&dialer, port)?)).await,
                    None => continue,
                }
            }
            () = tokio::time::sleep(PING_EVERY) => {
                let _: redis::Value = dialer.bounded("pinging a Sentinel", sink.ping()).await?;
            }
        }
    }
}

/// Moves `primary` to `addr` if it is still there and `addr` is elsewhere.
async fn follow(primary: &Weak<Primary>, addr: (String, u16)) {
    if let Some(primary) = primary.upgrade() {
        primary.follow_announcement(addr).await;
    }
}

/// The new primary's host and port in a `+switch-master` payload, if it is about `master`.
fn switched_to<'a>(payload: &'a str, master: &str) -> Option<(String, &'a str)> {
    let mut words = payload.split(' ');
    if words.next()? != master {
        return None;
    }
    let (_old_host, _old_port) = (words.next()?, words.next()?);
    let (host, port) = (words.next()?, words.next()?);
    words.next().is_none().then(|| (host.to_owned(), port))
}

fn parse_port(dialer: &Dialer, port: &str) -> Result<u16> {
    port.parse().map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            dialer.backend,
            format!("a Sentinel answered with the port {port:?}"),
        )
    })
}

/// Whether the server at `addr` says it is a primary.
pub(super) async fn is_primary(dialer: &Dialer, addr: &(String, u16)) -> Result<bool> {
    let client = dialer.client(dialer.info(&addr.0, addr.1, ProtocolVersion::RESP2)?)?;
    let role: Vec<redis::Value> = dialer
        .bounded("asking a server its role", async move {
            let mut con = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE").query_async(&mut con).await
        })
        .await?;
    Ok(matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_names_the_new_primary_of_its_master() {
        let payload = "lkprimary 127.0.0.1 20010 127.0.0.1 20011";
        assert_eq!(
            switched_to(payload, "lkprimary"),
            Some(("127.0.0.1".to_owned(), "20011"))
        );
        assert_eq!(switched_to(payload, "other"), None);
        assert_eq!(switched_to("lkprimary 127.0.0.1 20010", "lkprimary"), None);
        assert_eq!(switched_to(&format!("{payload} extra"), "lkprimary"), None);
    }
}
