//! Waiting without polling: one `LISTEN` connection per client, a channel per key that the
//! client waits on, and a board of what the connection heard, which waiters read.
//!
//! The schema's functions notify the key's channel (`lockkit_` and 32 hex digits of SHA-256
//! over `<kind>/<namespace>/<name>`, [`channel`]) when a statement grants a row that somebody
//! else's statement queued (`h <seq> <proof> <key>`: a hand-over), and, for an election's
//! observers, when a leader proclaims (`g <seq> <key>`) and when a leader that proclaimed goes
//! (`r <seq> <key>`). A client listens only to the channels of the keys it waits on or
//! observes, so a server's notifications reach the clients that care, and an idle waiter
//! costs nothing. A channel stays listened to for [`LINGER`] after its last waiter, so that a
//! key waited on again and again is not subscribed again each time.
//!
//! The listener numbers what it hears on the [`Board`]; an attempt reads the board's count
//! before it is sent (its [`Contention::marker`](lockkit_core::backend::Contention)), and its
//! wait ends on the first later event that concerns it: its own hand-over, which is its
//! grant. Every statement that changes a key's queue grants whatever may hold after it, so a
//! waiter that is not handed the lock has nothing to try: a release wakes the waiters it
//! grants, one for a mutex or a permit, the readers at the head for a read-write lock, and
//! nobody else. A hand-over counts only with its proof ([`handover_proof`]), which only the
//! server and the owner of the row can make: anybody who may connect may `NOTIFY`.
//!
//! Nothing is missed. A hand-over is notified by the commit that granted the row, after the
//! attempt that found it waiting was sent; if the channel was listened to before the marker
//! was taken, the notification lands on the board after the marker. If it was not (the first
//! wait on a key), the wait subscribes, and ends as soon as the `LISTEN` is done, for an
//! attempt that can no longer miss anything. Whenever the listener may have missed a
//! notification (its connection broke, or did not answer its ping every 5 s), it posts a
//! reset, which ends every wait; a wait while it is down is a short poll. What no statement
//! does, a holder's expiry, the waiter's timer covers: its wait ends when the first row ahead
//! of it expires (the attempt's `retry_after`), and after a third of its TTL, for its next
//! attempt to refresh its row.

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
    format!("lockkit_{}", hex(&digest.as_ref()[..16]))
}

