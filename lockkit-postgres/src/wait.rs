//! Waiting without polling: one `LISTEN` connection per client, a channel per key that the
//! client waits on, and a board of what the connection heard, which waiters read.
//!
//! The functions of the schema notify the key's channel (`lockkit_` and 32 hex digits of
//! SHA-256 over `<kind>/<namespace>/<name>`, [`channel`]) when a row goes (`r <seq> <key>`: a
//! release, an abandon, a broken lock) and when a mutex is granted or its leader proclaims
//! (`g <seq> <key>`). A client listens only to the channels of the keys it waits on or
//! observes, so a server's notifications reach the clients that care, and an idle waiter
//! costs nothing. A channel stays listened to for [`LINGER`] after its last waiter, so that a
//! key waited on again and again is not subscribed again each time.
//!
//! The listener numbers what it hears on the [`Board`]; an attempt reads the board's count
//! before it is sent (its [`Contention::marker`](lockkit_core::backend::Contention)), and its
//! wait ends on the first later event that concerns it: the removal of the row it waits on
//! (a mutex, a writer or a reader waits on the nearest row ahead that keeps it out), or any
//! removal in its key (a permit: any release may free one). So a release wakes one waiter of
//! a mutex, not all of them.
//!
//! Nothing is missed. A notification is sent by the commit that removed the row, after the
//! attempt that saw the row was sent; if the channel was listened to before the marker was
//! taken, the notification lands on the board after the marker. If it was not (the first
//! wait on a key), the wait subscribes, and ends as soon as the `LISTEN` is done, for an
//! attempt that can no longer miss anything. Whenever the listener may have missed a
//! notification (its connection broke, or did not answer its ping every 5 s), it posts a
//! reset, which ends every wait; a wait while it is down is a short poll. A waiter also ends its wait after a third of its TTL, for its
//! next attempt to refresh its row.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use lockkit_core::backend::{CancellationToken, runtime};
use tokio::sync::{mpsc, watch};
use tokio_postgres::AsyncMessage;

use crate::tls::Transport;

/// How many events the board keeps: a waiter whose marker is older ends its wait.
const KEPT: usize = 4096;

/// How long a wait lasts at most while the listener is down.
const POLL: Duration = Duration::from_millis(250);

/// How long a channel stays listened to after its last waiter left.
const LINGER: Duration = Duration::from_secs(10);

/// The longest pause between two connection attempts of the listener.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The channel of a key named `<kind>/<namespace>/<name>`, as `lockkit.channel` in the
/// schema computes it.
pub(crate) fn channel(key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut name = String::from("lockkit_");
    for byte in &digest.as_ref()[..16] {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// One notification, or a change of the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// The row `seq` of `key` went.
    Removed { seq: i64, key: String },
    /// A mutex of `key` was granted, or its leader proclaimed.
    Changed { key: String },
    /// The listener now listens to `channel`.
    Listening { channel: String },
    /// Notifications may have been missed.
    Reset,
}

/// What a wait ends on, besides a reset or its channel's subscription.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Interest {
    /// The removal of row `seq`.
    Row(i64),
    /// Any removal in the key.
    Removal,
    /// Any event of the key.
    Any,
}

impl Event {
    fn concerns(&self, key: &str, channel: &str, interest: Interest) -> bool {
        match (self, interest) {
            (Event::Reset, _) => true,
            (Event::Listening { channel: c }, _) => c == channel,
            (Event::Removed { seq, .. }, Interest::Row(row)) => *seq == row,
            (Event::Removed { key: k, .. }, Interest::Removal | Interest::Any) => k == key,
            (Event::Changed { key: k }, Interest::Any) => k == key,
            _ => false,
        }
    }

    fn parse(payload: &str) -> Option<Event> {
        let (tag, rest) = payload.split_once(' ')?;
        let (seq, key) = rest.split_once(' ')?;
        let key = key.to_owned();
        match tag {
            "r" => Some(Event::Removed {
                seq: seq.parse().ok()?,
                key,
            }),
            "g" => Some(Event::Changed { key }),
            _ => None,
        }
    }
}

