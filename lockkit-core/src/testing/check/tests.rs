//! The checkers' unit tests: each catches what it names, and passes what it should.

use super::*;

/// Builds a history from `(ms, process, what)` on key `k`.
fn history(events: &[(u64, &str, What)]) -> Vec<Event> {
    events
        .iter()
        .map(|(ms, process, what)| Event {
            at_ns: ms * 1_000_000,
            process: (*process).to_owned(),
            key: "k".to_owned(),
            what: what.clone(),
        })
        .collect()
}

fn granted(token: u64) -> What {
    granted_as(token, GrantKind::Exclusive)
}

fn granted_as(token: u64, kind: GrantKind) -> What {
    What::Granted {
        token,
        remaining_ms: 1000,
        floor_ms: 100,
        kind,
    }
}

fn released(token: u64, outcome: &str) -> What {
    What::Released {
        token,
        outcome: outcome.to_owned(),
    }
}

fn clean() -> Vec<Event> {
    history(&[
        (0, "a", What::Invoke),
        (1, "a", granted(1)),
        (2, "b", What::Invoke),
        (3, "a", What::Stored { token: 1 }),
        (4, "a", What::Release { token: 1 }),
        (5, "a", released(1, "ok")),
        (6, "b", granted(2)),
        (7, "b", What::Stored { token: 2 }),
        (8, "b", What::Release { token: 2 }),
        (9, "b", released(2, "ok")),
    ])
}

#[test]
fn a_clean_history_shows_nothing() {
    let verdict = check(&clean());
    assert_eq!(verdict.acquisitions, 2);
    assert_eq!(verdict.violations, Vec::<String>::new());
    assert_eq!(
        verdict,
        Verdict {
            acquisitions: 2,
            ..Verdict::default()
        }
    );
}

#[test]
fn catches_an_overlap() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (10, "b", granted(2)),
        (15, "a", What::Release { token: 1 }),
        (20, "b", What::Release { token: 2 }),
    ]));
    assert_eq!(verdict.overlaps, 1);
    assert_eq!(verdict.overlap_max, Duration::from_millis(5));
}

#[test]
fn permits_overlap_up_to_their_count_and_no_further() {
    let two = GrantKind::Permit { permits: 2 };
    let verdict = check(&history(&[
        (0, "a", granted_as(1, two)),
        (1, "b", granted_as(2, two)),
        (2, "a", What::Release { token: 1 }),
        (3, "c", granted_as(3, two)),
        (4, "d", granted_as(4, two)),
        (7, "b", What::Release { token: 2 }),
        (9, "c", What::Release { token: 3 }),
        (9, "d", What::Release { token: 4 }),
    ]));
    assert_eq!(verdict.overlaps, 1, "{:?}", verdict.violations);
    assert_eq!(verdict.overlap_max, Duration::from_millis(3));
    assert!(
        verdict.violations[0].contains("3 holders"),
        "{:?}",
        verdict.violations
    );
}

#[test]
fn readers_share_and_a_writer_overlaps_with_anyone() {
    let verdict = check(&history(&[
        (0, "a", granted_as(1, GrantKind::Read)),
        (1, "b", granted_as(2, GrantKind::Read)),
        (2, "c", granted_as(3, GrantKind::Write)),
        (4, "a", What::Release { token: 1 }),
        (5, "b", What::Release { token: 2 }),
        (6, "c", What::Release { token: 3 }),
        (7, "d", granted_as(4, GrantKind::Read)),
    ]));
    assert_eq!(verdict.overlaps, 2, "{:?}", verdict.violations);
    assert_eq!(verdict.overlap_total, Duration::from_millis(5));
}

#[test]
fn a_permit_extended_beside_a_full_semaphore_took_it_back() {
    let two = GrantKind::Permit { permits: 2 };
    let extended = What::Extended {
        token: 1,
        outcome: "ok".to_owned(),
    };
    let beside_one = check(&history(&[
        (0, "a", granted_as(1, two)),
        (1, "b", granted_as(2, two)),
        (2, "a", extended.clone()),
    ]));
    assert_eq!(beside_one.foreign_extends, 0);
    let beside_two = check(&history(&[
        (0, "a", granted_as(1, two)),
        (1, "a", What::Lost { token: 1 }),
        (2, "b", granted_as(2, two)),
        (3, "c", granted_as(3, two)),
        (4, "a", extended),
    ]));
    assert_eq!(beside_two.foreign_extends, 1);
}

#[test]
fn a_write_after_the_lost_signal_stretches_the_section() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (5, "a", What::Lost { token: 1 }),
        (10, "b", granted(2)),
        (11, "b", What::Stored { token: 2 }),
        (
            12,
            "a",
            What::Refused {
                token: 1,
                highest: 2,
            },
        ),
        (20, "b", What::Release { token: 2 }),
    ]));
    assert_eq!(verdict.overlaps, 1);
    assert_eq!(verdict.stale_rejected, 1);
    assert_eq!(verdict.stale_accepted, 0);
    assert_eq!(verdict.lost_signals, 1);
}

#[test]
fn a_lost_signal_before_the_next_grant_is_no_overlap() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (5, "a", What::Lost { token: 1 }),
        (10, "b", granted(2)),
        (20, "b", What::Release { token: 2 }),
    ]));
    assert_eq!(verdict.overlaps, 0);
}

