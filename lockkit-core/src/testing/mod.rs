//! The conformance suite: the contract between the core and every backend, as runnable
//! scenarios (feature `testing`).
//!
//! A backend crate implements [`Harness`] for its servers and generates one test per
//! scenario with [`conformance_tests!`](crate::conformance_tests):
//!
//! ```text
//! lockkit_core::conformance_tests!(my_backend_harness);
//! ```
//!
//! where `my_backend_harness` is an `async fn() -> Option<MyHarness>` that returns `None`
//! (after [`backend_missing`] has decided between skipping and failing) when the servers are
//! not there. Each scenario works in a fresh random namespace, so scenarios run in parallel
//! against the same servers, and each ends by checking that nothing is left on the server.
//! Scenarios that depend on a capability run only where [`Capabilities`](crate::Capabilities)
//! claims it.

/// Fails the scenario with the message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($msg)+)));
        }
    };
}

mod cancel;
pub mod check;
mod election;
mod fairness;
pub mod fenced;
pub mod history;
mod multi;
mod mutex;
mod operator;
pub mod proxy;
pub mod queue;
mod recording;
mod restart;
mod rwlock;
mod scenarios;
mod secrets;
pub mod sections;
mod semaphore;
mod validity;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use crate::client::LockClient;
use crate::error::Result;
use crate::key::LockKey;
use crate::options::LockOptions;

pub use recording::{Call, Recording, Tick};
pub use restart::waiters_are_granted_across_a_server_restart;
pub use scenarios::SCENARIOS;
pub use secrets::{
    TraceCapture, assert_no_secret, assert_nothing_shown, exercise, owner_token_spellings,
    secret_spellings,
};

/// What a backend provides to run the conformance suite against it.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new client with its own connections (its own session), using `namespace` and
    /// `options`. Clients of one harness contend for the same keys.
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient>;

    /// The TTL scenarios use: short, to keep the suite quick, but one the backend honours.
    fn ttl(&self) -> Duration;

    /// Deletes the current holder's server-side record of `key` behind its back, as an
    /// operator would.
    async fn force_release(&self, key: &LockKey) -> Result<()>;

    /// Simulates a crash of `client`'s process: whatever keeps its grants alive stops (its
    /// session, its keep-alive), and nothing is released. The default drops the client.
    async fn crash(&self, client: LockClient) {
        drop(client);
    }

    /// The server-side records (lock keys, queue entries) left under `namespace`.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>>;
}

/// Why a scenario failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Self {
        Failure(format!("unexpected error: {}", e.display_chain()))
    }
}

impl<T> From<crate::WithLockError<T>> for Failure {
    fn from(e: crate::WithLockError<T>) -> Self {
        Failure::from(crate::Error::from(e))
    }
}

/// Sends `signal` to a server process a test started (by its PID) and waits up to `grace` for
/// it to exit, then kills it; either way it is reaped.
pub fn stop_child(
    mut child: std::process::Child,
    signal: nix::sys::signal::Signal,
    grace: Duration,
) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
    let by = std::time::Instant::now() + grace;
    while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The result of a scenario.
pub type Outcome = std::result::Result<(), Failure>;

/// A scenario: an async function over a harness.
pub type Scenario =
    for<'a> fn(&'a dyn Harness) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// Runs the scenario `name` against `harness`.
///
/// # Errors
/// The scenario's failure, or a failure naming an unknown scenario.
pub async fn run_scenario(harness: &dyn Harness, name: &str) -> Outcome {
    let Some((_, scenario)) = SCENARIOS.iter().find(|(n, _)| *n == name) else {
        return Err(Failure(format!("no scenario named {name}")));
    };
    scenario(harness).await
}

/// Runs every scenario against `harness`, one after another, and returns the failures.
pub async fn run_all(harness: &dyn Harness) -> Vec<(&'static str, Failure)> {
    let mut failures = Vec::new();
    for (name, scenario) in SCENARIOS {
        if let Err(failure) = scenario(harness).await {
            failures.push((*name, failure));
        }
    }
    failures
}

/// Whether tests must fail, rather than skip, when a server is missing:
/// `LOCKKIT_REQUIRE_BACKENDS=1` (set by CI).
pub fn backends_required() -> bool {
    std::env::var("LOCKKIT_REQUIRE_BACKENDS").is_ok_and(|v| v == "1")
}

