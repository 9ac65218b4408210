//! lockkit's own small runtime: one background thread that runs renewals, background
//! releases and whatever connection drivers a backend puts there.
//!
//! Renewal must not depend on the user's runtime having a free worker: a service whose
//! tasks hog every worker (CPU-bound work without `.await`, blocking calls) would otherwise
//! stop renewing and lose its locks. The thread starts on first use and lives for the process.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

use crate::error::{Error, ErrorKind, Result};

static HANDLE: OnceLock<Handle> = OnceLock::new();

thread_local! {
    /// Set on lockkit's runtime thread.
    static ON_LOCKKIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the current thread is lockkit's runtime thread (a backend's background work runs
/// there: renewals, background releases and clean-up).
pub fn is_current() -> bool {
    ON_LOCKKIT.with(std::cell::Cell::get)
}

/// The handle of lockkit's background runtime, starting it on first use.
///
/// Backends may create their connections on it (with [`run`]) so that the connection's driver
/// task keeps running even when the user's runtime is saturated.
///
/// The runtime is built in the calling thread and handed to its own: the first call (often
/// on an async worker) never waits for another thread to start.
pub fn handle() -> &'static Handle {
    HANDLE.get_or_init(|| {
        let runtime = match Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => panic!("lockkit cannot start its background runtime: {e}"),
        };
        let handle = runtime.handle().clone();
        // Never dropped here: dropping a runtime on an async thread panics, and the thread
        // that runs it lives for the process.
        let runtime = ManuallyDrop::new(runtime);
        std::thread::Builder::new()
            .name("lockkit-runtime".into())
            .spawn(move || {
                ON_LOCKKIT.with(|on| on.set(true));
                ManuallyDrop::into_inner(runtime).block_on(std::future::pending::<()>());
            })
            .unwrap_or_else(|e| panic!("lockkit cannot start its background thread: {e}"));
        handle
    })
}

/// Spawns `future` on lockkit's background runtime.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    handle().spawn(future)
}

/// Runs `future` on lockkit's background runtime and waits for its output.
///
/// # Errors
/// [`ErrorKind::Backend`] if the task panicked.
pub async fn run<F, T>(future: F) -> Result<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    spawn(future).await.map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            "core",
            "a task on lockkit's runtime failed",
        )
        .with_source(e)
    })
}
