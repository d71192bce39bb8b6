//! The cost of one `io_uring_enter(2)` with the ring named by its
//! descriptor and by its slot among the thread's registered rings
//! (`IORING_REGISTER_RING_FDS`, `IORING_ENTER_REGISTERED_RING`): what the
//! io_uring driver's `HOTLOOP_URING_REGISTERED_RING` switch changes.
//!
//! The ring is set up as the driver sets up its own (`SINGLE_ISSUER |
//! DEFER_TASKRUN`). Two kinds of enter are timed: an empty one
//! (`GETEVENTS`, nothing to submit, as a turn that only reaps), and one
//! that submits a `NOP` and reaps its completion (as a turn that hands
//! over entries). Each round times both ways alternately, in the thread's
//! own CPU time (`CLOCK_THREAD_CPUTIME_ID`, so time spent descheduled on a
//! shared machine is left out); the report gives the median of the rounds
//! in nanoseconds per enter, and the saving.
//!
//! Run with `cargo bench -p hotloop --bench ring_enter`; `ROUNDS` sets the
//! number of rounds (default 9).

use std::os::fd::AsRawFd;

use io_uring::{opcode, IoUring};

/// Enters per timed run.
const ENTERS: u32 = 200_000;
/// `IORING_REGISTER_RING_FDS`.
const IORING_REGISTER_RING_FDS: libc::c_uint = 20;
/// `IORING_ENTER_GETEVENTS`.
const IORING_ENTER_GETEVENTS: u32 = 1;
/// `IORING_ENTER_REGISTERED_RING`.
const IORING_ENTER_REGISTERED_RING: u32 = 1 << 4;

/// `struct io_uring_rsrc_update`.
#[repr(C)]
struct RsrcUpdate {
    offset: u32,
    resv: u32,
    data: u64,
}

/// Nanoseconds of this thread's CPU time.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One `io_uring_enter` on `fd` with `flags`.
fn enter(fd: i32, to_submit: u32, min_complete: u32, flags: u32) {
    // SAFETY: no argument pointer is passed.
    let rc = unsafe {
        libc::syscall(libc::SYS_io_uring_enter, fd, to_submit, min_complete, flags, 0usize, 0usize)
    };
    assert!(rc >= 0, "io_uring_enter: {}", std::io::Error::last_os_error());
}

/// Nanoseconds per enter over [`ENTERS`] enters naming the ring as
/// `(fd, flag)` says, each submitting a `NOP` and reaping it if `nop`.
fn time_enters(ring: &mut IoUring, fd: i32, flag: u32, nop: bool) -> f64 {
    let start = thread_cpu_ns();
    for _ in 0..ENTERS {
        if nop {
            // SAFETY: a NOP points at no memory.
            unsafe { ring.submission().push(&opcode::Nop::new().build()) }.unwrap();
            enter(fd, 1, 1, IORING_ENTER_GETEVENTS | flag);
            assert_eq!(ring.completion().count(), 1);
        } else {
            enter(fd, 0, 0, IORING_ENTER_GETEVENTS | flag);
        }
    }
    (thread_cpu_ns() - start) as f64 / f64::from(ENTERS)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(9);
    let mut ring = match IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(64)
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipped: io_uring with DEFER_TASKRUN cannot be set up here ({e})");
            return;
        }
    };
    let mut update = RsrcUpdate { offset: u32::MAX, resv: 0, data: ring.as_raw_fd() as u64 };
    // SAFETY: `update` is one `io_uring_rsrc_update`, valid for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring.as_raw_fd(),
            IORING_REGISTER_RING_FDS,
            &mut update as *mut RsrcUpdate,
            1u32,
        )
    };
    if rc != 1 {
        eprintln!(
            "skipped: IORING_REGISTER_RING_FDS refused ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    let ways = [
        ("descriptor", ring.as_raw_fd(), 0),
        ("registered", update.offset as i32, IORING_ENTER_REGISTERED_RING),
    ];
    println!("{rounds} rounds of {ENTERS} enters each; thread CPU ns per enter, median of rounds");
    for (what, nop) in [("empty enter (GETEVENTS)", false), ("submit a NOP and reap it", true)] {
        let mut samples = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            // Alternate which goes first.
            for i in [round % 2, 1 - round % 2] {
                let (_, fd, flag) = ways[i];
                samples[i].push(time_enters(&mut ring, fd, flag, nop));
            }
        }
        let by_fd = median(&mut samples[0]);
        let registered = median(&mut samples[1]);
        println!(
            "{what:26} descriptor {by_fd:7.1} ns  registered {registered:7.1} ns  saving {:5.1} ns ({:.1}%)",
            by_fd - registered,
            (by_fd - registered) / by_fd * 100.0
        );
    }
}