/// Reports a missing server: panics when [`backends_required`], otherwise prints a notice so
/// the caller can skip.
///
/// # Panics
/// When `LOCKKIT_REQUIRE_BACKENDS=1`.
pub fn backend_missing(what: &str) {
    assert!(
        !backends_required(),
        "{what} is not available and LOCKKIT_REQUIRE_BACKENDS=1: start it with compose/up.sh"
    );
    eprintln!(
        "SKIPPED: {what} is not available (start it with compose/up.sh; set LOCKKIT_REQUIRE_BACKENDS=1 to fail instead)"
    );
}

/// The URL of a test topology, by its variable name (`LOCKKIT_TEST_REDIS_URL`, ...): from the
/// environment, or else from the endpoints file `compose/up.sh` writes
/// (`$LOCKKIT_COMPOSE_DIR/endpoints.env`, by default `target/compose/endpoints.env` in the
/// first ancestor of the current directory that has one).
pub fn endpoint(var: &str) -> Option<String> {
    if let Ok(value) = std::env::var(var) {
        return Some(value);
    }
    let file = match std::env::var_os("LOCKKIT_COMPOSE_DIR") {
        Some(dir) => std::path::PathBuf::from(dir).join("endpoints.env"),
        None => std::env::current_dir()
            .ok()?
            .ancestors()
            .map(|dir| dir.join("target/compose/endpoints.env"))
            .find(|file| file.is_file())?,
    };
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .filter_map(|line| line.split_once('='))
        .find(|(name, _)| name.trim() == var)
        .map(|(_, value)| value.trim().trim_matches('"').to_owned())
}

/// Certificates for TLS tests, made with the `openssl` command in `dir`: a CA (`ca.pem`,
/// `ca.key`), a server certificate it signed for `127.0.0.1` and `localhost` (`server.pem`,
/// `server.key`), a client certificate it signed for mutual TLS (`client.pem`, `client.key`),
/// and `other.pem`, a CA that signed nothing (`other.key`: a key that belongs to no
/// certificate the CA signed). Nothing is committed: every run makes its own. `None`, after [`backend_missing`], when `openssl` is not installed.
///
/// # Panics
/// When `dir` cannot be written or `openssl` fails.
pub fn tls_certificates(dir: &std::path::Path) -> Option<()> {
    use std::process::{Command, Stdio};
    if Command::new("openssl").arg("version").output().is_err() {
        backend_missing("the openssl command (to make test certificates)");
        return None;
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let steps: [&[&str]; 6] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=lockkit-test-ca",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "client.key",
            "-out",
            "client.csr",
            "-subj",
            "/CN=lockkit-test-client",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.pem",
            "-days",
            "1",
            "-extfile",
            "client.ext",
        ],
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "1",
            "-subj",
            "/CN=another-ca",
        ],
    ];
    for args in steps {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
        assert!(status.success(), "openssl {args:?} failed");
    }
    Some(())
}

/// The longest one scenario may run before it counts as hung.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs one scenario on a fresh multi-threaded runtime, for the tests that
/// [`conformance_tests!`](crate::conformance_tests) generates.
///
/// # Panics
/// When the scenario fails or hangs past [`SCENARIO_TIMEOUT`].
pub fn run_one<H, F, Fut>(name: &str, make_harness: F)
where
    H: Harness,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Option<H>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a test runtime: {e}"));
    runtime.block_on(async {
        let Some(harness) = make_harness().await else {
            return;
        };
        match tokio::time::timeout(SCENARIO_TIMEOUT, run_scenario(&harness, name)).await {
            Ok(Ok(())) => {}
            Ok(Err(failure)) => panic!("conformance scenario {name} failed: {failure}"),
            Err(_) => panic!("conformance scenario {name} hung for {SCENARIO_TIMEOUT:?}"),
        }
    });
}

