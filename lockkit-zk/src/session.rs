//! The one ZooKeeper session of a backend: opening it, and watching it so that every grant
//! made on it is reported lost as soon as the session expires or stays suspended too long.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lockkit_core::backend::{Backoff, CancellationToken, runtime};
use lockkit_core::{Error, ErrorKind, Result};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::backend::{ZkBackend, within};
use crate::config::ZkConfig;
use crate::error::{BACKEND, map, timed_out};
use crate::naming::LockPaths;

/// A connected client and the token every grant made through it carries.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// Cancelled when the grants made on this session can no longer be trusted.
    pub(crate) lost: CancellationToken,
}

impl Session {
    /// The server-side session id; ephemeral nodes record it as their owner.
    pub(crate) fn id(&self) -> i64 {
        self.client.session_id().0
    }
}

/// The current session, replaced when the old one expires.
#[derive(Debug)]
pub(crate) struct SessionSlot {
    current: watch::Sender<Arc<Session>>,
}

impl SessionSlot {
    pub(crate) fn current(&self) -> Arc<Session> {
        self.current.borrow().clone()
    }

    /// The current session; if it has ended, waits up to `wait` for its replacement (and
    /// returns the ended one if none comes, so that the caller's request fails as
    /// `Unavailable`).
    pub(crate) async fn usable(&self, wait: Duration) -> Arc<Session> {
        let mut replaced = self.current.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let session = replaced.borrow_and_update().clone();
            if !session.client.state().is_terminated() {
                return session;
            }
            if tokio::time::timeout_at(deadline, replaced.changed())
                .await
                .is_err()
            {
                return session;
            }
        }
    }

    fn replace(&self, session: Session) {
        self.current.send_replace(Arc::new(session));
    }
}

/// Opens a session on lockkit's runtime (so the client's connection task is not starved by
/// a busy user runtime), makes sure the chroot exists and that the credentials can read it,
/// and returns a client rooted at the chroot.
pub(crate) async fn open(config: &ZkConfig) -> Result<zk::Client> {
    let config = config.clone();
    runtime::run(async move {
        let connect_timeout = config.connect_timeout;
        match tokio::time::timeout(connect_timeout, open_here(&config)).await {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                format!(
                    "no session with {} within connect_timeout ({connect_timeout:?})",
                    config.connect_string()
                ),
            )),
        }
    })
    .await?
}

async fn open_here(config: &ZkConfig) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_fail_eagerly();
    if let (Some(user), Some(password)) = (&config.username, &config.password) {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    let client = connect(connector, config, "connect").await?;
    create_chroot(&client, config)
        .await
        .map_err(|e| map("create the chroot", e))?;
    // Digest credentials are not checked at connect time; reading the chroot is.
    client
        .list_children(&config.chroot)
        .await
        .map_err(|e| map("read the chroot", e))?;
    client.chroot(config.chroot.as_str()).map_err(|_| {
        Error::invalid_config(format!(
            "[zk] chroot {:?} is not a valid path",
            config.chroot
        ))
    })
}

/// Creates the chroot, and the nodes above it, where missing: persistent nodes with the ACL
/// of every node lockkit creates. `root` must not be rooted at the chroot.
async fn create_chroot(root: &zk::Client, config: &ZkConfig) -> std::result::Result<(), zk::Error> {
    root.mkdir(
        &config.chroot,
        &zk::CreateMode::Persistent.with_acls(acls(config)),
    )
    .await
}

/// Connects `connector` to the configured hosts, over TLS when the configuration says so
/// (the `what` of a failure names the operation).
pub(crate) async fn connect(
    connector: zk::Connector,
    config: &ZkConfig,
    what: &str,
) -> Result<zk::Client> {
    let hosts = config.connect_string();
    #[cfg(feature = "tls")]
    let connected = if config.tls {
        // Bare hosts in the connect string use TLS with secure_connect.
        let options = crate::tls::options(config)?;
        connector.with_tls(options).secure_connect(&hosts).await
    } else {
        connector.connect(&hosts).await
    };
    #[cfg(not(feature = "tls"))]
    let connected = if config.tls {
        // `validate` refuses this already; never fall back to plaintext.
        return Err(Error::invalid_config(
            "[zk] tls = true needs the cargo feature `tls` of lockkit-zk",
        ));
    } else {
        connector.connect(&hosts).await
    };
    connected.map_err(|e| {
        if config.tls {
            // The client logs why a handshake failed (at debug level), then reports only
            // that no server took the session.
            map(
                &format!(
                    "{what} over TLS (is each host a secureClientPort with a certificate for its name from ca_file's CA, and are cert_file/key_file set if the servers need a client certificate?)"
                ),
                e,
            )
        } else {
            map(what, e)
        }
    })
}

