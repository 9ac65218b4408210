//! Critical sections that catch overlapping holders across processes, for the interop tests:
//! lockkit, Curator and `etcdctl` contenders run the same steps in one directory, each
//! while it believes it holds the lock:
//!
//! 1. create `marker` exclusively (it exists: another section is running, noted in `overlaps`);
//! 2. read `counter`, sleep the hold time, write it back plus one (an overlap loses an update;
//!    a counter torn by another section's write is noted in `overlaps` and read as 0);
//! 3. append `TAG TOKEN` to `history` (the order of the sections and their fencing tokens);
//! 4. remove `marker` (it is gone: another section removed it, noted in `overlaps`).
//!
//! The same steps are in `lockkit-zk/tests/interop/CuratorContender.java` and
//! `lockkit-etcd/tests/interop/section.sh`.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The directory the contenders of one test share.
#[derive(Debug, Clone)]
pub struct Sections {
    dir: PathBuf,
}

/// What the sections left behind.
#[derive(Debug)]
pub struct Outcome {
    /// The counter's final value: the number of sections when none overlapped.
    pub counter: u64,
    /// `(tag, fencing token)` of every section, in the order they ended.
    pub history: Vec<(String, u64)>,
    /// The tags of sections that found another one running.
    pub overlaps: Vec<String>,
}

impl Sections {
    /// A fresh directory `name` under `root` with the counter at 0.
    ///
    /// # Panics
    /// When the directory cannot be written.
    pub fn new(root: &Path, name: &str) -> Sections {
        let dir = root.join(name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("the sections' directory");
        fs::write(dir.join("counter"), "0\n").expect("the counter");
        Sections { dir }
    }

    /// The directory, for the contenders in other processes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One critical section of `tag`, holding the lock with fencing token `token`.
    ///
    /// # Panics
    /// When a file of the directory cannot be read or written.
    pub async fn run(&self, tag: &str, token: u64, hold: Duration) {
        let marker = self.dir.join("marker");
        if let Err(e) = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
        {
            assert_eq!(e.kind(), ErrorKind::AlreadyExists, "create the marker: {e}");
            self.append("overlaps", &format!("{tag}\n"));
        }
        let counter = self.dir.join("counter");
        let text = fs::read_to_string(&counter).expect("read the counter");
        // Torn by a write of an overlapping section.
        let seen: u64 = text.trim().parse().unwrap_or_else(|_| {
            self.append("overlaps", &format!("{tag}\n"));
            0
        });
        tokio::time::sleep(hold).await;
        fs::write(&counter, format!("{}\n", seen + 1)).expect("write the counter");
        self.append("history", &format!("{tag} {token}\n"));
        if let Err(e) = fs::remove_file(&marker) {
            assert_eq!(e.kind(), ErrorKind::NotFound, "remove the marker: {e}");
            self.append("overlaps", &format!("{tag}\n"));
        }
    }

    fn append(&self, file: &str, line: &str) {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(file))
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("append to {file}: {e}"));
    }

    /// What every contender left, once all have finished.
    ///
    /// # Panics
    /// When a file is unreadable or malformed.
    pub fn outcome(&self) -> Outcome {
        let read = |file: &str| match fs::read_to_string(self.dir.join(file)) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => String::new(),
            Err(e) => panic!("read {file}: {e}"),
        };
        let history = read("history")
            .lines()
            .map(|line| {
                let (tag, token) = line
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("history line {line:?}"));
                let token = token
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("history line {line:?} has no token"));
                (tag.to_owned(), token)
            })
            .collect();
        Outcome {
            counter: read("counter").trim().parse().expect("the counter"),
            history,
            overlaps: read("overlaps").lines().map(str::to_owned).collect(),
        }
    }
}

impl Outcome {
    /// How often the lock passed from a contender of one side to the other, where a tag's
    /// side is what comes before its first `-` (`lockkit-1` and `lockkit-2` are one side).
    pub fn handovers_between_sides(&self) -> usize {
        let side = |tag: &str| tag.split('-').next().unwrap_or(tag).to_owned();
        self.history
            .windows(2)
            .filter(|pair| side(&pair[0].0) != side(&pair[1].0))
            .count()
    }

    /// Asserts that the `sections` sections excluded each other (no marker found, no update
    /// lost), that their fencing tokens strictly increase in the order they ran, and that the
    /// lock passed between the two sides at least `handovers` times.
    ///
    /// # Panics
    /// When any of that does not hold.
    pub fn assert_exclusive(&self, sections: u64, handovers: usize) {
        assert!(
            self.overlaps.is_empty(),
            "sections overlapped: {:?} found another one running; history {:?}",
            self.overlaps,
            self.history
        );
        assert_eq!(
            self.counter, sections,
            "the counter lost updates (overlapping sections); history {:?}",
            self.history
        );
        assert_eq!(self.history.len() as u64, sections, "sections recorded");
        for pair in self.history.windows(2) {
            assert!(
                pair[0].1 < pair[1].1,
                "fencing tokens do not increase: {:?} then {:?}; history {:?}",
                pair[0],
                pair[1],
                self.history
            );
        }
        let passed = self.handovers_between_sides();
        assert!(
            passed >= handovers,
            "the lock passed between the sides {passed} times, expected at least {handovers}: {:?}",
            self.history
        );
    }
}