#[test]
fn catches_a_token_regression_and_a_duplicate() {
    let verdict = check(&history(&[
        (0, "a", granted(5)),
        (1, "a", What::Release { token: 5 }),
        (2, "b", What::Invoke),
        (3, "b", granted(4)),
        (4, "b", What::Release { token: 4 }),
        (5, "c", What::Invoke),
        (6, "c", granted(5)),
    ]));
    assert_eq!(verdict.token_regressions, 1, "{:?}", verdict.violations);
    assert_eq!(verdict.token_duplicates, 1);
}

#[test]
fn concurrent_acquires_may_finish_in_any_token_order() {
    let verdict = check(&history(&[
        (0, "a", What::Invoke),
        (0, "b", What::Invoke),
        (1, "b", granted(2)),
        (2, "b", What::Release { token: 2 }),
        (3, "a", granted(1)),
    ]));
    assert_eq!(verdict.token_regressions, 0);
}

#[test]
fn catches_a_stale_write_accepted() {
    // b's token went backwards, so the resource cannot tell a's write is stale.
    let verdict = check(&history(&[
        (0, "a", granted(5)),
        (5, "a", What::Lost { token: 5 }),
        (10, "b", granted(4)),
        (11, "b", What::Stored { token: 4 }),
        (12, "a", What::Stored { token: 5 }),
    ]));
    assert_eq!(verdict.stale_accepted, 1);
}

#[test]
fn a_write_before_the_new_holder_wrote_is_an_overlap_not_a_stale_write() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (5, "a", What::Lost { token: 1 }),
        (10, "b", granted(2)),
        (11, "a", What::Stored { token: 1 }),
        (12, "b", What::Stored { token: 2 }),
    ]));
    assert_eq!(verdict.stale_accepted, 0);
    assert_eq!(verdict.overlaps, 1);
}

#[test]
fn catches_a_foreign_release() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (10, "b", granted(2)),
        (12, "a", What::Release { token: 1 }),
        (13, "a", released(1, "ok")),
        (20, "b", What::Release { token: 2 }),
        (21, "b", released(2, "not_held")),
    ]));
    assert_eq!(verdict.foreign_releases, 1);
    let refused = check(&history(&[
        (0, "a", granted(1)),
        (10, "b", granted(2)),
        (12, "a", What::Release { token: 1 }),
        (13, "a", released(1, "not_held")),
        (20, "b", What::Release { token: 2 }),
        (21, "b", released(2, "ok")),
    ]));
    assert_eq!(refused.foreign_releases, 0);
    // The later holder's release answered after its validity: its lease may have expired.
    let expired = check(&history(&[
        (0, "a", granted(1)),
        (10, "b", granted(2)),
        (12, "a", What::Release { token: 1 }),
        (13, "a", released(1, "ok")),
        (20, "b", What::Release { token: 2 }),
        (2000, "b", released(2, "expired")),
    ]));
    assert_eq!(expired.foreign_releases, 0);
}

#[test]
fn catches_a_foreign_extend() {
    let extended = |outcome: &str| What::Extended {
        token: 1,
        outcome: outcome.to_owned(),
    };
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (2, "a", extended("ok")),
        (10, "b", granted(2)),
        (12, "a", extended("ok")),
        (13, "a", extended("Lost")),
    ]));
    assert_eq!(verdict.foreign_extends, 1);
}

#[test]
fn catches_a_late_grant() {
    let verdict = check(&history(&[(
        0,
        "a",
        What::Granted {
            token: 1,
            remaining_ms: 0,
            floor_ms: 100,
            kind: GrantKind::Exclusive,
        },
    )]));
    assert_eq!(verdict.late_grants, 1);
}

#[test]
fn catches_a_grant_under_its_floor() {
    let verdict = check(&history(&[(
        0,
        "a",
        What::Granted {
            token: 1,
            remaining_ms: 37,
            floor_ms: 100,
            kind: GrantKind::Exclusive,
        },
    )]));
    assert_eq!((verdict.late_grants, verdict.under_floor), (0, 1));
    let at_the_floor = check(&history(&[(
        0,
        "a",
        What::Granted {
            token: 1,
            remaining_ms: 50,
            floor_ms: 50,
            kind: GrantKind::Exclusive,
        },
    )]));
    assert_eq!(at_the_floor.under_floor, 0, "{at_the_floor:?}");
    assert!(
        verdict.violations[0].contains("under its floor"),
        "{verdict:?}"
    );
}

#[test]
fn measures_recovery_and_lost_lag() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (
            100,
            "injector",
            What::Fault {
                description: "partition".into(),
                target: Some("a".into()),
            },
        ),
        (900, "a", What::Lost { token: 1 }),
        (1100, "b", granted(2)),
    ]));
    assert_eq!(verdict.recovery, vec![Some(Duration::from_millis(1000))]);
    assert_eq!(verdict.lost_lag, vec![Some(Duration::from_millis(800))]);
    assert_eq!(verdict.overlaps, 0);
}

#[test]
fn a_killed_worker_holds_until_its_death() {
    let verdict = check(&history(&[
        (0, "a", granted(1)),
        (5, "a", What::Killed),
        (10, "b", granted(2)),
    ]));
    assert_eq!(verdict.overlaps, 0);
}
