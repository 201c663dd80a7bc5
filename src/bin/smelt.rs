//! The `smelt` command: run, check and draw `.smelt` graphs (see docs/cli.md).

fn main() -> std::process::ExitCode {
    smelt::cli::main()
}