/// What the listener heard, numbered, and the channels it listens to.
#[derive(Debug)]
pub(crate) struct Board {
    state: StdMutex<State>,
    count: watch::Sender<u64>,
    subscribe: mpsc::UnboundedSender<String>,
    requests: StdMutex<Option<mpsc::UnboundedReceiver<String>>>,
}

#[derive(Debug, Default)]
struct State {
    count: u64,
    events: VecDeque<(u64, Event)>,
    up: bool,
    channels: HashMap<String, Channel>,
}

#[derive(Debug)]
struct Channel {
    waiters: usize,
    /// The count at which the `LISTEN` was done, on the current connection.
    since: Option<u64>,
    idle_since: Instant,
}

/// A waiter's use of a channel; the last one out starts the channel's linger.
struct Use<'a> {
    board: &'a Board,
    channel: &'a str,
}

impl Drop for Use<'_> {
    fn drop(&mut self) {
        if let Some(channel) = self.board.state().channels.get_mut(self.channel) {
            channel.waiters -= 1;
            channel.idle_since = Instant::now();
        }
    }
}

impl Board {
    pub(crate) fn new() -> Board {
        let (subscribe, requests) = mpsc::unbounded_channel();
        Board {
            state: StdMutex::new(State::default()),
            count: watch::Sender::new(0),
            subscribe,
            requests: StdMutex::new(Some(requests)),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of the last event: an attempt's marker.
    pub(crate) fn marker(&self) -> u64 {
        self.state().count
    }

    fn post(&self, event: Event) {
        let count = {
            let mut state = self.state();
            state.post(event)
        };
        self.count.send_replace(count);
    }

    /// Registers a waiter on `channel`, asking the listener to listen to it if nobody does.
    fn enter<'a>(&'a self, channel: &'a str) -> Use<'a> {
        let mut state = self.state();
        let entry = state.channels.entry(channel.to_owned()).or_insert_with(|| {
            let _ = self.subscribe.send(channel.to_owned());
            Channel {
                waiters: 0,
                since: None,
                idle_since: Instant::now(),
            }
        });
        entry.waiters += 1;
        Use {
            board: self,
            channel,
        }
    }

    /// Whether an event after `marker` concerns the wait (or may have: the board no longer
    /// keeps events that old, or the channel was not listened to yet at `marker`), and
    /// whether the listener is up.
    fn check(&self, key: &str, channel: &str, marker: u64, interest: Interest) -> (bool, bool) {
        let state = self.state();
        let late = state
            .channels
            .get(channel)
            .and_then(|c| c.since)
            .is_some_and(|since| since > marker);
        let forgotten = state
            .events
            .front()
            .is_some_and(|(first, _)| *first > marker + 1);
        let heard = late
            || forgotten
            || state
                .events
                .iter()
                .rev()
                .take_while(|(n, _)| *n > marker)
                .any(|(_, event)| event.concerns(key, channel, interest));
        (heard, state.up)
    }

    /// Waits until an event after `marker` concerns `interest` in `key` (named as in the
    /// notifications), or `max_wait` has passed (at most [`POLL`] while the listener is
    /// down).
    pub(crate) async fn wait(
        &self,
        key: &str,
        marker: u64,
        interest: Interest,
        max_wait: Duration,
    ) {
        let channel = channel(key);
        let _use = self.enter(&channel);
        let mut seen = self.count.subscribe();
        let sleep = tokio::time::sleep(max_wait);
        tokio::pin!(sleep);
        loop {
            seen.mark_unchanged();
            let (heard, up) = self.check(key, &channel, marker, interest);
            if heard {
                return;
            }
            if !up {
                // A poll, cut short when the listener comes up (it posts then): a new
                // client's first waits do not wait out the poll for its first connection.
                tokio::select! {
                    () = tokio::time::sleep(max_wait.min(POLL)) => {}
                    _ = seen.changed() => {}
                }
                return;
            }
            tokio::select! {
                () = &mut sleep => return,
                changed = seen.changed() => if changed.is_err() { return },
            }
        }
    }
}

impl State {
    fn post(&mut self, event: Event) -> u64 {
        self.count += 1;
        if self.events.len() == KEPT {
            self.events.pop_front();
        }
        self.events.push_back((self.count, event));
        self.count
    }
}

/// Starts the listener of `board` on lockkit's runtime; it stops when `stop` is cancelled.
pub(crate) fn listen(
    pg: tokio_postgres::Config,
    transport: Transport,
    connect_timeout: Duration,
    board: Arc<Board>,
    stop: CancellationToken,
) {
    let Some(mut requests) = board
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    else {
        return;
    };
    runtime::spawn(async move {
        let mut pause = Duration::from_millis(50);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                listened = listen_once(&pg, &transport, connect_timeout, &board, &mut requests) => {
                    if listened {
                        pause = Duration::from_millis(50);
                    }
                }
            }
            board.went_down();
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    });
}

impl Board {
    fn went_down(&self) {
        let count = {
            let mut state = self.state();
            state.up = false;
            for channel in state.channels.values_mut() {
                channel.since = None;
            }
            state.post(Event::Reset)
        };
        self.count.send_replace(count);
    }

