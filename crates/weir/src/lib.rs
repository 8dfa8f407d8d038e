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

mod admin;
mod history;
mod load;
mod replicate;
mod serve;
mod sim;
mod top;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
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
    /// Manage QoS policies on a running server
    Policy {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(subcommand)]
        command: admin::PolicyCommand,
    },
}

/// Logs to stderr; `RUST_LOG` takes `level` or `target=level,…` (e.g.
/// `RUST_LOG=weir_server=debug`); unset or unreadable: warnings only.
fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::WARN));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(filter)
        .init();
}

/// Parses the command line, runs the command, returns the process exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
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
        Command::Volume { target, command } => admin::volume(target, command),
        Command::Policy { target, command } => admin::policy(target, command),
        Command::Top { target, args } => top::run(target, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
