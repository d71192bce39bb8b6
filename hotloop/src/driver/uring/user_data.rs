//! What a ring entry's `user_data` names: the one encoding of every
//! entry's owner, written and read only here.
//!
//! # Implementation notes
//! - An operation in the driver's slab is named by its generational key
//!   (`Key::to_u64`), so a completion for a slot that was freed and reused
//!   is recognised by its generation and dropped.
//! - A stream's multishot receive lives in the stream's own slot (the
//!   streams' slab, `pooled.rs`), so its key is tagged with bit 31, the top
//!   of a key's slot index: the operation slab never holds 2^31 entries.
//! - The driver's own entries (the wake poll, cancels, the deadline timer
//!   and its moves, the close of a direct socket's slot, and an entry run
//!   at once) take the six highest values, which no key reaches (its slot
//!   index would be past four billion).

use crate::slab::Key;

/// The owner of a ring entry, as its `user_data` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UserData {
    /// The poll on the worker's unpark eventfd.
    Wake,
    /// A cancel request (its own completion tells the driver nothing).
    Cancel,
    /// The driver's deadline timer (`IORING_OP_TIMEOUT`).
    Timer,
    /// A request that moves the deadline timer.
    TimerUpdate,
    /// The close of a direct socket's slot (its result tells the driver
    /// nothing: the slot is free either way).
    SlotClose,
    /// The entry `Ring::run_now` waits for.
    RunNow,
    /// An operation in the driver's slab.
    Op(Key),
    /// The multishot receive of a stream, by the stream's key.
    StreamReceive(Key),
}

const WAKE: u64 = u64::MAX;
const CANCEL: u64 = u64::MAX - 1;
const TIMER: u64 = u64::MAX - 2;
const TIMER_UPDATE: u64 = u64::MAX - 3;
const SLOT_CLOSE: u64 = u64::MAX - 4;
const RUN_NOW: u64 = u64::MAX - 5;
/// The tag of a stream receive's key.
const STREAM_RECEIVE: u64 = 1 << 31;

impl UserData {
    /// The `user_data` that names this owner.
    #[inline]
    pub(super) fn to_u64(self) -> u64 {
        match self {
            UserData::Wake => WAKE,
            UserData::Cancel => CANCEL,
            UserData::Timer => TIMER,
            UserData::TimerUpdate => TIMER_UPDATE,
            UserData::SlotClose => SLOT_CLOSE,
            UserData::RunNow => RUN_NOW,
            UserData::Op(key) => key.to_u64(),
            UserData::StreamReceive(stream) => stream.to_u64() | STREAM_RECEIVE,
        }
    }

    /// The owner `user_data` names (`None`: no owner this driver made).
    #[inline]
    pub(super) fn from_u64(user_data: u64) -> Option<UserData> {
        match user_data {
            WAKE => Some(UserData::Wake),
            CANCEL => Some(UserData::Cancel),
            TIMER => Some(UserData::Timer),
            TIMER_UPDATE => Some(UserData::TimerUpdate),
            SLOT_CLOSE => Some(UserData::SlotClose),
            RUN_NOW => Some(UserData::RunNow),
            _ if user_data & STREAM_RECEIVE != 0 => {
                Key::from_u64(user_data & !STREAM_RECEIVE).map(UserData::StreamReceive)
            }
            _ => Key::from_u64(user_data).map(UserData::Op),
        }
    }

    /// True for an entry of an operation or a stream receive, whose slot
    /// may have been withdrawn before the entry left the driver's list.
    #[inline]
    pub(super) fn has_slot(user_data: u64) -> bool {
        user_data < RUN_NOW
    }
}

#[cfg(test)]
mod tests {
    use super::UserData;
    use crate::slab::Slab;

    #[test]
    fn every_owner_reads_back_as_itself() {
        let mut slab = Slab::default();
        let key = slab.insert(());
        for owner in [
            UserData::Wake,
            UserData::Cancel,
            UserData::Timer,
            UserData::TimerUpdate,
            UserData::SlotClose,
            UserData::RunNow,
            UserData::Op(key),
            UserData::StreamReceive(key),
        ] {
            assert_eq!(UserData::from_u64(owner.to_u64()), Some(owner));
        }
        assert_ne!(UserData::Op(key).to_u64(), UserData::StreamReceive(key).to_u64());
        assert!(UserData::has_slot(UserData::StreamReceive(key).to_u64()));
        assert!(!UserData::has_slot(UserData::TimerUpdate.to_u64()));
        assert!(!UserData::has_slot(UserData::RunNow.to_u64()));
    }
}
