//! The `hotloop` command: servers, a load generator and the benchmark suite.

mod proxy;
mod runtime_args;
mod serve;
mod stats_server;

use clap::{Parser, Subcommand};
use hotloop_cli::proto;

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
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Proxy(args) => proxy::run(args),
    };
    if let Err(e) = result {
        eprintln!("hotloop: {e}");
        std::process::exit(1);
    }
}
