//! Says whether the io_uring driver can run here, and why not if it cannot.
//! Exits 0 if it can, 1 if it cannot (`.ci/run` uses it to require the
//! io_uring half of the test suite wherever the kernel allows it).

fn main() {
    match hotloop::runtime::uring_available() {
        Ok(()) => println!("io_uring: available"),
        Err(why) => {
            println!("io_uring: unavailable: {why}");
            std::process::exit(1);
        }
    }
}
