//! `weir` — the command line. Argument handling only; the work lives in the crates.
//!
//! A library with a one-line binary (`src/main.rs`) for build time: cargo starts a
//! library as soon as its dependencies' metadata exists, but a binary only once they
//! are fully compiled. This crate is compiled at opt-level 0 (root Cargo.toml): it
//! only parses arguments and prints; the work it starts is compiled in the library
//! crates — the server through `weir_server::start_boxed` (a `dyn Future`, so the
//! NBD session code is not re-instantiated here), the simulator and `weir load`
//! through plain functions. Scenario and config TOML parsing are `#[inline]` in
//! their crates so that they *are* compiled here, cheaply.

/// `println!`, `print!` and `eprintln!` for what the commands print. A reader that
/// closed the pipe (`weir load … | head`, `2>&1 | head`) is no error: the rest of
/// the output is dropped, as by any Unix filter, and the command still ends with its
/// own exit status (`println!` panicked there, exit 101). Any other write error
/// (a full disk behind `> file`) ends the process with a message and status 1.
/// `weir sim` needs none of this: it takes SIGPIPE's default instead.
macro_rules! outln {
    ($($t:tt)*) => { $crate::emit(&mut std::io::stdout().lock(), format_args!($($t)*), true) };
}
macro_rules! out {
    ($($t:tt)*) => { $crate::emit(&mut std::io::stdout().lock(), format_args!($($t)*), false) };
}
macro_rules! errln {
    ($($t:tt)*) => { $crate::emit(&mut std::io::stderr().lock(), format_args!($($t)*), true) };
}

fn emit(out: &mut dyn std::io::Write, text: std::fmt::Arguments, newline: bool) {
    let written = out
        .write_fmt(text)
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            let message = format!("weir: cannot write the output: {e}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), message.as_bytes());
            std::process::exit(1);
        }
        _ => {}
    }
}

mod admin;
mod groups;
mod history;
mod load;
mod ops;
mod pools;
mod replicate;
mod serve;
mod sim;
mod target;
mod top;

use clap::{Parser, Subcommand};

/// `--version`: the crate version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WEIR_COMMIT"),
    ")"
);
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "weir",
    version = VERSION,
    about = "Weir: storage QoS for virtualized data centers — serve volumes over NBD, simulate a storage stack, drive workloads",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario on the deterministic simulator (virtual clock, same QoS engine as the server)
    Sim(sim::SimArgs),
    /// Drive workload models (VDI, OLTP, Exchange, Iometer specs) against real NBD exports in real time
    Load(load::LoadArgs),
    /// Serve volumes over NBD with QoS in the I/O path (embedded default without --config)
    Serve(serve::ServeArgs),
    /// Manage volumes on a running server
    Volume {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(flatten)]
        confirm: admin::Confirm,
        #[command(subcommand)]
        command: admin::VolumeCommand,
    },
    /// Live view of every volume (or host, or policy) on a running server, like esxtop
    Top {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(flatten)]
        args: top::TopArgs,
    },
    /// Manage QoS policies on a running server (`update` changes one live)
    Policy {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(flatten)]
        confirm: admin::Confirm,
        #[command(subcommand)]
        command: admin::PolicyCommand,
    },
    /// Manage access groups (which hosts and TLS identities reach a volume)
    AccessGroup {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(flatten)]
        confirm: admin::Confirm,
        #[command(subcommand)]
        command: groups::AccessGroupCommand,
    },
    /// Pools of a running server: capacity, free, allocated, provisioned, overcommit
    Pool {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(subcommand)]
        command: pools::PoolCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(ops::CompletionsArgs),
    /// Write man pages (weir.1 and one per subcommand) generated from this CLI
    Man(ops::ManArgs),
}

/// The command-line definition (completions, man pages, tests).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Logs to stderr; `RUST_LOG` takes `level` or `target=level,…` (e.g.
/// `RUST_LOG=weir_server=debug`); unset or unreadable: warnings only, plus the
/// audit log (`weir_audit` at info: admin changes, configuration diffs) and
/// gateway upstreams going and coming back (`weir_upstream` at info).
fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let configured = std::env::var("RUST_LOG").ok();
    let mut filter = configured
        .as_deref()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::WARN));
    // Admin changes and configuration diffs are logged unless RUST_LOG says
    // otherwise of them.
    // So are an upstream becoming unreachable and reachable again.
    for target in [
        weir_server::admin::AUDIT_TARGET,
        weir_server::upstream::LOG_TARGET,
    ] {
        if !configured.as_deref().is_some_and(|c| c.contains(target)) {
            filter = filter.with_target(target, LevelFilter::INFO);
        }
    }
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(filter)
        .init();
}

/// `weir sim … | head`: the reader closing the pipe ends the process, as it does
/// any Unix filter, instead of a "Broken pipe" panic at the next print. Only for
/// commands that write to nothing but files and standard output: a closed
/// socket must stay an error (EPIPE) for the server and the NBD and admin clients.
fn stop_quietly_on_a_closed_pipe() {
    // SAFETY: restores the default disposition of one signal before any thread
    // starts; no handler, no memory involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Parses the command line, runs the command, returns the process exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    weir_server::metrics::set_build_commit(env!("WEIR_COMMIT"));
    if matches!(
        cli.command,
        Command::Sim(_) | Command::Completions(_) | Command::Man(_)
    ) {
        stop_quietly_on_a_closed_pipe();
    }
    let result = match cli.command {
        Command::Sim(args) => sim::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Load(args) => match load::run_command(&args) {
            // The run finished but did not pass (I/O errors, lost connections, verify
            // mismatches): the report is printed, the exit status says so.
            Ok(false) => return ExitCode::from(1),
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        },
        Command::Volume {
            target,
            confirm,
            command,
        } => admin::volume(target.confirmed(confirm), command),
        Command::Policy {
            target,
            confirm,
            command,
        } => admin::policy(target.confirmed(confirm), command),
        Command::AccessGroup {
            target,
            confirm,
            command,
        } => groups::run(target.confirmed(confirm), command),
        Command::Pool { target, command } => pools::run(target, command),
        Command::Completions(args) => ops::completions(args),
        Command::Man(args) => ops::man(args),
        Command::Top { target, args } => top::run(target, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every command, argument and option says what it is for in `--help` (and
    /// so in the man pages and completions).
    #[test]
    fn every_option_and_command_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_hide_set() {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (command)", sub.get_name()));
                }
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::command(), "", &mut missing);
        assert!(missing.is_empty(), "no help for: {missing:#?}");
    }

    /// `--yes` answers a confirmation, so only the commands with destructive
    /// subcommands take it (`weir top --help` listed it once).
    #[test]
    fn only_commands_that_delete_take_yes() {
        let root = super::command();
        let takes_yes = |name: &str| {
            let cmd = root.find_subcommand(name).expect(name);
            cmd.get_arguments().any(|a| a.get_long() == Some("yes"))
        };
        for name in ["volume", "policy", "access-group"] {
            assert!(takes_yes(name), "{name} lacks --yes");
        }
        for name in ["top", "pool", "sim", "load", "serve"] {
            assert!(!takes_yes(name), "{name} lists --yes");
        }
    }

    #[test]
    fn version_names_the_commit() {
        let v = super::command().render_version();
        assert!(v.contains("(commit "), "{v}");
        assert!(!env!("WEIR_COMMIT").is_empty());
    }
}
