//! What a connection waits for between reads ([`Awaiting`]), and the
//! deadline that follows from it.

use std::time::{Duration, Instant};

/// What an HTTP connection waits for when it reads: its next request
/// (idle, between requests), or the rest of a request head, which has a
/// deadline of its own unless there is no header timeout. 16 bytes, as an
/// `Option<Instant>`: the variant takes a spare value of the instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaiting {
    /// The next request: only the idle timeout applies, and a stop may
    /// end the wait.
    NextRequest,
    /// A request head (the connection's first, or one begun), due by this
    /// deadline; `None` without a header timeout.
    Head(Option<Instant>),
}

impl Awaiting {
    /// A head, from now: due after `header_timeout` (`None`: never).
    pub(crate) fn head(header_timeout: Option<Duration>) -> Awaiting {
        Awaiting::Head(header_timeout.map(|t| hotloop::time::now() + t))
    }

    /// Waiting for the next request between requests.
    pub(crate) fn is_idle(self) -> bool {
        self == Awaiting::NextRequest
    }

    /// When a read that starts now gives up: the head's deadline or the
    /// idle timeout from now, whichever comes first (`None`: never).
    pub(crate) fn deadline(self, idle_timeout: Option<Duration>) -> Option<Instant> {
        let head = match self {
            Awaiting::Head(due) => due,
            Awaiting::NextRequest => None,
        };
        let idle = idle_timeout.map(|t| hotloop::time::now() + t);
        match (head, idle) {
            (Some(h), Some(i)) => Some(h.min(i)),
            (h, i) => h.or(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_as_small_as_an_optional_instant() {
        assert_eq!(std::mem::size_of::<Awaiting>(), std::mem::size_of::<Option<Instant>>());
    }
}