/// The proof that a hand-over's row `seq` is the one of the owner whose token has the digest
/// `owner` (`digest_hex`): 128 bits of SHA-256 over `<owner>/<seq>`, in hex, as
/// `lockkit.hand_over` makes it.
pub(crate) fn handover_proof(owner: &str, seq: i64) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{owner}/{seq}").as_bytes());
    hex(&digest.as_ref()[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// One notification, or a change of the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// The row `seq` of `key` was granted, with this proof.
    Granted {
        seq: i64,
        proof: String,
        key: String,
    },
    /// An election's leader of `key` proclaimed, or went.
    Changed { key: String },
    /// The listener now listens to `channel`.
    Listening { channel: String },
    /// Notifications may have been missed.
    Reset,
}

/// What a wait ends on, besides a reset or its channel's subscription.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Interest<'a> {
    /// The hand-over of `row` to the owner whose token has the digest `owner`: its grant.
    Handover { row: i64, owner: &'a str },
    /// Any event of the key: an election's observer.
    Any,
}

impl Event {
    fn concerns(&self, key: &str, channel: &str, interest: Interest<'_>) -> bool {
        match (self, interest) {
            (Event::Reset, _) => true,
            (Event::Listening { channel: c }, _) => c == channel,
            (Event::Granted { key: k, .. } | Event::Changed { key: k }, Interest::Any) => k == key,
            (Event::Granted { .. }, Interest::Handover { row, owner }) => {
                self.handed_to(row, owner)
            }
            (Event::Changed { .. }, Interest::Handover { .. }) => false,
        }
    }

    fn parse(payload: &str) -> Option<Event> {
        let (tag, rest) = payload.split_once(' ')?;
        let (seq, rest) = rest.split_once(' ')?;
        let seq = seq.parse().ok()?;
        match tag {
            "h" => {
                let (proof, key) = rest.split_once(' ')?;
                Some(Event::Granted {
                    seq,
                    proof: proof.to_owned(),
                    key: key.to_owned(),
                })
            }
            "g" | "r" => Some(Event::Changed {
                key: rest.to_owned(),
            }),
            _ => None,
        }
    }

    /// Whether this is the hand-over of `row` to the owner whose token has the digest
    /// `owner`, with the proof only the server could make (checked last: it costs a hash).
    fn handed_to(&self, row: i64, owner: &str) -> bool {
        matches!(self, Event::Granted { seq, proof, .. }
            if *seq == row && *proof == handover_proof(owner, row))
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

/// What [`Board::check`] found.
struct Check {
    heard: bool,
    up: bool,
    handed: Option<i64>,
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
    /// keeps events that old, or the channel was not listened to yet at `marker`), whether
    /// the listener is up, and the row handed over after `marker`, if the wait is for one.
    fn check(&self, key: &str, channel: &str, marker: u64, interest: Interest<'_>) -> Check {
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
        let recent = || state.events.iter().rev().take_while(|(n, _)| *n > marker);
        let handed = match interest {
            Interest::Handover { row, owner } => recent()
                .any(|(_, e)| e.handed_to(row, owner))
                .then_some(row),
            Interest::Any => None,
        };
        let heard = late
            || forgotten
            || handed.is_some()
            || recent().any(|(_, event)| event.concerns(key, channel, interest));
        Check {
            heard,
            up: state.up,
            handed,
        }
    }

    /// Waits until an event after `marker` concerns `interest` in `key` (named as in the
    /// notifications), or `max_wait` has passed (at most [`POLL`] while the listener is
    /// down). The row handed over, if that ended it.
    pub(crate) async fn wait(
        &self,
        key: &str,
        marker: u64,
        interest: Interest<'_>,
        max_wait: Duration,
    ) -> Option<i64> {
        let channel = channel(key);
        let _use = self.enter(&channel);
        let mut seen = self.count.subscribe();
        let sleep = tokio::time::sleep(max_wait);
        tokio::pin!(sleep);
        loop {
            seen.mark_unchanged();
            let check = self.check(key, &channel, marker, interest);
            if check.heard {
                return check.handed;
            }
            if !check.up {
                // A poll, cut short when the listener comes up (it posts then): a new
                // client's first waits do not wait out the poll for its first connection.
                tokio::select! {
                    () = tokio::time::sleep(max_wait.min(POLL)) => {}
                    _ = seen.changed() => {}
                }
                return None;
            }
            tokio::select! {
                () = &mut sleep => return None,
                changed = seen.changed() => if changed.is_err() { return None },
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
            Event::parse("h 43 0a1b 0/ns/a b"),
            Some(Event::Granted {
                seq: 43,
                proof: "0a1b".into(),
                key: "0/ns/a b".into(),
            })
        );
        for payload in ["g 7 0/ns/x", "r 7 0/ns/x"] {
            let changed = Event::Changed {
                key: "0/ns/x".into(),
            };
            assert_eq!(Event::parse(payload), Some(changed));
        }
        assert_eq!(
            Event::parse("h 43 0/ns/a"),
            None,
            "a hand-over without its proof"
        );
        assert_eq!(Event::parse("h 43"), None);
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

    /// A listened-to channel, and the board's marker then.
    fn listened(board: &Board, key: &str) -> (String, u64) {
        let name = channel(key);
        board.listening(std::slice::from_ref(&name));
        (name, board.marker())
    }

    #[test]
    fn a_wait_ends_on_the_handover_of_its_row_with_its_proof() {
        let board = Board::new();
        let key = "0/ns/h";
        let name = channel(key);
        let _use = board.enter(&name);
        let (_, marker) = listened(&board, key);
        let granted = |seq, owner| Event::Granted {
            seq,
            proof: handover_proof(owner, seq),
            key: key.into(),
        };
        // A forged proof for our row, a true one for a row we had before, a leader change.
        board.post(granted(9, "someone else"));
        board.post(granted(8, "mine"));
        board.post(Event::Changed { key: key.into() });
        let mine = Interest::Handover {
            row: 9,
            owner: "mine",
        };
        let check = board.check(key, &name, marker, mine);
        assert!(
            !check.heard,
            "another's hand-over or a leader change woke a waiter"
        );
        assert!(board.check(key, &name, marker, Interest::Any).heard);
        board.post(granted(9, "mine"));
        let check = board.check(key, &name, marker, mine);
        assert_eq!((check.heard, check.handed), (true, Some(9)));
        assert_eq!(board.check(key, &name, board.marker(), mine).handed, None);
        board.post(Event::Reset);
        let check = board.check("0/ns/b", &channel("0/ns/b"), marker, Interest::Any);
        assert!(check.heard && check.handed.is_none());
    }

    #[test]
    fn a_wait_subscribed_after_its_marker_ends_once_listening() {
        let board = Board::new();
        let key = "1/ns/s";
        let name = channel(key);
        let marker = board.marker();
        let _use = board.enter(&name);
        let mine = Interest::Handover {
            row: 9,
            owner: "mine",
        };
        assert!(!board.check(key, &name, marker, mine).heard);
        board.listening(std::slice::from_ref(&name));
        assert!(board.check(key, &name, marker, mine).heard);
        assert!(!board.check(key, &name, board.marker(), mine).heard);
    }

    #[test]
    fn a_forgotten_marker_ends_the_wait() {
        let board = Board::new();
        for _ in 0..KEPT + 2 {
            board.post(Event::Changed { key: "k".into() });
        }
        assert!(
            board
                .check(
                    "k",
                    &channel("k"),
                    0,
                    Interest::Handover {
                        row: 9,
                        owner: "mine"
                    }
                )
                .heard
        );
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
