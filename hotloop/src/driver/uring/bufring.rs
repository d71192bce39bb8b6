//! A ring of receive buffers the kernel picks from (`IORING_REGISTER_PBUF_RING`,
//! Linux 5.19): a multishot receive holds no buffer while it waits, and
//! takes one only when bytes arrive.
//!
//! # Implementation notes
//! - The ring is an array of `io_uring_buf` entries in page-aligned memory
//!   shared with the kernel; the buffers are one heap block, cut into
//!   equal pieces ([`BUFFER_BYTES`] for the driver's stream ring) named by
//!   their index (the buffer id). The block is zeroed by `calloc`, which
//!   maps fresh pages for a large block: a page costs memory only once the
//!   kernel has written into it. The
//!   kernel consumes entries from the head; the driver gives a buffer back
//!   by writing an entry at the tail and publishing the tail with a release
//!   store, which is the only ordering the kernel needs.
//! - A completion names the buffer it filled (`IORING_CQE_F_BUFFER`). The
//!   stream ring's buffers are copied out and given back at once, so a
//!   slow reader never holds one; a datagram socket's own ring
//!   (`dgram.rs`) keeps each buffer until its datagram is taken.
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

/// A ring of provided buffers, registered under one buffer group.
pub(super) struct BufRing {
    /// `count` entries, page-aligned, shared with the kernel.
    entries: NonNull<BufRingEntry>,
    layout: Layout,
    /// `count * buffer_bytes` bytes the kernel writes into.
    buffers: Box<[u8]>,
    /// Buffers in the ring (a power of two).
    count: u16,
    /// Bytes per buffer.
    buffer_bytes: usize,
    /// The buffer group id the ring is registered under.
    group: u16,
    /// The tail as the driver knows it (the kernel reads the published one).
    tail: u16,
}

impl BufRing {
    /// Allocates the driver's stream ring ([`BUFFERS`] of [`BUFFER_BYTES`]
    /// under [`GROUP`]), registers it with `ring` and hands every buffer to
    /// the kernel.
    pub(super) fn new(ring: &IoUring) -> io::Result<BufRing> {
        Self::with_group(ring, GROUP, BUFFERS, BUFFER_BYTES)
    }

    /// Allocates `count` buffers of `buffer_bytes` (`count` a power of two,
    /// at most 2^15), registers them under `group` and hands every buffer
    /// to the kernel.
    pub(super) fn with_group(
        ring: &IoUring,
        group: u16,
        count: u16,
        buffer_bytes: usize,
    ) -> io::Result<BufRing> {
        if !count.is_power_of_two() || count > 1 << 15 || buffer_bytes > u32::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a buffer ring holds a power of two of buffers, at most 32768, of at most 4 GiB",
            ));
        }
        let page = 4096;
        let layout = Layout::from_size_align(count as usize * size_of::<BufRingEntry>(), page)
            .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(entries) = NonNull::new(ptr.cast::<BufRingEntry>()) else {
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        let mut buf_ring = BufRing {
            entries,
            layout,
            buffers: vec![0u8; count as usize * buffer_bytes].into_boxed_slice(),
            count,
            buffer_bytes,
            group,
            tail: 0,
        };
        // SAFETY: `entries` points at `count` zeroed, page-aligned entries that live (with the
        // buffers) until this ring is dropped, which unregisters it first; the driver keeps the
        // ring for as long as any operation may pick from it.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                entries.as_ptr() as u64,
                count,
                group,
                0,
            )?;
        }
        for bid in 0..count {
            buf_ring.push(bid);
        }
        buf_ring.publish();
        Ok(buf_ring)
    }

    /// The `len` bytes the kernel wrote into buffer `bid`.
    pub(super) fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * self.buffer_bytes;
        &self.buffers[start..start + len.min(self.buffer_bytes)]
    }

    /// Buffers in the ring.
    pub(super) fn count(&self) -> u16 {
        self.count
    }

    /// The buffer group id the ring is registered under.
    pub(super) fn group(&self) -> u16 {
        self.group
    }

    /// Gives buffer `bid` back to the kernel (visible at the next [`BufRing::publish`]).
    pub(super) fn push(&mut self, bid: u16) {
        debug_assert!(bid < self.count);
        let index = (self.tail & (self.count - 1)) as usize;
        let addr = self.buffers.as_ptr() as u64 + (bid as usize * self.buffer_bytes) as u64;
        // SAFETY: `index < count`, so the entry is inside the allocation; the kernel does not
        // read entries between the published tail and this one.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(addr);
        entry.set_len(self.buffer_bytes as u32);
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
        let _ = ring.submitter().unregister_buf_ring(self.group);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the driver unregisters the ring (or
        // leaks it) before dropping it.
        unsafe { std::alloc::dealloc(self.entries.as_ptr().cast(), self.layout) };
    }
}

/// A datagram socket's own ring and the header its multishot `RECVMSG`
/// names (`dgram.rs`): both must outlive the operation.
pub(super) struct RecvRing {
    pub(super) buf_ring: BufRing,
    /// Only `msg_namelen` and `msg_controllen` matter: the space the kernel
    /// reserves in each buffer.
    pub(super) msg: Box<libc::msghdr>,
}
