//! The one ZooKeeper session of a backend: opening it, and watching it so that every grant
//! made on it is reported lost as soon as the session expires or stays suspended too long.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lockkit_core::{CancellationToken, Error, ErrorKind, Result, runtime};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{BACKEND, map};

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
    let acls = acls(config);
    client
        .mkdir(&config.chroot, &zk::CreateMode::Persistent.with_acls(acls))
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
/// only for part of the session timeout (`ZkBackend::owns`, `trusted_for`).
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
    let mut delay = Duration::from_millis(50);
    loop {
        slot.upgrade()?;
        match open_here_bounded(config).await {
            Ok(client) => return Some(client),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open a new zk session; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
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
