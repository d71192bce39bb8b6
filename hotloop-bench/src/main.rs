//! `hotloop-bench`: the benchmark suite, the load generator and the peer
//! servers hotloop is compared with.

mod bench;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hotloop_bench::{h2_load, load, peers};

/// hotloop's measuring tools: the benchmark suite, a load generator and peer servers.
#[derive(Parser, Debug)]
#[command(name = "hotloop-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run hotloop and its peers through the benchmark scenarios.
    Bench(bench::BenchArgs),
    /// Generate load against a loopback server and report throughput and
    /// latency.
    Load(load::LoadArgs),
    /// HTTP/2 load that opens a new connection after a server's GOAWAY
    /// (for measuring servers while they drain).
    H2Load(h2_load::H2LoadArgs),
    /// Run a peer server written on another runtime (tokio, monoio), on raw
    /// system calls (floor) or on raw io_uring (floor-uring), until SIGINT
    /// or SIGTERM.
    Peer(peers::PeerArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Load(args) => load::run_and_print(&args),
        Command::H2Load(args) => h2_load::run_and_print(&args),
        Command::Peer(args) => peers::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotloop-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
