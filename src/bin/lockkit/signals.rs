//! How `lockkit run` (and `elect`) keeps its promise that the command never runs without the
//! lock (the leadership): the signals it handles from start-up, how it passes them on, and
//! the trampoline that ties the command's life to lockkit's.
//!
//! # The command dies with lockkit
//! The command is not started directly: lockkit starts itself again as a trampoline
//! (`lockkit __lockkit-exec-child PARENT -- CMD...`), which asks the kernel for `SIGKILL`
//! when its parent dies (`PR_SET_PDEATHSIG`), checks that its parent is still the lockkit
//! that forked it (it may have died in between, before the request counted), restores the
//! signal mask and `exec`s the command in its own place. The request survives `exec`, so the
//! command is killed however lockkit dies: `SIGKILL`, the OOM killer, a panic, a signal
//! lockkit does not handle. (Through a trampoline because setting it between `fork` and `exec`
//! takes `unsafe` code, which this crate forbids.) Two limits, both the kernel's: the signal
//! goes to the command, not to processes the command started itself (a shell script should
//! `exec` its last program, or trap and pass on signals), and it is not kept across the `exec`
//! of a set-user-ID program. The parent that counts is the thread that forked: lockkit forks
//! from its main thread, which lives as long as the process.
//!
//! # Signals
//! `SIGINT`, `SIGTERM`, `SIGHUP` and `SIGQUIT` are blocked from start-up and read through a
//! `signalfd`, so none of them can kill lockkit by default between its start and the end of
//! the command. While lockkit connects or waits for the lock, one of them abandons the wait
//! (whatever the backend queued is removed before lockkit exits) and lockkit exits with
//! 128 + the signal's number. While the command runs, each is passed on to the command once:
//! - a signal the kernel generated (the terminal's ^C, ^\ or hang-up) went to the terminal's
//!   whole foreground process group, the command included (it shares lockkit's group): it
//!   is not sent again, so a program that takes a second ^C as "quit now" still shuts down
//!   gracefully;
//! - a signal a process sent (`kill`, a supervisor, systemd) reached lockkit alone: lockkit
//!   sends it to the command.
//!
//! A signal sent by a process to the whole group (`kill -INT -PGID`) therefore reaches the
//! command twice; the command is not put in its own group to avoid that, because it would
//! then lose the terminal (^C, reading from it) that an interactive command needs.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{Pid, getppid};
use tokio::sync::mpsc;

/// The first argument that makes lockkit the trampoline of a command.
pub(crate) const TRAMPOLINE: &str = "__lockkit-exec-child";

/// The signals `run` and `elect` handle.
const HANDLED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// `si_code` of a signal the kernel generated (the terminal driver's, for one).
const SI_KERNEL: i32 = 0x80;

fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for signal in HANDLED {
        set.add(signal);
    }
    set
}

/// Blocks the handled signals in the calling thread, and so in every thread started after
/// it: call it before the runtime starts its threads.
pub(crate) fn block() -> nix::Result<()> {
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None)
}

/// One signal received.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Which signal.
    pub(crate) signal: Signal,
    /// Whether the kernel generated it (it then reached the whole foreground process group).
    pub(crate) from_kernel: bool,
}

/// The handled signals, as they arrive: a thread reads them from a `signalfd` (blocking
/// reads, so no unsafe registration with the reactor) and hands them over.
pub(crate) struct Signals {
    received: mpsc::UnboundedReceiver<io::Result<Received>>,
}

impl Signals {
    /// Starts reading the signals [`block`] blocked; those that arrived since are pending and
    /// come first.
    pub(crate) fn new() -> io::Result<Self> {
        let fd =
            SignalFd::with_flags(&handled(), SfdFlags::SFD_CLOEXEC).map_err(io::Error::from)?;
        let (send, received) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("lockkit-signals".into())
            .spawn(move || {
                loop {
                    let next = match fd.read_signal() {
                        Ok(Some(info)) => match Signal::try_from(info.ssi_signo as i32) {
                            Ok(signal) => Ok(Received {
                                signal,
                                from_kernel: info.ssi_code == SI_KERNEL,
                            }),
                            Err(_) => continue,
                        },
                        Ok(None) | Err(nix::errno::Errno::EINTR) => continue,
                        Err(e) => Err(io::Error::from(e)),
                    };
                    let failed = next.is_err();
                    if send.send(next).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Signals { received })
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> io::Result<Received> {
        match self.received.recv().await {
            Some(next) => next,
            None => std::future::pending().await,
        }
    }
}

/// The arguments that start `program` through the trampoline, as a child of this process.
pub(crate) fn trampoline_args(program: &str, rest: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        TRAMPOLINE.into(),
        std::process::id().to_string().into(),
        program.into(),
    ];
    args.extend(rest.iter().map(OsString::from));
    args
}

/// The trampoline: `args` are what follows [`TRAMPOLINE`] (the parent's pid, the program and
/// its arguments). Returns only when the command cannot be started.
pub(crate) fn exec_child(mut args: impl Iterator<Item = OsString>) -> ExitCode {
    let parent = args
        .next()
        .and_then(|pid| pid.to_str()?.parse::<i32>().ok())
        .map(Pid::from_raw);
    let (Some(parent), Some(program)) = (parent, args.next()) else {
        eprintln!("lockkit: {TRAMPOLINE} is lockkit's own: use `lockkit run`");
        return ExitCode::from(crate::exit::USAGE);
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("lockkit: cannot tie the command to lockkit's life: {e}");
        return ExitCode::from(crate::exit::SOFTWARE);
    }
    if getppid() != parent {
        // lockkit died before the request above counted: nobody holds the lock for us.
        return ExitCode::from(crate::exit::LOST);
    }
    if let Err(e) = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None) {
        eprintln!("lockkit: cannot restore the signal mask: {e}");
        return ExitCode::from(crate::exit::SOFTWARE);
    }
    let e = std::process::Command::new(&program).args(args).exec();
    eprintln!("lockkit: cannot run {}: {e}", program.to_string_lossy());
    ExitCode::from(match e.kind() {
        io::ErrorKind::NotFound => crate::exit::NOT_FOUND,
        _ => crate::exit::NOT_EXECUTABLE,
    })
}