/// The ACL of every node lockkit creates.
pub(crate) fn acls(config: &ZkConfig) -> zk::Acls<'static> {
    if config.creator_only() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    }
}

/// Starts the session slot with `client` and the task that watches it.
pub(crate) fn start(config: &ZkConfig, client: zk::Client) -> Arc<SessionSlot> {
    let states = client.state_watcher();
    let lost = CancellationToken::new();
    let slot = Arc::new(SessionSlot {
        current: watch::Sender::new(Arc::new(Session {
            client,
            lost: lost.clone(),
        })),
    });
    runtime::spawn(watch(Arc::downgrade(&slot), config.clone(), states, lost));
    slot
}

/// Follows the session's states for as long as the backend lives:
/// - `Disconnected` for longer than the grace (a fraction of the negotiated session timeout):
///   the grants are reported lost, since the servers may expire the session at any moment
///   and another client may be granted the lock (Curator's "suspended means lost"); later
///   grants on the same session, once it is back, get a fresh token;
/// - `Expired`, `AuthFailed`, `Closed`: the grants are reported lost at once and a new
///   session is opened for later acquisitions.
///
/// The states describe only the connection to one server. A server cut off from the leader
/// keeps it `SyncConnected` for up to `syncLimit × tickTime` while the leader may expire the
/// session: that case is caught by the renewals, which `sync` with the leader and are trusted
/// only for part of the session timeout (`ZkBackend::owns` in `renewal.rs`, `trusted_for`).
async fn watch(
    slot: Weak<SessionSlot>,
    config: ZkConfig,
    mut states: zk::StateWatcher,
    mut lost: CancellationToken,
) {
    loop {
        let mut state = states.changed().await;
        if state == zk::SessionState::Disconnected {
            let Some(grace) = slot
                .upgrade()
                .map(|s| s.current().client.session_timeout())
                .map(|timeout| timeout.mul_f64(config.suspended_grace_fraction))
            else {
                return;
            };
            match tokio::time::timeout(grace, back_or_terminal(&mut states)).await {
                Ok(next) => state = next,
                Err(_) => {
                    tracing::warn!(
                        grace_ms = grace.as_millis() as u64,
                        "zk session suspended past its grace: reporting its locks lost"
                    );
                    lost.cancel();
                    let Some(slot) = slot.upgrade() else {
                        return;
                    };
                    lost = CancellationToken::new();
                    let client = slot.current().client.clone();
                    slot.replace(Session {
                        client,
                        lost: lost.clone(),
                    });
                    continue;
                }
            }
        }
        if !state.is_terminated() {
            continue;
        }
        lost.cancel();
        if slot.strong_count() == 0 {
            // The backend was dropped and its client closed the session.
            return;
        }
        tracing::warn!(
            ?state,
            "zk session ended: its locks are lost; opening a new session"
        );
        let Some(client) = reopen(&slot, &config).await else {
            return;
        };
        states = client.state_watcher();
        lost = CancellationToken::new();
        let Some(slot) = slot.upgrade() else {
            return;
        };
        slot.replace(Session {
            client,
            lost: lost.clone(),
        });
    }
}

/// Waits until a disconnected session is connected again or has ended.
async fn back_or_terminal(states: &mut zk::StateWatcher) -> zk::SessionState {
    loop {
        let state = states.changed().await;
        if state == zk::SessionState::SyncConnected || state.is_terminated() {
            return state;
        }
    }
}

