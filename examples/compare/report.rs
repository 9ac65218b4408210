//! The Markdown tables (the chart is `chart.rs`).

use crate::TierReport;

/// Three Markdown tables (W1, with the floors of the tiers that have two named under it; W2
/// with a row per contender; the fault workloads), the failures, and the other Redis tiers
/// against single-node Redis.
pub(crate) fn markdown(reports: &[TierReport]) -> String {
    let mut out = String::from(
        "| target | tier | W1 cycles/s | W1 p50 µs | W1 p99 µs | W1 raw floor p50 µs (lockkit/floor) | W1 2nd raw floor p50 µs (lockkit/floor) | W1 peer p50 µs (lockkit/peer) | W1 p50 vs single Redis, same rounds |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        let u = r.uncontended.as_ref();
        let cells = [
            r.target.clone(),
            tier(r),
            cell(r, "W1", u, |u| format!("{:.0}", u.cycles_per_sec)),
            cell(r, "W1", u, |u| format!("{:.1}", u.p50_us)),
            cell(r, "W1", u, |u| format!("{:.1}", u.p99_us)),
            cell(r, "W1", u, |u| match (u.floor_p50_us, u.vs_floor) {
                (Some(floor), Some(ratio)) => format!("{floor:.1} ({ratio:.2}x)"),
                _ => "n/a".to_owned(),
            }),
            cell(r, "W1", u, |u| {
                match (u.second_floor_p50_us, u.vs_second_floor) {
                    (Some(floor), Some(ratio)) => format!("{floor:.1} ({ratio:.2}x)"),
                    _ => "n/a".to_owned(),
                }
            }),
            cell(r, "W1", u, |u| match (&u.peer, u.peer_p50_us, u.vs_peer) {
                (Some(peer), Some(p50), Some(ratio)) => format!("{peer} {p50:.1} ({ratio:.2}x)"),
                _ => "n/a".to_owned(),
            }),
            cell(r, "W1", u, |u| match (u.reference_p50_us, u.vs_reference) {
                (Some(single), Some(ratio)) => format!("{ratio:.2}x ({single:.1} µs)"),
                _ => "n/a".to_owned(),
            }),
        ];
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    let two_floors: Vec<String> = reports
        .iter()
        .filter_map(|r| {
            let u = r.uncontended.as_ref()?;
            Some(format!(
                "- {} W1 raw floors: {}; 2nd: {}\n",
                r.target,
                u.floor.as_deref()?,
                u.second_floor.as_deref()?
            ))
        })
        .collect();
    if !two_floors.is_empty() {
        out.push('\n');
        out.extend(two_floors);
    }

    let sizes = reports
        .iter()
        .find_map(|r| r.contended.as_ref())
        .map_or(String::new(), |c| {
            format!(
                " ({} workers x {} iterations, medians of {} interleaved rounds)",
                c.workers, c.iterations, c.rounds
            )
        });
    out.push_str(&format!(
        "\nW2 contended{sizes}:\n\n\
         | target | contender | incr/s | wait p50 ms | wait p99 ms | max wait ms | client CPU µs/incr | lost updates | lockkit/this incr/s | lockkit/this max wait |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    ));
    for r in reports {
        let Some(c) = &r.contended else {
            let failed = cell(r, "W2", None::<()>, |_| String::new());
            out.push_str(&format!("| {} | {failed} | | | | | | | | |\n", r.target));
            continue;
        };
        let sides = [
            (None, Some(&c.lockkit)),
            (Some("lockkit"), c.non_fair.as_ref()),
            (Some("raw floor"), c.floor.as_ref()),
            (Some("raw floor"), c.second_floor.as_ref()),
            (Some("peer"), c.peer.as_ref()),
        ];
        for (role, side) in sides {
            let Some(side) = side else { continue };
            let contender = match role {
                None => "lockkit".to_owned(),
                Some("lockkit") => side.what.clone(),
                Some(role) => format!("{role}: {}", side.what),
            };
            let ratios = match role {
                None => ["".to_owned(), "".to_owned()],
                Some(_) => [
                    format!(
                        "{:.2}x",
                        c.lockkit.increments_per_sec / side.increments_per_sec
                    ),
                    format!("{:.2}x", c.lockkit.wait_max_us / side.wait_max_us),
                ],
            };
            out.push_str(&format!(
                "| {} | {contender} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} |\n",
                r.target,
                side.increments_per_sec,
                side.wait_p50_us / 1e3,
                side.wait_p99_us / 1e3,
                side.wait_max_us / 1e3,
                side.cpu_us_per_increment
                    .map_or_else(|| "n/a".to_owned(), |cpu| format!("{cpu:.0}")),
                side.lost_updates,
                ratios[0],
                ratios[1],
            ));
        }
    }

    let faults_run = reports.iter().any(|r| {
        r.holder_crash.is_some()
            || r.holder_pause.is_some()
            || r.failover.is_some()
            || ["W3", "W4", "W5"].iter().any(|w| r.failed(w))
    });
    if faults_run {
        faults(&mut out, reports);
    }
    if reports
        .iter()
        .any(|r| r.election.is_some() || r.failed("W6"))
    {
        elections(&mut out, reports);
    }
    if reports
        .iter()
        .any(|r| r.permits.is_some() || r.failed("W7"))
    {
        permits(&mut out, reports);
    }
    if reports
        .iter()
        .any(|r| r.read_write.is_some() || r.failed("W8"))
    {
        read_write(&mut out, reports);
    }
    let failures: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.failures
                .iter()
                .map(move |f| format!("- {} {} FAILED: {}\n", r.target, f.workload, f.error))
        })
        .collect();
    if !failures.is_empty() {
        out.push('\n');
        out.extend(failures);
    }
    let against_single: Vec<String> = reports
        .iter()
        .filter_map(|r| {
            let u = r.uncontended.as_ref()?;
            let single = u.reference_p50_us?;
            let floor = u.floor_p50_us.map_or(String::new(), |f| {
                format!("; its raw floor {:.2}x", f / single)
            });
            Some(format!(
                "- {}: W1 p50 {:.2}x single-node Redis in the same rounds{floor}\n",
                r.target,
                u.p50_us / single
            ))
        })
        .collect();
    if !against_single.is_empty() {
        out.push('\n');
        out.extend(against_single);
    }
    out
}

/// The table of W3, W4 and W5.
fn faults(out: &mut String, reports: &[TierReport]) {
    out.push_str(
        "\n| target | W3 crash: granted after ms (TTL 2 s) | W4 pause: overlapping writes (after lost) | W4 stale writes rejected / accepted | W5 killed | W5 overlaps | W5 stale rejected / accepted | W5 longest gap ms |\n\
         |---|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for r in reports {
        let cells = [
            r.target.clone(),
            cell(r, "W3", r.holder_crash.as_ref(), |w| {
                format!("{:.0}", w.recovery_ms)
            }),
            cell(r, "W4", r.holder_pause.as_ref(), |w| {
                format!("{} ({})", w.overlapping_writes, w.written_after_lost)
            }),
            cell(r, "W4", r.holder_pause.as_ref(), |w| {
                format!("{} / {}", w.stale_rejected, w.stale_accepted)
            }),
            cell(r, "W5", r.failover.as_ref(), |w| w.killed.clone()),
            cell(r, "W5", r.failover.as_ref(), |w| w.overlaps.to_string()),
            cell(r, "W5", r.failover.as_ref(), |w| {
                format!("{} / {}", w.stale_rejected, w.stale_accepted)
            }),
            cell(r, "W5", r.failover.as_ref(), |w| {
                format!("{:.0}", w.longest_gap_ms)
            }),
        ];
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// The table of W6.
fn elections(out: &mut String, reports: &[TierReport]) {
    out.push_str(
        "\nW6 leader election (a standby waiting each time):\n\n\
         | target | leader crashed: new leader after ms (TTL 2 s) | resign: new leader after ms, p50 | resign: max ms |\n\
         |---|---:|---:|---:|\n",
    );
    for r in reports {
        let w6 = r.election.as_ref();
        let unsupported = w6.is_none() && !r.failed("W6") && !r.tier.is_empty();
        let cells = if unsupported {
            [
                r.target.clone(),
                "no elections".into(),
                String::new(),
                String::new(),
            ]
        } else {
            [
                r.target.clone(),
                cell(r, "W6", w6, |w| {
                    w.crash_to_leader_ms
                        .map_or("n/a".into(), |ms| format!("{ms:.0}"))
                }),
                cell(r, "W6", w6, |w| format!("{:.2}", w.resign_to_leader_p50_ms)),
                cell(r, "W6", w6, |w| format!("{:.2}", w.resign_to_leader_max_ms)),
            ]
        };
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// The table of W7.
fn permits(out: &mut String, reports: &[TierReport]) {
    out.push_str(&format!(
        "\nW7 semaphore ({} workers, {} permits, each held {} ms):\n\n\
         | target | grants/s | of ideal | wait p50 ms | wait max ms | most holders at once |\n\
         |---|---:|---:|---:|---:|---:|\n",
        crate::permits::WORKERS,
        crate::permits::PERMITS,
        crate::permits::HOLD.as_millis(),
    ));
    for r in reports {
        let w7 = r.permits.as_ref();
        let unsupported = w7.is_none() && !r.failed("W7") && !r.tier.is_empty();
        let cells = if unsupported {
            let mut row = vec![r.target.clone(), "no semaphores".into()];
            row.resize(6, String::new());
            row
        } else {
            vec![
                r.target.clone(),
                cell(r, "W7", w7, |w| format!("{:.0}", w.grants_per_sec)),
                cell(r, "W7", w7, |w| format!("{:.2}", w.of_ideal)),
                cell(r, "W7", w7, |w| format!("{:.2}", w.wait_p50_ms)),
                cell(r, "W7", w7, |w| format!("{:.1}", w.wait_max_ms)),
                cell(r, "W7", w7, |w| w.most_holders.to_string()),
            ]
        };
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// The table of W8.
fn read_write(out: &mut String, reports: &[TierReport]) {
    out.push_str(&format!(
        "\nW8 read-write lock ({} workers, one grant in {} a write, each held {} ms):\n\n\
         | target | grants/s | read wait p50 ms | read wait max ms | write wait p50 ms | write wait max ms | most readers at once | writes overtaken |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        crate::rwlock::WORKERS,
        crate::rwlock::WRITE_EVERY,
        crate::rwlock::HOLD.as_millis(),
    ));
    for r in reports {
        let w8 = r.read_write.as_ref();
        let unsupported = w8.is_none() && !r.failed("W8") && !r.tier.is_empty();
        let cells = if unsupported {
            let mut row = vec![r.target.clone(), "no read-write locks".into()];
            row.resize(8, String::new());
            row
        } else {
            vec![
                r.target.clone(),
                cell(r, "W8", w8, |w| format!("{:.0}", w.grants_per_sec)),
                cell(r, "W8", w8, |w| format!("{:.2}", w.read_wait_p50_ms)),
                cell(r, "W8", w8, |w| format!("{:.1}", w.read_wait_max_ms)),
                cell(r, "W8", w8, |w| format!("{:.2}", w.write_wait_p50_ms)),
                cell(r, "W8", w8, |w| format!("{:.1}", w.write_wait_max_ms)),
                cell(r, "W8", w8, |w| w.most_readers.to_string()),
                cell(r, "W8", w8, |w| w.writes_overtaken.to_string()),
            ]
        };
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// The tier's name, or why it has none (it could not be reached).
fn tier(report: &TierReport) -> String {
    if report.tier.is_empty() {
        cell(report, "connect", None::<()>, |_| String::new())
    } else {
        report.tier.clone()
    }
}

/// A cell of `report`'s row: `show(value)`, `FAILED` if `workload` failed on this tier (the
/// error is listed under the table), `n/a` if it was not run.
fn cell<T>(
    report: &TierReport,
    workload: &str,
    value: Option<T>,
    show: impl FnOnce(T) -> String,
) -> String {
    match value {
        Some(value) => show(value),
        None if report.failed(workload) => "FAILED".to_owned(),
        None => "n/a".to_owned(),
    }
}
