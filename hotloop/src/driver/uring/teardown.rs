//! Tearing the driver down: everything in flight is cancelled and waited
//! for, so no memory the kernel may still write is freed; lingering writes
//! go on until their bytes are in the kernel or their deadline cuts them.

use std::time::{Duration, Instant};

use super::pooled;
use super::state::Uring;
use super::user_data::UserData;

/// How long dropping the driver waits for cancelled operations to complete
/// (counted from the drop, or from the deadline of the last lingering
/// write, which it waits for first).
pub(super) const DRAIN_ON_DROP_MAX: Duration = Duration::from_secs(1);

impl Drop for Uring {
    fn drop(&mut self) {
        self.listeners.release_all(&mut self.ops, &mut self.ring);
        self.streams.release_all(&mut self.ring);
        self.dgrams.release_all(&mut self.ops, &mut self.ring);
        // Everything but the lingering writes is cancelled now. A lingering
        // write carries bytes its stream reported written: a closed
        // socket's kernel buffer would still be sent (which is why tokio's
        // drop waits for nothing), but these are in user space, so the ring
        // is driven until they are in the kernel, the socket fails, or the
        // write's deadline cuts it (and resets its connection).
        self.ops.cancel_all_but_lingering(&mut self.ring);
        self.ring.push_cancel_of(UserData::Wake);
        let mut drain_until = Instant::now() + DRAIN_ON_DROP_MAX;
        let mut woken = Vec::new();
        let mut freed = Vec::new();
        loop {
            self.cancel_expired_lingerers();
            let lingering = self.first_lingering();
            if let Some(deadline) = lingering {
                // Its cut's cancel gets the drain time after the deadline.
                drain_until = drain_until.max(deadline + DRAIN_ON_DROP_MAX);
            }
            let now = Instant::now();
            if !self.kernel_holds_any() || now >= drain_until {
                break;
            }
            // Wait in the ring until the next completion, or the first
            // deadline (never a zero wait, which would spin).
            let until = lingering.filter(|&d| d > now).unwrap_or(drain_until);
            let wait = until.saturating_duration_since(now).max(Duration::from_micros(100));
            let (ops, streams) = (&mut self.ops, &mut self.streams);
            if self.ring.enter(Some(wait), |ud| pooled::admit(ops, streams, ud)).is_err() {
                break;
            }
            self.reap(&mut woken, &mut freed);
        }
        drop(woken);
        drop(freed);
        if self.kernel_holds_any() {
            // The kernel still holds some operations: their memory, and the
            // buffers they may pick (the stream ring, and the rings of
            // closed datagram sockets), must not be freed, nor the sockets
            // they name closed.
            self.ops.leak();
            self.streams.leak();
            self.dgrams.leak();
            self.zero_copy.leak();
        } else {
            self.streams.unregister(&self.ring);
        }
    }
}

impl Uring {
    /// True while the kernel holds any operation or stream receive, or
    /// may still read a zero-copy send's bytes.
    fn kernel_holds_any(&self) -> bool {
        !self.zero_copy.is_empty()
            || self.ops.any_held_by_kernel()
            || self.streams.any_held_by_kernel()
    }
}
