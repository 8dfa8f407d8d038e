//! `weir load` as a standalone binary (what the `weir` CLI wires as a subcommand):
//! `cargo run -p weir-load --example load_cli -- --target nbd://127.0.0.1:10809/vol SCENARIO`.
//! Exit status 1 when the run did not pass (I/O errors, broken connections, verify
//! mismatches), 2 on a setup error.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "weir-load",
    about = "Drive workload models against NBD exports in real time"
)]
struct Cli {
    #[command(flatten)]
    load: weir_load::cli::LoadArgs,
}

fn main() {
    let cli = Cli::parse();
    match weir_load::cli::run_command(&cli.load) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}
