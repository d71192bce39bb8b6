//! What receive bundles (`IORING_RECVSEND_BUNDLE`, Linux 6.10) and
//! incremental buffer consumption (`IOU_PBUF_RING_INC`, Linux 6.12) save a
//! multishot receive against the one the io_uring driver uses today: a
//! multishot `RECV` that takes one 4 KiB buffer from a provided-buffer ring
//! per completion.
//!
//! One receiving thread owns a ring (`SINGLE_ISSUER | DEFER_TASKRUN`, as the
//! driver sets it up) and one multishot receive on a loopback TCP socket;
//! a sending thread writes `MIB` MiB into it in 64 KiB writes and closes.
//! The receiver copies every byte out of its ring buffer (the driver copies
//! a stream's bytes into the stream's queue) and gives the buffer back in
//! the same turn. Modes, each with 1 MiB of buffers:
//!
//! - `multishot`: 256 buffers of 4 KiB, one per completion (the driver's).
//! - `bundle`: the same buffers; one completion may fill many in a row.
//! - `multishot, large buffers`: 16 buffers of 64 KiB, one per completion
//!   (what bigger buffers alone do; a server cannot use them so without
//!   incremental consumption: every small request would take a whole one).
//! - `incremental`: 16 buffers of 64 KiB, registered with
//!   `IOU_PBUF_RING_INC`: a completion uses only the bytes it received and
//!   the next one goes on in the same buffer (`IORING_CQE_F_BUF_MORE`).
//! - `bundle+incremental`: both.
//!
//! Each round runs every mode once, in turn; the report gives per mode the
//! median over the rounds of the receiving thread's CPU time per MiB
//! (`CLOCK_THREAD_CPUTIME_ID`: the kernel's receive work runs in that
//! thread's `io_uring_enter` under `DEFER_TASKRUN`; time spent descheduled
//! is left out), completions per MiB, and the wall time per MiB. A mode the
//! kernel refuses is reported as such.
//!
//! Run with `cargo bench -p hotloop-bench --bench recv_bundle`; `ROUNDS`
//! (default 5) and `MIB` (default 256) change the run.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Instant;

use io_uring::types::{BufRingEntry, Fd};
use io_uring::{cqueue, opcode, IoUring};

/// The buffer group the ring is registered under.
const GROUP: u16 = 7;
/// Bytes per write of the sender.
const WRITE_BYTES: usize = 64 << 10;
/// `IOU_PBUF_RING_INC`: buffers consumed a completion at a time.
const PBUF_RING_INC: u16 = 2;
/// The receive's `user_data`.
const RECV: u64 = 1;

/// One way to receive, with its buffer ring's shape.
#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    buffers: u16,
    buffer_bytes: usize,
    bundle: bool,
    incremental: bool,
}

const MODES: [Mode; 5] = [
    Mode { name: "multishot", buffers: 256, buffer_bytes: 4096, bundle: false, incremental: false },
    Mode { name: "bundle", buffers: 256, buffer_bytes: 4096, bundle: true, incremental: false },
    Mode {
        name: "multishot, large buffers",
        buffers: 16,
        buffer_bytes: 64 << 10,
        bundle: false,
        incremental: false,
    },
    Mode {
        name: "incremental",
        buffers: 16,
        buffer_bytes: 64 << 10,
        bundle: false,
        incremental: true,
    },
    Mode {
        name: "bundle+incremental",
        buffers: 16,
        buffer_bytes: 64 << 10,
        bundle: true,
        incremental: true,
    },
];

/// Nanoseconds of this thread's CPU time.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A ring of provided buffers: page-aligned entries shared with the kernel
/// and one block of buffers, each named by its index.
struct BufRing {
    entries: NonNull<BufRingEntry>,
    layout: Layout,
    buffers: Box<[u8]>,
    buffer_bytes: usize,
    count: u16,
    tail: u16,
    /// Buffer ids in the order the kernel will take them (head first): a
    /// bundle fills buffers in ring order from the one its completion names.
    order: VecDeque<u16>,
    /// Bytes already used at the front of each buffer (incremental mode).
    used: Vec<usize>,
}

