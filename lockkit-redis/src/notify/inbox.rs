//! The hand-over inboxes: where a queued waiter learns that a release gave it the lock.
//!
//! A backend's waiters share one [`Inbox`], a channel named `lockkit:inbox:` and 128 random
//! bits (the same name on every server of a Redlock backend). A waiter registers under its
//! owner digest before the attempt that may queue it ([`Inbox::expect`]), and each attempt
//! queues it under `digest/attempt` ([`Handover::attempting`]). The release that hands it the
//! lock announces `digest/attempt:token` on the inbox; the notifier that hears it passes it to
//! [`Inbox::announced`], which keeps the token for the waiter only if the waiter is still
//! registered and the announcement names its last attempt, and wakes the waiter on the first
//! announcement and on those from a quorum on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};

use tokio::sync::Notify;

/// The inbox of a backend's waiters: the channel the grants handed over to them are
/// announced on (the same name on every server of a Redlock backend), and the waiters that
/// expect one.
pub(crate) struct Inbox {
    name: String,
    /// How many servers must announce a hand-over for it to count (a majority of Redlock's).
    quorum: usize,
    /// The queued waiters, by owner digest.
    expecting: StdMutex<HashMap<String, Arc<Handover>>>,
}

impl Inbox {
    /// A new inbox, named `lockkit:inbox:` and 128 random bits, for hand-overs that count
    /// once `quorum` servers announced them.
    pub(crate) fn new(quorum: usize) -> Self {
        Inbox {
            name: format!("lockkit:inbox:{:032x}", rand::random::<u128>()),
            quorum,
            expecting: StdMutex::default(),
        }
    }

    /// The channel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Registers the queued waiter `digest` (an owner digest), before the attempt that may
    /// queue it: a grant announced from then on is kept for it. Registering again returns
    /// the same [`Handover`].
    pub(crate) fn expect(&self, digest: &str) -> Arc<Handover> {
        let mut expecting = self.expecting();
        if let Some(handover) = expecting.get(digest) {
            return handover.clone();
        }
        let handover = Arc::new(Handover::default());
        expecting.insert(digest.to_owned(), handover.clone());
        handover
    }

    /// Unregisters the waiter `digest`: it holds the lock, or gave up.
    pub(crate) fn forget(&self, digest: &str) {
        self.expecting().remove(digest);
    }

    pub(super) fn expecting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Handover>>> {
        self.expecting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A grant announced by server `node` (`digest/attempt:token`, the name its waiter's
    /// attempt queued under, see [`Handover::attempting`]): handed to the waiter `digest` if
    /// it is still registered (one that gave up released the lock on the server, or will)
    /// and that attempt is its last.
    pub(super) fn announced(&self, node: usize, message: &[u8]) {
        let Some((digest, attempt, token)) = std::str::from_utf8(message)
            .ok()
            .and_then(|m| m.split_once(':'))
            .and_then(|(name, token)| {
                let (digest, attempt) = name.split_once('/')?;
                Some((
                    digest,
                    attempt.parse::<u64>().ok()?,
                    token.parse::<u64>().ok()?,
                ))
            })
        else {
            tracing::debug!("ignoring a malformed hand-over announcement");
            return;
        };
        if let Some(handover) = self.expecting().get(digest) {
            let mut tokens = handover.tokens();
            if handover.attempt.load(Ordering::SeqCst) != attempt
                || tokens.iter().any(|(from, _)| *from == node)
            {
                return;
            }
            tokens.push((node, token));
            // The waiter looks at the first announcement (the others should follow within
            // a node timeout) and at those from a quorum on, not at each one below it: each
            // wake-up is a thread switch on a contended lock's hand-over path.
            let wake = tokens.len() == 1 || tokens.len() >= self.quorum;
            drop(tokens);
            if wake {
                handover.arrived.notify_one();
            }
        }
    }

    /// Wakes every registered waiter: announcements may have been lost.
    pub(super) fn wake_all(&self) {
        for handover in self.expecting().values() {
            handover.arrived.notify_one();
        }
    }
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("expecting", &self.expecting().len())
            .finish_non_exhaustive()
    }
}

/// Where a queued waiter learns that the lock was handed over to it.
pub(crate) struct Handover {
    arrived: Notify,
    /// The servers that announced the grant, with its fencing token on each.
    tokens: StdMutex<Vec<(usize, u64)>>,
    /// When the waiter registered, in µs of the wall clock: its turn in Redlock's queues,
    /// the same on every node.
    turn: u64,
    /// How many attempts the waiter made: each queues it under its digest and this number,
    /// which the hand-over's announcement repeats.
    attempt: AtomicU64,
    /// The waiter's last attempt reached too few nodes for a majority: until one does, its
    /// attempts do not queue (see Redlock's `attempt.rs`).
    cut_off: AtomicBool,
}

impl Default for Handover {
    fn default() -> Self {
        let turn = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
            });
        Handover {
            arrived: Notify::new(),
            tokens: StdMutex::default(),
            turn,
            attempt: AtomicU64::new(0),
            cut_off: AtomicBool::new(false),
        }
    }
}

