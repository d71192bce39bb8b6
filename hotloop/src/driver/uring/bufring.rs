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
//! - The stream ring consumes its buffers incrementally where the kernel
//!   can (`IOU_PBUF_RING_INC`, Linux 6.12): [`INC_BUFFERS`] buffers of
//!   [`INC_BUFFER_BYTES`] (the same memory), each filled by as many
//!   completions, of any socket, as fit, one after the other. A receive
//!   then takes up to 64 KiB of a busy stream per completion instead of
//!   4 KiB, which cut the receiving thread's CPU per MiB to 0.73x
//!   (`cargo bench -p hotloop-bench --bench recv_bundle`), and a small
//!   request still takes only its own bytes. A completion's bytes start
//!   where the previous one in that buffer stopped (kept in `used`); while
//!   the kernel says `IORING_CQE_F_BUF_MORE` the buffer is still its own,
//!   and it goes back only at the completion without that flag. Where the
//!   kernel refuses the flag (`EINVAL`) or `HOTLOOP_URING_RECV_INC=0`, the
//!   ring is [`BUFFERS`] whole-use buffers of [`BUFFER_BYTES`].

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
/// Buffers in the stream ring when it is consumed incrementally.
pub(super) const INC_BUFFERS: u16 = 16;
/// Bytes per buffer of the incrementally consumed stream ring.
pub(super) const INC_BUFFER_BYTES: usize = 64 * 1024;
/// `IOU_PBUF_RING_INC`: the kernel fills a buffer a completion at a time.
const IOU_PBUF_RING_INC: u16 = 2;

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
    /// Consumed incrementally: how many bytes of each buffer earlier
    /// completions used (empty when each completion uses a whole buffer).
    used: Box<[u32]>,
}

impl BufRing {
    /// Allocates the driver's stream ring under [`GROUP`], consumed
    /// incrementally if `incremental` and the kernel can ([`INC_BUFFERS`] of
    /// [`INC_BUFFER_BYTES`]), else [`BUFFERS`] of [`BUFFER_BYTES`];
    /// registers it with `ring` and hands every buffer to the kernel.
    pub(super) fn new(ring: &IoUring, incremental: bool) -> io::Result<BufRing> {
        if incremental {
            match Self::register(ring, GROUP, INC_BUFFERS, INC_BUFFER_BYTES, true) {
                // Kernels before 6.12 refuse the flag.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                other => return other,
            }
        }
        Self::with_group(ring, GROUP, BUFFERS, BUFFER_BYTES)
    }

    /// Allocates `count` buffers of `buffer_bytes` (`count` a power of two,
    /// at most 2^15), registers them under `group` and hands every buffer
    /// to the kernel; each completion uses a whole buffer.
    pub(super) fn with_group(
        ring: &IoUring,
        group: u16,
        count: u16,
        buffer_bytes: usize,
    ) -> io::Result<BufRing> {
        Self::register(ring, group, count, buffer_bytes, false)
    }

    fn register(
        ring: &IoUring,
        group: u16,
        count: u16,
        buffer_bytes: usize,
        incremental: bool,
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
            used: if incremental { vec![0; count as usize].into() } else { Box::default() },
        };
        // SAFETY: `entries` points at `count` zeroed, page-aligned entries that live (with the
        // buffers) until this ring is dropped, which unregisters it first; the driver keeps the
        // ring for as long as any operation may pick from it.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                entries.as_ptr() as u64,
                count,
                group,
                if incremental { IOU_PBUF_RING_INC } else { 0 },
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

    /// Whether completions use buffers a part at a time.
    pub(super) fn incremental(&self) -> bool {
        !self.used.is_empty()
    }

    /// Takes what one receive completion put into buffer `bid`: its `len`
    /// bytes go to `into` (or nowhere, for a socket no longer read), and the
    /// buffer goes back to the kernel once the kernel is done with it: at
    /// once when each completion uses a whole buffer; when consumed
    /// incrementally, at the completion without `IORING_CQE_F_BUF_MORE`,
    /// each completion's bytes starting where the previous one's ended.
    /// Publishes what it gave back.
    pub(super) fn take(&mut self, bid: u16, len: usize, flags: u32, into: Option<&mut Vec<u8>>) {
        if bid >= self.count {
            return;
        }
        let used = self.used.get(bid as usize).map_or(0, |&u| u as usize);
        let start = bid as usize * self.buffer_bytes + used;
        let len = len.min(self.buffer_bytes - used);
        if let Some(into) = into {
            into.extend_from_slice(&self.buffers[start..start + len]);
        }
        if self.incremental() && io_uring::cqueue::buffer_more(flags) {
            self.used[bid as usize] = (used + len) as u32;
            return;
        }
        self.push(bid);
        self.publish();
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
        if let Some(used) = self.used.get_mut(bid as usize) {
            *used = 0;
        }
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
