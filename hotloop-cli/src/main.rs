//! The `hotloop` command: servers, a load generator and the benchmark suite.

mod bench;
mod proxy;
mod runtime_args;
mod serve;
mod stats_server;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hotloop_cli::{load, peers, proto};

/// A thread-per-core runtime's servers, load generator and benchmarks.
#[derive(Parser, Debug)]
#[command(name = "hotloop", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an echo or HTTP server on the runtime.
    Serve(serve::ServeArgs),
    /// Forward TCP connections to backends, round-robin.
    Proxy(proxy::ProxyArgs),
    /// Generate load against a loopback server and report throughput and
    /// latency.
    Load(load::LoadArgs),
    /// Run a peer server written on another runtime (tokio, monoio) or on
    /// raw system calls (floor), until SIGINT or SIGTERM.
    Peer(peers::PeerArgs),
    /// Run hotloop and its peers through the benchmark scenarios.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => serve::run(&args),
        Command::Proxy(args) => proxy::run(&args),
        Command::Load(args) => load::run_and_print(&args),
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