/// Opens a new session, retrying until it works or the backend is gone.
async fn reopen(slot: &Weak<SessionSlot>, config: &ZkConfig) -> Option<zk::Client> {
    let mut delay = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        slot.upgrade()?;
        match open_here_bounded(config).await {
            Ok(client) => return Some(client),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open a new zk session; retrying");
                tokio::time::sleep(delay.next_delay()).await;
            }
        }
    }
}

async fn open_here_bounded(config: &ZkConfig) -> Result<zk::Client> {
    tokio::time::timeout(config.connect_timeout, open_here(config))
        .await
        .unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "no new session within connect_timeout",
            ))
        })
}

/// The part of the session timeout after which `zookeeper-client` declares a silent
/// connection dead (8 of its ticks of 1/20 of the timeout).
pub(crate) const DEAD_CONNECTION_FRACTION: f64 = 0.4;

/// The largest part of the session timeout a grant or renewal is trusted for, whatever the
/// grace (see [`trusted_for`]).
pub(crate) const MAX_TRUSTED_FRACTION: f64 = 0.5;

/// How long a grant or a renewal is trusted, counted (by the core) from when its request was
/// sent: `min(ttl, T × min(1 − 0.4 − suspended_grace_fraction, 0.5))`, `T` being the
/// negotiated session timeout; 0.3 `T` with the default grace.
///
/// A lock node lives as long as its session, and the leader expires a session `T` after it
/// last heard of it; it may then grant the lock to someone else. The request behind a grant or
/// renewal reached the leader, with the session alive, after it was sent: a create is a write,
/// and a renewal (or the grant of a node found again) issues a `sync` first; both fail on a
/// server cut off from the leader. The leader hears of a session from the server the client
/// is connected to, which reports the sessions it saw whenever the leader pings it (every half
/// `tickTime`), and the client sends something at least every 0.2 `T` (`zookeeper-client`
/// pings after 3/20 `T` of silence, checked every 1/20 `T`). So the leader's last news of the
/// session is at most 0.2 `T` + `tickTime`/2 older than the send time, and it cannot expire
/// the session before 0.8 `T` − `tickTime`/2 after that send: at least 0.55 `T` as long as
/// `tickTime` ≤ `T`/2 (the servers' default `minSessionTimeout` is 2 `tickTime`). 0.5 `T`
/// leaves the rest for network delay; the core takes clock drift off as well.
///
/// What this rests on besides: `sync` is not a quorum operation. A leader that has just lost
/// its quorum still answers it until it notices (within `syncLimit × tickTime`); its
/// followers notice the loss within the same limit before they elect a new leader, and a new
/// leader starts every session's timeout afresh, so this is covered as long as the servers
/// agree on the limit (they share one configuration).
///
/// The `1 − 0.4 − grace` term is the tighter one for a grace above 0.1. With it, the time a
/// verified contact is trusted and the longest disconnection the session watcher rides out
/// (`(0.4 + grace) × T`, see [`ZkConfig::suspended_grace_fraction`]) add up to the session
/// timeout: a longer grace buys tolerance of disconnections with more frequent renewals.
pub(crate) fn trusted_for(
    ttl: Duration,
    session_timeout: Duration,
    grace_fraction: f64,
) -> Duration {
    let fraction = (1.0 - DEAD_CONNECTION_FRACTION - grace_fraction).min(MAX_TRUSTED_FRACTION);
    ttl.min(session_timeout.mul_f64(fraction.max(0.0)))
}

pub(crate) fn is_connected(client: &zk::Client) -> bool {
    client.state() == zk::SessionState::SyncConnected
}

