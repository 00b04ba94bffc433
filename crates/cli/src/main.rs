//! The `stepguard` binary: everything lives in the library's [`stepguard_cli::main`].

fn main() -> std::process::ExitCode {
    stepguard_cli::main()
}
