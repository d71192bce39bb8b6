//! The `hotloop` command: servers, a load generator and the benchmark suite.

mod proxy;
mod runtime_args;
mod serve;
mod stats_server;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
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
    /// Run one of the servers hotloop is measured against, until SIGINT or
    /// SIGTERM.
    Peer {
        /// Which server.
        #[arg(value_enum)]
        kind: PeerKind,
        /// What it answers.
        #[arg(value_enum)]
        app: peers::floor::App,
        /// Address to listen on; port 0 picks a free port, printed at start.
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "HOST:PORT")]
        addr: SocketAddr,
        /// Worker threads.
        #[arg(long, default_value_t = 1, value_name = "N")]
        workers: usize,
        /// HTTP response body size in bytes.
        #[arg(long, default_value_t = 13, value_name = "BYTES")]
        body_size: usize,
        /// Microseconds of CPU work per HTTP request.
        #[arg(long, default_value_t = 0, value_name = "US")]
        work_us: u64,
    },
}

/// The peer servers.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum PeerKind {
    /// Raw epoll and libc calls, no runtime: the floor.
    Floor,
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => serve::run(&args),
        Command::Proxy(args) => proxy::run(&args),
        Command::Load(args) => load::run_and_print(&args),
        Command::Peer { kind, app, addr, workers, body_size, work_us } => match kind {
            PeerKind::Floor => {
                peers::floor::run(&peers::floor::FloorArgs { app, addr, workers, body_size, work_us })
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotloop: {e}");
            ExitCode::FAILURE
        }
    }
}
