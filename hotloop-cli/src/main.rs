//! The `hotloop` command: servers, a load generator and the benchmark suite.

mod bench;
mod peers;
mod proto;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Servers, a load generator and the benchmark suite for the hotloop runtime.
#[derive(Debug, Parser)]
#[command(name = "hotloop", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a peer server written on another runtime (tokio, monoio, floor).
    Peer(peers::PeerArgs),
    /// Runs hotloop and its peers through the benchmark scenarios.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Peer(args) => peers::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotloop: {e}");
            ExitCode::FAILURE
        }
    }
}
