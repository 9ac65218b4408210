//! `lockkit completions SHELL` and `lockkit man [SUBCOMMAND]`, generated from the clap
//! definition, so they never disagree with `--help`.

use clap::CommandFactory;

use crate::{Cli, Failure, exit};

/// Prints the completion script for `shell`.
pub(crate) fn completions(shell: clap_complete::Shell) -> u8 {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "lockkit", &mut std::io::stdout());
    0
}

/// Prints `lockkit.1`, or `lockkit-SUBCOMMAND.1`.
pub(crate) fn man(subcommand: Option<&str>) -> Result<u8, Failure> {
    let command = Cli::command();
    let page = match subcommand {
        None => clap_mangen::Man::new(command),
        Some(name) => {
            let Some(sub) = command.find_subcommand(name) else {
                return Err(Failure {
                    code: exit::USAGE,
                    message: format!("lockkit has no subcommand {name:?}"),
                });
            };
            let sub = sub
                .clone()
                .display_name(format!("lockkit-{name}"))
                .bin_name(format!("lockkit {name}"))
                .version(env!("CARGO_PKG_VERSION"));
            clap_mangen::Man::new(sub).title(format!("lockkit-{name}"))
        }
    };
    page.render(&mut std::io::stdout()).map_err(|e| Failure {
        code: exit::SOFTWARE,
        message: format!("cannot write the man page: {e}"),
    })?;
    Ok(0)
}
