//! A connection's place in its server's count of open connections (the
//! count `maxconn` bounds), held from the connection's accept on.
//!
//! # Implementation notes
//! A connection handed to another worker (`balance.rs`) waits in that
//! worker's lane until it is taken, which a busy or blocked worker may
//! not do for a while. Counted only once taken, such connections let the
//! accepting worker accept past the limit meanwhile (a loaded server at
//! `--maxconn 100` was seen holding 116 descriptors for its clients). So
//! the slot is taken at the accept and travels with the connection: the
//! handler's guard frees it when the connection ends, and a connection
//! dropped on its way (its lane closed and no other would take it, or
//! the accept loop holding it dropped) frees it when dropped, waking the
//! accept loops that wait for one.

use std::sync::Arc;

/// A server's count of open connections, as a [`Slot`] frees its place in it.
pub(crate) trait SlotCount: Send + Sync {
    /// Gives back one slot, waking whoever waits for one.
    fn release(&self);
}

/// One slot taken in a server's count: freed when dropped, unless
/// [`Slot::pass_to_handler`] gave it to the connection's handler.
pub(crate) struct Slot(Option<Arc<dyn SlotCount>>);

impl Slot {
    /// A slot `count` has already counted.
    pub(crate) fn taken(count: Arc<dyn SlotCount>) -> Slot {
        Slot(Some(count))
    }

    /// The connection is served: its handler's guard frees the slot when
    /// the connection ends.
    pub(crate) fn pass_to_handler(mut self) {
        self.0 = None;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(count) = self.0.take() {
            count.release();
        }
    }
}
