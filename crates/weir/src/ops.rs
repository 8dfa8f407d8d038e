//! `weir completions SHELL` and `weir man`: generated from the CLI definition.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub struct ManArgs {
    /// Write weir.1 and weir-SUBCOMMAND….1 into this directory (created if
    /// missing); without it, print weir.1 to standard output
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the completion script of `args.shell` (e.g. `weir completions bash >
/// /etc/bash_completion.d/weir`).
pub fn completions(args: CompletionsArgs) -> Result<()> {
    let mut cmd = crate::command();
    clap_complete::generate(args.shell, &mut cmd, "weir", &mut std::io::stdout());
    Ok(())
}

pub fn man(args: ManArgs) -> Result<()> {
    let cmd = crate::command();
    match args.dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .context("writing the man page"),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let written = write_pages(cmd, "weir", &dir)?;
            outln!("wrote {written} man pages to {}", dir.display());
            Ok(())
        }
    }
}

/// Writes `NAME.1` for `cmd` and its subcommands (`NAME-SUB.1`, …); returns how many.
fn write_pages(cmd: clap::Command, name: &str, dir: &Path) -> Result<usize> {
    let cmd = cmd.name(name.to_string()).bin_name(name.replace('-', " "));
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    let mut written = 1;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let sub_name = format!("{name}-{}", sub.get_name());
        written += write_pages(sub.clone(), &sub_name, dir)?;
    }
    Ok(written)
}