/// Every scenario's name, in the order [`run_all`] runs them: the one list that
/// [`SCENARIOS`] and [`conformance_tests!`](crate::conformance_tests) are made from. Expands
/// to `$callback! { $prefix name, name, ... }`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_scenarios {
    ([$($callback:tt)*] [$($prefix:tt)*]) => {
        $($callback)*! { $($prefix)*
            mutual_exclusion_under_contention,
            fencing_tokens_strictly_increase,
            release_by_non_owner_is_refused,
            abandoned_lease_expires,
            renewal_keeps_lock_past_ttl,
            lost_fires_when_lease_is_taken_away,
            try_lock_returns_none_on_contention,
            lock_timeout_fails_with_timeout,
            cancelled_acquire_leaves_nothing_behind,
            reentrant_owner_shares_the_grant,
            invalid_keys_are_rejected,
            dropped_guard_releases_in_background,
            with_lock_cancels_when_lost,
            with_lock_reports_an_unprotected_end_with_the_value,
            close_waits_for_the_release_of_a_dropped_guard,
            inspect_shows_the_holder,
            release_wakes_a_waiter,
            a_cancelled_waiter_does_not_hold_up_the_next,
            a_cancelled_release_still_releases,
            an_acquisition_dropped_in_flight_leaves_nothing_behind,
            list_shows_the_held_locks_by_prefix_page_by_page,
            force_release_breaks_the_lock_and_the_holder_reports_lost,
            one_leader_at_a_time_with_increasing_terms,
            the_leader_shows_its_proclaimed_value,
            resign_hands_over_at_once,
            a_crashed_leader_is_replaced_after_its_ttl,
            a_deposed_leader_cannot_proclaim,
            a_cancelled_campaign_leaves_nothing_behind,
            observe_ends_on_the_current_leader_in_term_order,
            run_as_leader_cancels_the_work_when_leadership_is_lost,
            lock_all_over_overlapping_sets_never_deadlocks,
            lock_all_takes_nothing_when_a_part_is_taken,
            a_cancelled_lock_all_leaves_nothing_behind,
            lock_all_reports_the_loss_of_any_part,
            a_semaphore_never_admits_more_than_its_permits,
            fair_and_non_fair_permit_holders_never_exceed_the_permits,
            a_semaphore_admits_exactly_its_permits,
            a_permit_release_wakes_a_waiter,
            a_crashed_holder_frees_its_permit_after_its_ttl,
            a_cancelled_permit_acquisition_leaves_nothing_behind,
            renewal_keeps_a_permit_past_its_ttl,
            disagreeing_permit_counts_are_refused,
            a_semaphore_and_the_mutex_of_its_name_are_independent,
            readers_share_and_a_writer_excludes_everyone,
            readers_share_until_a_writer_comes,
            a_waiting_writer_blocks_new_readers,
            a_stream_of_readers_does_not_starve_a_writer,
            a_crashed_reader_frees_the_lock_after_its_ttl,
            a_writer_that_gave_up_does_not_block_readers,
            renewal_keeps_a_write_lock_past_its_ttl,
            an_rwlock_is_independent_of_the_mutex_and_semaphore_of_its_name,
            a_short_mutex_grant_is_confirmed_before_it_is_handed_out,
            a_short_permit_or_rwlock_grant_is_confirmed_before_it_is_handed_out,
            a_short_leadership_grant_is_confirmed_before_it_is_handed_out,
            a_short_grant_that_cannot_be_confirmed_is_given_back_and_taken_again,
            a_reentrant_share_is_handed_out_with_useful_validity,
            lock_all_hands_out_every_part_with_useful_validity,
            fair_waiters_are_granted_in_the_order_they_came,
            fair_permit_waiters_are_granted_in_the_order_they_came,
            waiting_writers_are_granted_in_the_order_they_came,
            a_non_fair_waiter_is_woken_by_a_release,
            fair_and_non_fair_acquirers_exclude_each_other,
            cancelled_non_fair_acquisitions_leave_nothing_behind,
        }
    };
}

/// Generates one `#[test]` per conformance scenario, each running against the harness that
/// `$make_harness` (an `async fn() -> Option<H>`) builds.
#[macro_export]
macro_rules! conformance_tests {
    ($make_harness:path) => {
        $crate::__conformance_scenarios!([$crate::conformance_tests] [@each $make_harness;]);
    };
    (@each $make_harness:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testing::run_one(stringify!($name), $make_harness);
            }
        )*
    };
}
