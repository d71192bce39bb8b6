//! The `hotloop` command: the runtime as a production server (`serve`), a
//! TCP forwarder (`proxy`), each with a live stats endpoint.
//!
//! It links hotloop and no other runtime; the measuring tools (load
//! generator, peers, benchmark suite) live in `hotloop-bench`.

mod drain;
mod proxy;
mod runtime_args;
mod serve;
mod stats_server;
mod stop;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A thread-per-core runtime's servers.
#[derive(Parser, Debug)]
#[command(name = "hotloop", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an echo, HTTP or hyper server on the runtime.
    Serve(serve::ServeArgs),
    /// Forward TCP connections to backends, round-robin.
    Proxy(proxy::ProxyArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => serve::run(&args),
        Command::Proxy(args) => proxy::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotloop: {e}");
            ExitCode::FAILURE
        }
    }
}
