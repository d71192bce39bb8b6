//! Owned buffers: the form of I/O that a completion driver needs.
//!
//! A read or write takes its buffer by value and hands it back with the
//! result, as [`BufResult`]. With io_uring the kernel writes into the buffer
//! after the call that submitted the operation has returned, so the runtime
//! must own the memory until the operation's last completion arrives, even if
//! the future that started it was dropped. The same API on epoll costs
//! nothing extra: the buffer is simply lent to the syscall and returned.
//!
//! # Implementation notes
//! Both traits are `unsafe` because the driver trusts them: the pointer must
//! stay valid and fixed while the value is moved around (so a `Vec`'s heap
//! block qualifies, an array on the stack does not), and the lengths must be
//! truthful.

pub(crate) mod pool;

use std::ops::{Bound, RangeBounds};

/// The result of an owned-buffer operation: the outcome and the buffer.
pub type BufResult<T, B> = (std::io::Result<T>, B);

/// Runs a tokio-style read (`read` fills a `ReadBuf`) straight into
/// hyper's uninitialised read cursor, as hyper-util's `TokioIo` does:
/// no zeroed staging chunk and no copy.
#[cfg(feature = "hyper")]
pub(crate) fn poll_read_hyper(
    mut cursor: hyper::rt::ReadBufCursor<'_>,
    read: impl FnOnce(&mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>>,
) -> std::task::Poll<std::io::Result<()>> {
    let n = {
        // SAFETY: a `ReadBuf` over the cursor's spare room only ever
        // writes initialised bytes into it and cannot de-initialise any
        // through its safe API, which is all `read` has.
        let mut rb = tokio::io::ReadBuf::uninit(unsafe { cursor.as_mut() });
        std::task::ready!(read(&mut rb))?;
        rb.filled().len()
    };
    // SAFETY: the `ReadBuf` filled (so initialised) the first `n` bytes of
    // the cursor's spare room.
    unsafe { cursor.advance(n) };
    std::task::Poll::Ready(Ok(()))
}

/// A buffer the kernel may read from (for writes).
///
/// # Safety
/// `stable_ptr` must point to `bytes_init` initialised bytes that stay at the
/// same address, untouched, for as long as the value is not mutated or
/// dropped, including while it is moved. A handle [`IoBuf::share`]
/// returns must keep those bytes at that address, untouched, until the
/// handle is dropped, whatever happens to the buffer meanwhile; and a
/// buffer that gave one once gives one every time it is asked.
pub unsafe trait IoBuf: 'static {
    /// Pointer to the first byte.
    fn stable_ptr(&self) -> *const u8;
    /// Number of initialised bytes, the ones a write sends.
    fn bytes_init(&self) -> usize;

    /// Another handle on the same bytes that keeps them alive and
    /// unchanged after this buffer is handed back and dropped (a second
    /// reference to shared, immutable memory), or `None`, the default.
    ///
    /// A zero-copy send needs one: the kernel reads the bytes until the
    /// network is done with them, after the write has returned. On
    /// io_uring an owned write of a buffer that has one (`Arc<[u8]>`,
    /// `Rc<[u8]>`, static data and their slices) goes out zero-copy from
    /// 64 KiB; a `Vec` is copied, since its owner may change or free it
    /// as soon as it is back.
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        None
    }

    /// A view of `range` of this buffer, which a write sends instead of the whole.
    fn slice(self, range: impl RangeBounds<usize>) -> Slice<Self>
    where
        Self: Sized,
    {
        // `usize::MAX + 1` would wrap in a build without overflow checks,
        // turning a range past the end into an empty or whole one.
        let past = |n: usize| n.checked_add(1).expect("slice out of range");
        let begin = match range.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => past(n),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&n) => past(n),
            Bound::Excluded(&n) => n,
            Bound::Unbounded => self.bytes_init(),
        };
        assert!(begin <= end && end <= self.bytes_init(), "slice out of range");
        Slice { buf: self, begin, end }
    }
}

/// A buffer the kernel may write into (for reads).
///
/// # Safety
/// `stable_mut_ptr` must point to `bytes_total` writable bytes that stay at
/// the same address while the value is moved; `set_init` must only be called
/// with a count of bytes that really were written.
pub unsafe trait IoBufMut: 'static {
    /// Pointer to the first byte.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Total writable bytes (a `Vec`'s capacity).
    fn bytes_total(&self) -> usize;
    /// Records that the first `n` bytes are now initialised.
    ///
    /// # Safety
    /// The first `n` bytes must have been written.
    unsafe fn set_init(&mut self, n: usize);
}

// SAFETY: a Vec's heap block does not move when the Vec value moves; `len` bytes are initialised.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: the heap block has `capacity` writable bytes and does not move when the Vec moves.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // A read replaces the contents: the length becomes what was read.
        // SAFETY: the caller guarantees the first `n` bytes (n <= capacity) were written.
        unsafe { self.set_len(n) };
    }
}

// SAFETY: a boxed slice's heap block does not move with the Box; all of it is initialised.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: static data never moves, is always initialised and never
// changes: it needs no handle to stay alive.
unsafe impl IoBuf for &'static [u8] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        Some(Box::new(()))
    }
}

// SAFETY: static data never moves, is always initialised and never
// changes: it needs no handle to stay alive.
unsafe impl IoBuf for &'static str {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        Some(Box::new(()))
    }
}

// SAFETY: an Rc's allocation never moves and is immutable while shared;
// the handle is a clone, which shares it.
unsafe impl IoBuf for std::rc::Rc<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        Some(Box::new(self.clone()))
    }
}

// SAFETY: an Arc's allocation never moves and is immutable while shared;
// the handle is a clone, which shares it.
unsafe impl IoBuf for std::sync::Arc<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        Some(Box::new(self.clone()))
    }
}