    /// Marks `channels` as listened to from now, and the listener as up.
    fn listening(&self, channels: &[String]) {
        let count = {
            let mut state = self.state();
            state.up = true;
            let mut count = state.count;
            for name in channels {
                count = state.post(Event::Listening {
                    channel: name.clone(),
                });
                if let Some(channel) = state.channels.get_mut(name) {
                    channel.since = Some(count);
                }
            }
            count
        };
        self.count.send_replace(count);
    }

    /// The channels to listen to, and takes out those idle past their linger.
    fn channels(&self) -> (Vec<String>, Vec<String>) {
        let mut state = self.state();
        let idle: Vec<String> = state
            .channels
            .iter()
            .filter(|(_, c)| c.waiters == 0 && c.idle_since.elapsed() >= LINGER)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            state.channels.remove(name);
        }
        (state.channels.keys().cloned().collect(), idle)
    }
}

/// One connection of the listener, until it breaks. Whether it got as far as listening.
async fn listen_once(
    pg: &tokio_postgres::Config,
    transport: &Transport,
    timeout: Duration,
    board: &Arc<Board>,
    requests: &mut mpsc::UnboundedReceiver<String>,
) -> bool {
    let connecting = tokio::time::timeout(timeout, pg.connect(transport.clone())).await;
    let Ok(Ok((client, mut connection))) = connecting else {
        tracing::debug!("the PostgreSQL listener cannot connect");
        return false;
    };
    let posting = board.clone();
    let mut driver = runtime::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if let Some(event) = Event::parse(n.payload()) {
                        posting.post(event);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "the PostgreSQL listener's connection broke");
                    return;
                }
            }
        }
    });
    let client = &client;
    let run = |sql: String| async move {
        matches!(
            tokio::time::timeout(timeout, client.batch_execute(&sql)).await,
            Ok(Ok(()))
        )
    };
    let statement = |verb: &str, names: &[String]| {
        names
            .iter()
            .map(|name| format!("{verb} {name};"))
            .collect::<String>()
    };
    let (channels, _) = board.channels();
    if !run(statement("LISTEN", &channels)).await {
        driver.abort();
        return false;
    }
    board.listening(&channels);
    let mut tick = tokio::time::interval(LINGER / 2);
    loop {
        tokio::select! {
            _ = &mut driver => return true,
            Some(name) = requests.recv() => {
                let names = vec![name];
                if !run(statement("LISTEN", &names)).await {
                    break;
                }
                board.listening(&names);
            }
            _ = tick.tick() => {
                // The ping finds a connection that died without a word (a partition), which
                // would otherwise leave every waiter of this client unwoken.
                let (_, idle) = board.channels();
                let sql = statement("UNLISTEN", &idle) + "SELECT 1;";
                if !run(sql).await {
                    break;
                }
            }
        }
    }
    driver.abort();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_into_events() {
        assert_eq!(
            Event::parse("r 42 0/ns/a b"),
            Some(Event::Removed {
                seq: 42,
                key: "0/ns/a b".into()
            })
        );
        assert_eq!(
            Event::parse("g 7 0/ns/x"),
            Some(Event::Changed {
                key: "0/ns/x".into()
            })
        );
        assert_eq!(Event::parse("x 1 k"), None);
        assert_eq!(Event::parse("r nan k"), None);
    }

    #[test]
    fn a_channel_is_a_short_identifier() {
        let name = channel("0/ns/a name");
        assert_eq!(name.len(), 8 + 32);
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        );
        assert_ne!(name, channel("0/ns/another"));
    }

    #[test]
    fn a_wait_ends_on_its_row_and_not_on_others() {
        let board = Board::new();
        let key = "0/ns/a";
        let name = channel(key);
        let _use = board.enter(&name);
        board.listening(std::slice::from_ref(&name));
        let marker = board.marker();
        board.post(Event::Removed {
            seq: 1,
            key: key.into(),
        });
        assert!(!board.check(key, &name, marker, Interest::Row(2)).0);
        assert!(board.check(key, &name, marker, Interest::Removal).0);
        assert!(board.check(key, &name, marker, Interest::Row(1)).0);
        assert!(!board.check(key, &name, board.marker(), Interest::Row(1)).0);
        board.post(Event::Reset);
        assert!(
            board
                .check("0/ns/b", &channel("0/ns/b"), marker, Interest::Any)
                .0
        );
    }

    #[test]
    fn a_wait_subscribed_after_its_marker_ends_once_listening() {
        let board = Board::new();
        let key = "1/ns/s";
        let name = channel(key);
        let marker = board.marker();
        let _use = board.enter(&name);
        assert!(!board.check(key, &name, marker, Interest::Removal).0);
        board.listening(std::slice::from_ref(&name));
        assert!(board.check(key, &name, marker, Interest::Removal).0);
        assert!(!board.check(key, &name, board.marker(), Interest::Removal).0);
    }

    #[test]
    fn a_forgotten_marker_ends_the_wait() {
        let board = Board::new();
        for seq in 0..(KEPT as i64 + 2) {
            board.post(Event::Removed {
                seq,
                key: "k".into(),
            });
        }
        assert!(board.check("k", &channel("k"), 0, Interest::Row(-1)).0);
    }
}

#[cfg(test)]
mod server_tests {
    use lockkit_core::testing;

    use crate::{PostgresBackend, PostgresConfig};

    #[tokio::test]
    async fn the_schema_names_channels_as_the_client_does() {
        let Some(url) = testing::endpoint("LOCKKIT_TEST_POSTGRES_URL") else {
            testing::backend_missing("PostgreSQL (LOCKKIT_TEST_POSTGRES_URL)");
            return;
        };
        let config = PostgresConfig::from_url(&url).expect("a valid URL");
        let backend = match PostgresBackend::connect(config).await {
            Ok(backend) => backend,
            Err(e) => return testing::backend_missing(&format!("PostgreSQL at {url} ({e})")),
        };
        for key in ["0/ns/job", "2/lk-test/a name with ünïcode"] {
            let row = backend
                .inner
                .session
                .query_one(
                    "naming a channel",
                    "SELECT lockkit.channel($1)",
                    &[(&key, tokio_postgres::types::Type::TEXT)],
                )
                .await
                .expect("lockkit.channel");
            assert_eq!(row.get::<_, String>(0), super::channel(key), "{key}");
        }
    }
}
