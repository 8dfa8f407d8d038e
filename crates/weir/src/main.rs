//! The `weir` binary: everything is in the library (see its docs for why).

fn main() -> std::process::ExitCode {
    weir::main()
}
