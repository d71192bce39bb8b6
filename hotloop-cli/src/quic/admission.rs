//! Admission: what to do with a connection attempt (refuse it, send a
//! Retry, or let it in holding a `--maxconn` slot or a place among the
//! unvalidated handshakes), and the guards that give a slot, a place and
//! the open count back when the connection ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hotloop::quic::AmplificationLimit;
use quinn::Incoming;

use super::settings::Settings;
use crate::drain;
use crate::serve_args::RetryPolicy;

/// What to do with a connection attempt.
pub(super) enum Admit {
    Refuse,
    Retry,
    /// Its address is validated and it has taken a `--maxconn` slot.
    Slot,
    /// Its address is not validated; it has taken a place among the
    /// unvalidated handshakes and takes a slot when it completes.
    Unvalidated,
}

/// Decides on a connection attempt (and takes its slot or its place): a
/// stopping or full server refuses; a validated address takes a slot; an
/// unvalidated one is sent a Retry or takes a place as `--quic-retry` and
/// `--quic-unvalidated-max` say. A spoofed address can hold a place, never a
/// slot, so a flood of them cannot take the server's slots from clients.
pub(super) fn admit(incoming: &Incoming, s: &Settings) -> Admit {
    if drain::stopping() || s.slots.load(Ordering::SeqCst) >= s.maxconn {
        return Admit::Refuse;
    }
    if incoming.remote_address_validated() {
        return match Settings::take(&s.slots, s.maxconn) {
            true => Admit::Slot,
            false => Admit::Refuse,
        };
    }
    if s.retry == RetryPolicy::Always {
        return Admit::Retry;
    }
    if Settings::take(&s.unvalidated, s.unvalidated_max) {
        return Admit::Unvalidated;
    }
    match s.retry {
        RetryPolicy::Never => Admit::Refuse,
        _ => Admit::Retry,
    }
}

/// Counts a connection as open until dropped.
pub(super) struct Active(pub(super) Arc<Settings>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A `--maxconn` slot, given back when dropped.
pub(super) struct Slot(pub(super) Arc<Settings>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.slots.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A place among the unvalidated handshakes, given back when dropped.
pub(super) struct Unvalidated(pub(super) Arc<Settings>);

impl Drop for Unvalidated {
    fn drop(&mut self) {
        self.0.unvalidated.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a connection was let in.
pub(super) enum Admitted {
    Slot(Slot),
    /// Handshaking from an unvalidated address, its replies held to the
    /// amplification limit.
    Unvalidated(Unvalidated, AmplificationLimit),
}