impl Handover {
    /// The waiter's turn in the queues of Redlock's nodes.
    pub(crate) fn turn(&self) -> u64 {
        self.turn
    }

    /// Whether the waiter's last attempt reached too few nodes for a majority.
    pub(crate) fn is_cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }

    /// Records whether the waiter's last attempt reached too few nodes for a majority.
    pub(crate) fn set_cut_off(&self, cut_off: bool) {
        self.cut_off.store(cut_off, Ordering::SeqCst);
    }

    /// Starts a new attempt, and returns the name it queues under, `digest/attempt`: only a
    /// hand-over announced under that name counts from now on. One announced under an
    /// earlier attempt's name may predate this attempt, and be gone by now (the waiter
    /// paused past the grant's life, say): had it not, this attempt finds the lock its own.
    /// What was announced before no longer counts either.
    pub(crate) fn attempting(&self, digest: &str) -> String {
        // Under the tokens' lock, as the announcements are checked and recorded.
        let mut tokens = self.tokens();
        let attempt = self.attempt.fetch_add(1, Ordering::SeqCst) + 1;
        tokens.clear();
        format!("{digest}/{attempt}")
    }

    /// Waits until a server announces the grant, or a disconnection of a pub/sub connection
    /// may have lost an announcement (then [`Handover::tokens`] may have nothing new: look at
    /// the lock).
    pub(crate) async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// The servers that announced the grant to the current attempt (their index), with its
    /// token on each.
    pub(crate) fn tokens(&self) -> std::sync::MutexGuard<'_, Vec<(usize, u64)>> {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter paused past the life of a grant handed to it (SIGSTOP in the fault campaign)
    /// reads that grant's announcement only after it has attempted again and queued behind
    /// the next holder: the late announcement must not count for the new attempt.
    #[test]
    fn an_announcement_counts_only_for_the_attempt_it_names() {
        let inbox = Inbox::new(1);
        let handover = inbox.expect("d");
        let first = handover.attempting("d");
        assert_eq!(first, "d/1");
        inbox.announced(0, format!("{first}:5").as_bytes());
        assert_eq!(handover.tokens().as_slice(), &[(0, 5)]);

        let second = handover.attempting("d");
        assert!(
            handover.tokens().is_empty(),
            "an earlier attempt's grant is gone"
        );
        inbox.announced(0, format!("{first}:7").as_bytes());
        assert!(
            handover.tokens().is_empty(),
            "a late announcement was taken"
        );
        inbox.announced(0, format!("{second}:9").as_bytes());
        assert_eq!(handover.tokens().as_slice(), &[(0, 9)]);

        inbox.announced(0, b"not an announcement");
        inbox.forget("d");
        inbox.announced(1, format!("{second}:11").as_bytes());
        assert_eq!(
            handover.tokens().as_slice(),
            &[(0, 9)],
            "a forgotten waiter"
        );
    }
}
