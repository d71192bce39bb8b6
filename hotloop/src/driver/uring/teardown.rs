//! Tearing the driver down: everything in flight is cancelled (writes of
//! dropped streams get half the time to finish) and waited for, so no
//! memory the kernel may still write is freed.

use std::time::{Duration, Instant};

use super::lifecycle::Lifecycle;
use super::ring::WAKE_USER_DATA;
use super::{accept, pooled, Uring, DRAIN_ON_DROP_MAX};
use crate::slab::Key;

impl Drop for Uring {
    fn drop(&mut self) {
        for key in self.listeners.keys() {
            if let Some(l) = self.listeners.remove(key) {
                if let Some(op) = l.op {
                    accept::orphan(self, op);
                }
            }
        }
        for key in self.streams.keys() {
            self.release_stream(key, None);
        }
        for key in self.dgrams.keys() {
            self.release_dgrams(key);
        }
        // Writes that dropped streams left running get half the drain time
        // to finish, as the kernel would send a closed socket's buffered
        // bytes; everything else is cancelled now.
        let lingering: Vec<Key> = self.lingering.drain(..).map(|(_, k)| k).collect();
        for key in self.ops.keys() {
            if self.ops.get(key).is_some_and(Lifecycle::held_by_kernel) && !lingering.contains(&key)
            {
                self.ring.push_cancel(key);
            }
        }
        self.ring.push_cancel_user_data(WAKE_USER_DATA);
        let start = Instant::now();
        let deadline = start + DRAIN_ON_DROP_MAX;
        let mut lingering = Some(lingering);
        let mut woken = Vec::new();
        let mut freed = Vec::new();
        while self.kernel_holds_any() && Instant::now() < deadline {
            if Instant::now() >= start + DRAIN_ON_DROP_MAX / 2 {
                for key in lingering.take().unwrap_or_default() {
                    if self.ops.get(key).is_some_and(Lifecycle::held_by_kernel) {
                        self.ring.push_cancel(key);
                    }
                }
            }
            let (ops, streams) = (&mut self.ops, &mut self.streams);
            if self
                .ring
                .enter(Some(Duration::from_millis(10)), |ud| pooled::admit(ops, streams, ud))
                .is_err()
            {
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
            std::mem::forget(std::mem::take(&mut self.ops));
            std::mem::forget(std::mem::take(&mut self.streams));
            std::mem::forget(self.buf_ring.take());
            std::mem::forget(std::mem::take(&mut self.dgrams));
        } else if let Some(buf_ring) = &self.buf_ring {
            buf_ring.unregister(self.ring.io_uring());
        }
    }
}

impl Uring {
    /// True while the kernel holds any operation or stream receive.
    fn kernel_holds_any(&self) -> bool {
        self.ops.iter().any(|(_, s)| s.held_by_kernel())
            || self.streams.iter().any(|(_, s)| s.held_by_kernel())
    }
}