impl ZkBackend {
    /// The stat of `path` as the leader sees it: a `sync` and the read, sent back to back
    /// (a server answers a session's requests in order, so the read waits for the sync).
    /// `sync` is answered through the leader, so it fails (or times out) on a server cut off
    /// from it, and its success shows the session was alive on the leader after it was sent.
    pub(crate) async fn stat_via_leader(
        &self,
        session: &Session,
        path: &str,
    ) -> Result<std::result::Result<Option<zk::Stat>, zk::Error>> {
        let synced = session.client.sync(path);
        let read = session.client.check_stat(path);
        let (synced, read) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, read) })
                .await
                .map_err(|_| timed_out("read the lock node through the leader"))?;
        Ok(synced.and(read))
    }

    /// `stat` if known, else our node's stat as the leader sees it; `None` when the node is
    /// not ours on this session (gone, or left by an earlier one).
    pub(crate) async fn own_stat(
        &self,
        session: &Session,
        path: &str,
        stat: Option<zk::Stat>,
    ) -> Result<Option<zk::Stat>> {
        if stat.is_some() {
            return Ok(stat);
        }
        match self.stat_via_leader(session, path).await? {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id() => Ok(Some(stat)),
            Ok(_) => Ok(None),
            Err(e) => Err(map("read the lock node through the leader", e)),
        }
    }

    /// The queue, listed after a `sync` with the leader, in one round trip.
    pub(crate) async fn queue_after_sync(
        &self,
        session: &Session,
        paths: &LockPaths,
    ) -> Result<Vec<String>> {
        let synced = session.client.sync(&paths.parent);
        let listed = session.client.list_children(&paths.parent);
        let (synced, listed) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, listed) })
                .await
                .map_err(|_| timed_out("read the lock queue through the leader"))?;
        match synced.and(listed) {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map("read the lock queue through the leader", e)),
        }
    }

    /// The queue and our node `name`'s stat, both read after a `sync` with the leader, in
    /// one round trip (the three requests are sent back to back and applied in order). This
    /// is the check [`Self::evaluate`] would otherwise make through the leader after a plain
    /// listing, one round trip later, when our node comes first: the listing is now at least
    /// as recent as that check. The stat is `None` when the node is not ours on this
    /// session, which leaves the decision to `evaluate`.
    pub(crate) async fn queue_via_leader(
        &self,
        session: &Session,
        paths: &LockPaths,
        name: &str,
    ) -> Result<(Vec<String>, Option<zk::Stat>)> {
        let path = paths.child(name);
        let synced = session.client.sync(&paths.parent);
        let listed = session.client.list_children(&paths.parent);
        let read = session.client.check_stat(&path);
        let (synced, listed, read) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, listed, read) })
                .await
                .map_err(|_| timed_out("read the lock queue through the leader"))?;
        let children = match synced.and(listed) {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map("read the lock queue through the leader", e)),
        };
        let stat = match read {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id() => Some(stat),
            Ok(_) => None,
            Err(e) => return Err(map("read the lock node through the leader", e)),
        };
        Ok((children, stat))
    }

    /// Creates the chroot again, as at session start, after the server deleted it: another
    /// client (Curator without a chroot in its connect string) that found it missing created
    /// it as a container, which the server deletes once it is empty. Requests go through a
    /// clone of the session's client rooted at `/`: the same session and credentials (the
    /// clones of a `zookeeper-client` `Client` share both), so the ACL is the one the session
    /// start would have given.
    pub(crate) async fn recreate_chroot(&self, session: &Session) -> Result<()> {
        let config = &self.inner.config;
        let root = session.client.clone().chroot("/").map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                "the client refused the ZooKeeper root as a path",
            )
        })?;
        tracing::warn!(
            chroot = %config.chroot,
            "the zk chroot is gone (deleted by the server as an empty container?): creating it again as a persistent node"
        );
        within(
            self.timeout(),
            "create the chroot again",
            create_chroot(&root, config),
        )
        .await?
        .map_err(|e| map("create the chroot again", e))
    }

    /// How long a grant or renewal is trusted: see [`trusted_for`].
    pub(crate) fn trusted_for(&self, ttl: Duration) -> Duration {
        trusted_for(
            ttl,
            self.session_timeout(),
            self.inner.config.suspended_grace_fraction,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_trusted_for_less_than_the_leader_needs_to_expire_the_session() {
        let session = Duration::from_secs(10);
        let ttl = Duration::from_secs(30);
        assert_eq!(trusted_for(ttl, session, 0.3), Duration::from_secs(3));
        assert_eq!(trusted_for(ttl, session, 0.5), Duration::from_secs(1));
        assert_eq!(trusted_for(ttl, session, 0.0), Duration::from_secs(5));
        let short = Duration::from_secs(2);
        assert_eq!(trusted_for(short, session, 0.3), short);
    }
}
