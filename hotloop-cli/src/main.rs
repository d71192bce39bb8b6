//! The `hotloop` command: servers, a load generator and the benchmark suite.

mod proto;

fn main() {}
