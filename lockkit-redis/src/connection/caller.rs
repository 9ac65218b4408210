//! The connection an application's runtime drives itself (see [`CallerConnection`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redis::ConnectionInfo;
use redis::aio::ConnectionManager;

use super::Dialer;

/// The connection an application's runtime drives itself, for the requests its tasks make on
/// a contended lock's hand-over path (attempts, releases): sent and answered without a switch
/// to lockkit's thread and back, which costs a contended lock throughput and client CPU
/// (docs/measurements.md: "Redis: where a contended hand-over's time goes" and "Contended
/// hand-over with caller connections").
///
/// Opened on first use from a runtime that is not lockkit's, so its driver runs there; a task
/// on that runtime that never ends is dropped when the runtime shuts down and forgets the
/// connection then, so that no request reaches a driver that is gone (the next runtime to ask
/// opens its own). One client keeps one such connection, whichever runtime opened it: a
/// second runtime that shares the client sends on it too. Renewals keep their own
/// connection on lockkit's runtime: a saturated application runtime delays the attempts and
/// releases sent on its connection, never a renewal.
pub(super) struct CallerConnection {
    dialer: Dialer,
    info: ConnectionInfo,
    slot: Arc<std::sync::Mutex<Option<(u64, ConnectionManager)>>>,
    opened: AtomicUsize,
}

impl CallerConnection {
    pub(super) fn new(dialer: &Dialer, info: ConnectionInfo) -> Self {
        CallerConnection {
            dialer: dialer.clone(),
            info,
            slot: Arc::default(),
            opened: AtomicUsize::new(0),
        }
    }

    pub(super) fn existing(&self) -> Option<ConnectionManager> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|(_, connection)| connection.clone())
    }

    /// The application runtime's connection, opened now if it has none; `shared` on
    /// lockkit's runtime, outside any runtime or task, on a current-thread runtime, or when
    /// the connection cannot be set up.
    ///
    /// A future that `block_on` runs (`#[tokio::main]`'s own, say) is not a task: it is
    /// polled on the thread that blocks, not on a worker, and a runtime's connection would be
    /// driven on a worker anyway; the hop to lockkit's thread, which waits on nothing else,
    /// costs less than one to a parked worker (docs/measurements.md, "Contended hand-over
    /// with caller connections"). A current-thread runtime runs its tasks only while a thread
    /// blocks on it: a connection driven there would stall every other runtime's requests on
    /// it whenever that runtime sits idle, still alive.
    pub(super) fn get(&self, shared: &ConnectionManager) -> ConnectionManager {
        if lockkit_core::backend::runtime::is_current() || tokio::task::try_id().is_none() {
            return shared.clone();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return shared.clone();
        };
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return shared.clone();
        }
        let mut slot = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, connection)) = slot.as_ref() {
            return connection.clone();
        }
        let Ok(connection) = self.dialer.lazy(self.info.clone()) else {
            return shared.clone();
        };
        let id = self.opened.fetch_add(1, Ordering::Relaxed) as u64;
        *slot = Some((id, connection.clone()));
        let forget = ForgetOnDrop {
            slot: Arc::downgrade(&self.slot),
            id,
        };
        runtime.spawn(async move {
            let _forget = forget;
            std::future::pending::<()>().await;
        });
        connection
    }
}

/// Forgets the caller connection `id` when dropped: at the shutdown of the runtime that
/// drives it.
struct ForgetOnDrop {
    slot: std::sync::Weak<std::sync::Mutex<Option<(u64, ConnectionManager)>>>,
    id: u64,
}

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.upgrade() {
            let mut slot = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.as_ref().is_some_and(|(id, _)| *id == self.id) {
                *slot = None;
            }
        }
    }
}