/// Bytes read into a buffer lent by a pool (a worker's read buffers,
/// [`TcpStream::read_pooled`](crate::net::TcpStream::read_pooled)); the
/// buffer goes back to its pool when this is dropped. The default is
/// empty and holds no buffer.
#[derive(Default)]
pub struct PooledBuf {
    buf: Option<Vec<u8>>,
    /// The pool the buffer goes back to, from whatever thread drops it
    /// (`None`: freed).
    home: Option<std::sync::Arc<pool::Returns>>,
}

impl PooledBuf {
    /// Wraps `buf`, lent by the pool `home`.
    pub(crate) fn lent(buf: Vec<u8>, home: Option<std::sync::Arc<pool::Returns>>) -> Self {
        PooledBuf { buf: Some(buf), home }
    }

    /// Takes the bytes out as a plain `Vec` (the pool gets a new buffer later).
    pub fn into_vec(mut self) -> Vec<u8> {
        self.buf.take().unwrap_or_default()
    }
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let (Some(buf), Some(home)) = (self.buf.take(), self.home.take()) {
            pool::give_back(buf, &home);
        }
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuf").field("len", &self.len()).finish()
    }
}

// SAFETY: the Vec inside never moves its heap block while the PooledBuf is
// alive, and `len` bytes of it are initialised.
unsafe impl IoBuf for PooledBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.buf.as_ref().map_or(std::ptr::NonNull::dangling().as_ptr(), |b| b.as_ptr())
    }
    fn bytes_init(&self) -> usize {
        self.buf.as_ref().map_or(0, Vec::len)
    }
}

/// A range of an owned buffer; [`Slice::into_inner`] gives the buffer back.
#[derive(Debug)]
pub struct Slice<B> {
    buf: B,
    begin: usize,
    end: usize,
}

impl<B> Slice<B> {
    /// The start of the range within the buffer.
    pub fn begin(&self) -> usize {
        self.begin
    }
    /// The end of the range within the buffer.
    pub fn end(&self) -> usize {
        self.end
    }
    /// Returns the whole underlying buffer.
    pub fn into_inner(self) -> B {
        self.buf
    }
}

// SAFETY: a sub-range of a buffer that upholds IoBuf's contract; begin..end lies within its initialised bytes (checked in `slice`).
unsafe impl<B: IoBuf> IoBuf for Slice<B> {
    fn stable_ptr(&self) -> *const u8 {
        // SAFETY: `begin <= bytes_init`, so the offset stays inside the allocation.
        unsafe { self.buf.stable_ptr().add(self.begin) }
    }
    fn bytes_init(&self) -> usize {
        self.end - self.begin
    }
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        self.buf.share()
    }
}

/// The `iovec`s that describe the initialised bytes of `bufs`, for a
/// vectored write; valid while `bufs` is neither mutated nor dropped.
pub(crate) fn iovecs<B: IoBuf>(bufs: &[B]) -> Vec<libc::iovec> {
    bufs.iter()
        .map(|b| libc::iovec {
            iov_base: b.stable_ptr() as *mut libc::c_void,
            iov_len: b.bytes_init(),
        })
        .collect()
}

/// Copies `src` into `buf` from its start (as much as fits) and records
/// those bytes as its contents; returns how many were copied. The safe
/// way for code outside the drivers to fill an owned buffer.
pub(crate) fn fill<B: IoBufMut>(buf: &mut B, src: &[u8]) -> usize {
    let n = src.len().min(buf.bytes_total());
    // SAFETY: `buf` has `bytes_total >= n` writable bytes at `stable_mut_ptr`,
    // which cannot overlap `src` (borrowed while `buf` is borrowed mutably).
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), buf.stable_mut_ptr(), n);
        buf.set_init(n);
    }
    n
}

/// The initialised bytes of `buf`, borrowed.
pub(crate) fn init_bytes<B: IoBuf>(buf: &B) -> &[u8] {
    // SAFETY: `IoBuf` promises `bytes_init` initialised bytes at `stable_ptr`,
    // unchanged while `buf` is borrowed.
    unsafe { std::slice::from_raw_parts(buf.stable_ptr(), buf.bytes_init()) }
}

/// The spare capacity of a `Vec` as a buffer to read into: a read appends
/// to the `Vec`'s contents instead of replacing them.
pub(crate) struct Tail(pub(crate) Vec<u8>);

// SAFETY: the Vec's heap block does not move when the Vec moves; the bytes
// from `len` to `capacity` are writable.
unsafe impl IoBufMut for Tail {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        let len = self.0.len();
        // SAFETY: `len <= capacity`, so the pointer stays within (or one past) the allocation.
        unsafe { self.0.as_mut_ptr().add(len) }
    }
    fn bytes_total(&self) -> usize {
        self.0.capacity() - self.0.len()
    }
    unsafe fn set_init(&mut self, n: usize) {
        let len = self.0.len();
        // SAFETY: the caller guarantees the `n` bytes after `len` were written.
        unsafe { self.0.set_len(len + n) };
    }
}

#[cfg(test)]
mod tests {
    use super::IoBuf;

    /// A bound one past `usize::MAX` is out of range, in every build (it
    /// wrapped to 0 where overflow checks are off: an empty or whole slice).
    #[test]
    #[should_panic(expected = "slice out of range")]
    fn an_inclusive_end_at_the_last_usize_is_out_of_range() {
        let _ = vec![1u8, 2, 3].slice(..=usize::MAX);
    }

    #[test]
    #[should_panic(expected = "slice out of range")]
    fn an_excluded_start_at_the_last_usize_is_out_of_range() {
        use std::ops::Bound;
        let _ = vec![1u8, 2, 3].slice((Bound::Excluded(usize::MAX), Bound::Unbounded));
    }
}
