//! A ring of receive buffers the kernel picks from (`IORING_REGISTER_PBUF_RING`,
//! Linux 5.19): a multishot receive holds no buffer while it waits, and
//! takes one only when bytes arrive.
//!
//! # Implementation notes
//! - The ring is an array of `io_uring_buf` entries in page-aligned memory
//!   shared with the kernel; the buffers are one heap block, cut into
//!   [`BUFFER_BYTES`] pieces named by their index (the buffer id). The
//!   kernel consumes entries from the head; the driver gives a buffer back
//!   by writing an entry at the tail and publishing the tail with a release
//!   store, which is the only ordering the kernel needs.
//! - A completion names the buffer it filled (`IORING_CQE_F_BUFFER`). The
//!   driver copies the bytes out (into the reader's own buffer) and gives
//!   the buffer back at once, so buffers never leave the driver and a slow
//!   reader never holds one for long.
//! - Both blocks must outlive every operation that may still pick from the
//!   ring: the ring is dropped (and unregistered) only with the driver,
//!   after every operation has ended, and leaked with the operations if
//!   the kernel still holds some.

use std::alloc::Layout;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::IoUring;

/// Buffers in the ring (a power of two, at most 2^15).
pub(super) const BUFFERS: u16 = 256;
/// Bytes per buffer: a request, or a slice of a stream, per completion.
pub(super) const BUFFER_BYTES: usize = 4096;
/// The buffer group id the ring is registered under.
pub(super) const GROUP: u16 = 0;

/// The ring of provided buffers.
pub(super) struct BufRing {
    /// `BUFFERS` entries, page-aligned, shared with the kernel.
    entries: NonNull<BufRingEntry>,
    layout: Layout,
    /// `BUFFERS * BUFFER_BYTES` bytes the kernel writes into.
    buffers: Box<[u8]>,
    /// The tail as the driver knows it (the kernel reads the published one).
    tail: u16,
}

impl BufRing {
    /// Allocates the ring and its buffers, registers them with `ring`
    /// and hands every buffer to the kernel.
    pub(super) fn new(ring: &IoUring) -> io::Result<BufRing> {
        let page = 4096;
        let layout = Layout::from_size_align(BUFFERS as usize * size_of::<BufRingEntry>(), page)
            .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(entries) = NonNull::new(ptr.cast::<BufRingEntry>()) else {
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        let mut buf_ring = BufRing {
            entries,
            layout,
            buffers: vec![0u8; BUFFERS as usize * BUFFER_BYTES].into_boxed_slice(),
            tail: 0,
        };
        // SAFETY: `entries` points at `BUFFERS` zeroed, page-aligned entries that live (with the
        // buffers) until this ring is dropped, which unregisters it first; the driver keeps the
        // ring for as long as any operation may pick from it.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                entries.as_ptr() as u64,
                BUFFERS,
                GROUP,
                0,
            )?;
        }
        for bid in 0..BUFFERS {
            buf_ring.push(bid);
        }
        buf_ring.publish();
        Ok(buf_ring)
    }

    /// The `len` bytes the kernel wrote into buffer `bid`.
    pub(super) fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * BUFFER_BYTES;
        &self.buffers[start..start + len.min(BUFFER_BYTES)]
    }

    /// Gives buffer `bid` back to the kernel (visible at the next [`BufRing::publish`]).
    pub(super) fn push(&mut self, bid: u16) {
        let index = (self.tail & (BUFFERS - 1)) as usize;
        let addr = self.buffers.as_ptr() as u64 + (bid as usize * BUFFER_BYTES) as u64;
        // SAFETY: `index < BUFFERS`, so the entry is inside the allocation; the kernel does not
        // read entries between the published tail and this one.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(addr);
        entry.set_len(BUFFER_BYTES as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the buffers pushed since the last call to the kernel.
    pub(super) fn publish(&self) {
        // SAFETY: `entries` is the ring's first entry; the tail field shares its memory with
        // that entry's `resv` field, and is only ever written here.
        let tail = unsafe { BufRingEntry::tail(self.entries.as_ptr()) } as *const AtomicU16;
        // SAFETY: the tail is a naturally aligned u16 inside the allocation; the kernel reads it
        // with acquire ordering, which this release store pairs with.
        unsafe { (*tail).store(self.tail, Ordering::Release) };
    }

    /// Unregisters the ring from `ring`; after this the memory may be freed.
    pub(super) fn unregister(&self, ring: &IoUring) {
        let _ = ring.submitter().unregister_buf_ring(GROUP);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the driver unregisters the ring (or
        // leaks it) before dropping it.
        unsafe { std::alloc::dealloc(self.entries.as_ptr().cast(), self.layout) };
    }
}
