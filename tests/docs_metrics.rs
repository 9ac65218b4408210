//! The README's metrics table names every metric lockkit records, and only those.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[test]
fn the_readme_lists_every_metric() {
    let readme = include_str!("../README.md");
    let listed: Vec<&str> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("| `lockkit_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let all: Vec<String> = lockkit::metrics::ALL
        .iter()
        .map(|name| name.trim_start_matches("lockkit_").to_owned())
        .collect();
    assert_eq!(
        listed, all,
        "the README's metrics table and metrics::ALL disagree"
    );
}
