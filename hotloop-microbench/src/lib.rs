//! hotloop's criterion micro-benchmarks; they are in `benches/`:
//! `cargo bench -p hotloop-microbench --bench wheel`.