impl BufRing {
    fn new(ring: &IoUring, mode: Mode) -> io::Result<BufRing> {
        let layout =
            Layout::from_size_align(usize::from(mode.buffers) * size_of::<BufRingEntry>(), 4096)
                .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let entries = NonNull::new(ptr.cast::<BufRingEntry>()).ok_or(io::ErrorKind::OutOfMemory)?;
        let mut buf_ring = BufRing {
            entries,
            layout,
            buffers: vec![0u8; usize::from(mode.buffers) * mode.buffer_bytes].into_boxed_slice(),
            buffer_bytes: mode.buffer_bytes,
            count: mode.buffers,
            tail: 0,
            order: VecDeque::with_capacity(usize::from(mode.buffers)),
            used: vec![0; usize::from(mode.buffers)],
        };
        let flags = if mode.incremental { PBUF_RING_INC } else { 0 };
        // SAFETY: `entries` points at `count` zeroed, page-aligned entries
        // that live, with the buffers, as long as this value, which is
        // dropped only after the receive has ended (its last completion
        // came without `MORE`) and the ring was unregistered.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                entries.as_ptr() as u64,
                mode.buffers,
                GROUP,
                flags,
            )?;
        }
        for bid in 0..mode.buffers {
            buf_ring.give_back(bid);
        }
        buf_ring.publish();
        Ok(buf_ring)
    }

    /// Queues buffer `bid` whole for the kernel (seen after `publish`).
    fn give_back(&mut self, bid: u16) {
        let index = usize::from(self.tail & (self.count - 1));
        let addr = self.buffers.as_ptr() as u64 + (usize::from(bid) * self.buffer_bytes) as u64;
        // SAFETY: `index < count`, so the entry is inside the allocation; the
        // kernel reads no entry between the published tail and this one.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(addr);
        entry.set_len(self.buffer_bytes as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        self.used[usize::from(bid)] = 0;
        self.order.push_back(bid);
    }

    fn publish(&self) {
        // SAFETY: the first entry's `resv` field is the shared tail; only this
        // function writes it.
        let tail = unsafe { BufRingEntry::tail(self.entries.as_ptr()) } as *const AtomicU16;
        // SAFETY: a naturally aligned u16 inside the allocation; the kernel
        // reads it with acquire ordering, which this release store pairs with.
        unsafe { (*tail).store(self.tail, Ordering::Release) };
    }

    /// Copies the `len` bytes of one completion that starts in buffer `bid`
    /// into `out`, and gives back every buffer it finished.
    fn take(&mut self, bid: u16, mut len: usize, more_in_buffer: bool, out: &mut Vec<u8>) {
        assert_eq!(self.order.front(), Some(&bid), "completions take buffers in ring order");
        while len > 0 {
            let bid = *self.order.front().expect("a buffer for every received byte");
            let start = usize::from(bid) * self.buffer_bytes + self.used[usize::from(bid)];
            let room = self.buffer_bytes - self.used[usize::from(bid)];
            let n = len.min(room);
            out.extend_from_slice(&self.buffers[start..start + n]);
            len -= n;
            if len == 0 && more_in_buffer {
                self.used[usize::from(bid)] += n;
            } else {
                self.order.pop_front();
                self.give_back(bid);
            }
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; unregistered before.
        unsafe { std::alloc::dealloc(self.entries.as_ptr().cast(), self.layout) };
    }
}

/// One receive of `bytes` from a sender thread: (receiver CPU ns,
/// completions, wall ns), or the kernel's refusal.
fn run_once(mode: Mode, bytes: usize) -> io::Result<(u64, u64, u64)> {
    let mut ring: IoUring =
        IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(256)?;
    if mode.bundle && !ring.params().is_feature_recvsend_bundle() {
        return Err(io::Error::other("no IORING_FEAT_RECVSEND_BUNDLE (Linux 6.10)"));
    }
    let mut bufs = BufRing::new(&ring, mode)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let sender = std::thread::spawn(move || -> io::Result<()> {
        let mut conn = TcpStream::connect(addr)?;
        let chunk = vec![0x5au8; WRITE_BYTES];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(WRITE_BYTES);
            conn.write_all(&chunk[..n])?;
            left -= n;
        }
        Ok(())
    });
    let (conn, _) = listener.accept()?;
    let arm = |ring: &mut IoUring| {
        let fd = Fd(conn.as_raw_fd());
        let entry = if mode.bundle {
            opcode::RecvMultiBundle::new(fd, GROUP).build()
        } else {
            opcode::RecvMulti::new(fd, GROUP).build()
        };
        // SAFETY: the socket and the buffer ring outlive the receive: the
        // loop below runs until its last completion (one without `MORE`).
        unsafe { ring.submission().push(&entry.user_data(RECV)) }.expect("an empty queue");
    };
    let wall = Instant::now();
    let cpu = thread_cpu_ns();
    arm(&mut ring);
    let (mut received, mut completions, mut ended) = (0usize, 0u64, false);
    let mut out = Vec::with_capacity(2 << 20);
    let mut armed = true;
    while armed {
        ring.submit_and_wait(1)?;
        let mut rearm = false;
        for cqe in ring.completion() {
            completions += 1;
            let flags = cqe.flags();
            let more = cqueue::more(flags);
            match cqe.result() {
                n if n > 0 => {
                    let bid = cqueue::buffer_select(flags).expect("a buffer");
                    bufs.take(bid, n as usize, cqueue::buffer_more(flags), &mut out);
                    received += n as usize;
                    if out.len() > 1 << 20 {
                        out.clear();
                    }
                }
                0 => ended = true,
                e if -e == libc::ENOBUFS => {}
                e => return Err(io::Error::from_raw_os_error(-e)),
            }
            if !more {
                armed = false;
                rearm = !ended;
            }
        }
        bufs.publish();
        if rearm {
            arm(&mut ring);
            armed = true;
        }
    }
    let cpu = thread_cpu_ns() - cpu;
    let wall = wall.elapsed().as_nanos() as u64;
    sender.join().expect("the sender")?;
    assert_eq!(received, bytes, "every byte sent was received");
    ring.submitter().unregister_buf_ring(GROUP)?;
    drop(bufs);
    Ok((cpu, completions, wall))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let env = |name: &str, default: usize| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    let rounds = env("ROUNDS", 5);
    let mib = env("MIB", 256);
    let bytes = mib << 20;
    let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); MODES.len()];
    let mut refused: Vec<Option<String>> = vec![None; MODES.len()];
    for round in 0..rounds {
        for (i, mode) in MODES.iter().enumerate() {
            if refused[i].is_some() {
                continue;
            }
            match run_once(*mode, bytes) {
                Ok((cpu, completions, wall)) => {
                    let per_mib = |v: u64| v as f64 / mib as f64;
                    results[i].push((per_mib(cpu), per_mib(completions), per_mib(wall)));
                }
                Err(e) => refused[i] = Some(e.to_string()),
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!(
        "receiving {mib} MiB over loopback in 64 KiB writes, medians of {rounds} rounds \
         (ratios against `multishot`)"
    );
    println!(
        "| mode | buffers | receiver CPU µs per MiB | completions per MiB | wall µs per MiB |"
    );
    println!("|---|---|---|---|---|");
    let base = results[0].iter().map(|r| r.0).collect::<Vec<_>>();
    let base = if base.is_empty() { f64::NAN } else { median(base) };
    for (i, mode) in MODES.iter().enumerate() {
        let shape = format!("{} x {} KiB", mode.buffers, mode.buffer_bytes >> 10);
        if let Some(why) = &refused[i] {
            println!("| {} | {shape} | refused: {why} | - | - |", mode.name);
            continue;
        }
        let column = |f: fn(&(f64, f64, f64)) -> f64| median(results[i].iter().map(f).collect());
        let cpu = column(|r| r.0);
        println!(
            "| {} | {shape} | {:.1} ({:.2}x) | {:.1} | {:.1} |",
            mode.name,
            cpu / 1e3,
            cpu / base,
            column(|r| r.1),
            column(|r| r.2) / 1e3
        );
    }
}
