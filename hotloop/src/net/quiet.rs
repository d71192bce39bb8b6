//! [`QuietCheck`]: during a drain, tells a keep-alive connection that is
//! quiet from one whose next request is on its way but has not reached
//! its handler yet, or whose last answer has not reached its client.
//!
//! A drain closes a connection that waits for its client's next request
//! once nothing has moved for the server's quiet time
//! ([`DRAIN_IDLE_QUIET`](super::DRAIN_IDLE_QUIET)). Nothing having reached
//! the handler does not mean nothing came: a request can already have
//! left the kernel's socket without being handed on. On io_uring the
//! stream's multishot receive moves it into the buffer ring at any enter
//! that runs the ring's deferred work (an early submit during a turn),
//! and its completion is read only at the end of the turn; over TLS a
//! request record spread over several segments is read from the socket
//! a segment at a time, and no plaintext comes out until its last one.
//! Either way a peek of the socket (`MSG_PEEK`) finds it empty, and a
//! close then meets the request.
//!
//! So a look asks the kernel two things: whether bytes wait in the socket
//! (the peek), and how long ago the peer's last data arrived
//! (`TCP_INFO`'s `tcpi_last_data_recv`), which counts bytes already handed
//! on as well. Data that came after the handler last saw progress is a
//! request on its way.
//!
//! The other way, a handler's last progress is its last write, which
//! returns once the kernel has taken the bytes: to a client that reads
//! slowly, megabytes of the answer may still be unsent then, and a quiet
//! time counted from that write ran out while the client was still
//! reading, so its next request met the close. So a look also asks what
//! the client has not acknowledged (`SIOCOUTQ`): while anything has not,
//! the connection is not quiet, and once all has, its quiet time counts
//! from the last acknowledgement (`TCP_INFO`'s `tcpi_last_ack_recv`: the
//! last bytes' own, or a window update the client's reads sent after its
//! receive buffer had filled), when that came after the handler's last
//! progress. A look that finds nothing is made once more a
//! little later ([`QuietCheck::CONFIRM_AFTER`]), after at least one turn of
//! the worker's loop, so that a completion already in the ring reaches the
//! read first. The check costs up to four system calls per look, and
//! looks come only when a stopping server's connection has been quiet for
//! the quiet time: nothing on a request's path.

use std::time::{Duration, Instant};

use super::InputProbe;

/// The kernel counts the time since a connection's last data (and last
/// acknowledgement) in its ticks (1 to 10 ms), and a handler dates its
/// last progress from the loop's reading of the clock at the start of a
/// turn: data is taken as new only if it came this much after that
/// progress (an acknowledgement the same). A request's first
/// bytes that come sooner than this after the last answer, and its last
/// ones only after the quiet time, are not told from the last request
/// (a client that slow between two segments of one request is rare); a
/// turn longer than this makes the last request's bytes look new, which
/// costs that connection one more quiet time, once.
const TICK_SLACK: Duration = Duration::from_millis(20);

/// What a [`QuietCheck::look`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quiet {
    /// Bytes are on their way (in the socket, or received by the kernel
    /// since the connection's last progress): the connection is not
    /// quiet, and its quiet time starts again now.
    Arriving,
    /// The last answer is still on its way to the client (bytes it has not
    /// acknowledged: the quiet time starts again now, and `Duration::ZERO`
    /// is carried), or all of it was acknowledged only this long ago,
    /// after the connection's last progress: the client may still be
    /// reading it, and the quiet time counts from then.
    Delivering(Duration),
    /// Nothing was found: look once more at
    /// [`QuietCheck::next_look`], which lets a turn of the loop pass.
    Confirm,
    /// Nothing, twice, with no progress in between: the connection is
    /// idle and may be closed.
    Idle,
}

/// Decides, during a drain, whether a connection that has been quiet for
/// the quiet time may be closed (see the module notes): a
/// [`look`](Self::look) when the quiet time is over, and another at
/// [`next_look`](Self::next_look) until one says [`Quiet::Idle`].
///
/// Four bytes: every served connection's task keeps one (a hyper
/// connection's, beside its flags, where it takes no room of its own).
#[derive(Debug, Clone, Default)]
pub struct QuietCheck {
    /// 0 before the first look. Then when the last look was made, in
    /// milliseconds on the process's [`Millis`] clock, shifted left by
    /// one, with the low bit set if it found nothing. The next look comes
    /// no sooner than [`QuietCheck::CONFIRM_AFTER`] later, so a look that
    /// found nothing is confirmed only after a turn of the loop, and one
    /// that found bytes on their way is not repeated before they can
    /// reach the reader, however short the quiet time.
    last: u32,
}

impl QuietCheck {
    /// How long after a look the next one comes at the soonest: a timer
    /// this far ahead fires at a later turn of the worker's loop (its
    /// wheel ticks every millisecond), after the completions of the turn
    /// of the first look have been delivered.
    pub const CONFIRM_AFTER: Duration = Duration::from_millis(2);

    /// A check that has not looked yet.
    pub const fn new() -> Self {
        QuietCheck { last: 0 }
    }

    /// When the next look is due for a connection whose quiet time ends at
    /// `quiet_end`: then, or [`CONFIRM_AFTER`](Self::CONFIRM_AFTER) after
    /// the last look if that is later.
    pub fn next_look(&self, quiet_end: Instant) -> Instant {
        self.next_look_at(quiet_end, Instant::now())
    }

    /// [`next_look`](Self::next_look) as seen at `now`.
    fn next_look_at(&self, quiet_end: Instant, now: Instant) -> Instant {
        match self.last_look(now) {
            Some(at) => quiet_end.max(at + Self::CONFIRM_AFTER),
            None => quiet_end,
        }
    }

    /// Looks into the connection's socket (`probe`) once its handler has
    /// seen nothing move for `quiet_for` (at least the quiet time). On
    /// [`Quiet::Arriving`] the caller starts the quiet time again from
    /// now, on [`Quiet::Delivering`] from as long ago as it says; on
    /// [`Quiet::Confirm`] it looks again at
    /// [`next_look`](Self::next_look); on [`Quiet::Idle`] it closes. A look
    /// after progress (`quiet_for` shorter than the time since the last
    /// look) starts over, with a confirmation of its own.
    ///
    /// Where the kernel says nothing of the connection's last data (not
    /// TCP, or the socket gone), the peek decides alone; a peek that fails
    /// finds nothing, and so does a question about the output that fails.
    pub fn look(&mut self, probe: &InputProbe, quiet_for: Duration) -> Quiet {
        let found = if arriving(probe, quiet_for) {
            Some(Quiet::Arriving)
        } else {
            delivering(probe, quiet_for).map(Quiet::Delivering)
        };
        self.judge(found, quiet_for, Instant::now())
    }

    /// [`look`](Self::look)'s verdict on what it found (`None`: nothing),
    /// at `now`.
    fn judge(&mut self, found: Option<Quiet>, quiet_for: Duration, now: Instant) -> Quiet {
        let arriving = found.is_some();
        // Quiet since before the last look: nothing moved in between.
        let unmoved =
            self.last_look(now).is_some_and(|at| quiet_for >= now.saturating_duration_since(at));
        let found_nothing_before = self.last & 1 == 1;
        self.last = Millis::up(now) << 1 | u32::from(!arriving);
        match (found, found_nothing_before && unmoved) {
            (Some(found), _) => found,
            (None, true) => Quiet::Idle,
            (None, false) => Quiet::Confirm,
        }
    }

    /// When the last look was made (never before it, as seen at `now`).
    fn last_look(&self, now: Instant) -> Option<Instant> {
        (self.last != 0).then(|| now - Millis::since(self.last >> 1, now))
    }
}

/// A clock of whole milliseconds in 31 bits, from the process's first
/// look, never 0; it wraps after 24 days, far longer than a check lives
/// (a drain).
struct Millis;

impl Millis {
    /// Its values, 1 to `MOD`.
    const MOD: u32 = (1 << 31) - 1;

    fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    /// `t`, rounded up (so a look is never dated before it was made).
    fn up(t: Instant) -> u32 {
        let ns = t.saturating_duration_since(Self::epoch()).as_nanos();
        (ns.div_ceil(1_000_000) % u128::from(Self::MOD)) as u32 + 1
    }

    /// How long before `now` the reading `at` was taken, rounded down (no
    /// more than it was).
    fn since(at: u32, now: Instant) -> Duration {
        let ns = now.saturating_duration_since(Self::epoch()).as_nanos();
        let now_ms = (ns / 1_000_000 % u128::from(Self::MOD)) as u32 + 1;
        let ago = (now_ms + Self::MOD - at) % Self::MOD;
        // "Negative": `at` was rounded up into a millisecond `now` has not finished.
        if ago > Self::MOD / 2 {
            Duration::ZERO
        } else {
            Duration::from_millis(u64::from(ago))
        }
    }
}

/// True if bytes wait in the socket, or the kernel received data after
/// the handler's last progress, `quiet_for` ago.
fn arriving(probe: &InputProbe, quiet_for: Duration) -> bool {
    probe.pending().unwrap_or(false)
        || probe.since_data_received().is_ok_and(|since| data_is_new(since, quiet_for))
}

/// If the connection's output has not all reached the peer, or did only
/// after the handler's last progress (`quiet_for` ago): how long ago it
/// did (zero while it has not).
fn delivering(probe: &InputProbe, quiet_for: Duration) -> Option<Duration> {
    if probe.unacknowledged_output().is_ok_and(|queued| queued > 0) {
        return Some(Duration::ZERO);
    }
    probe.since_ack_received().ok().filter(|&since| data_is_new(since, quiet_for))
}

/// Whether data the kernel received `since_data` ago came after progress
/// `quiet_for` ago, allowing for the kernel's tick.
fn data_is_new(since_data: Duration, quiet_for: Duration) -> bool {
    since_data + TICK_SLACK < quiet_for
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_twice_a_turn_apart_is_idle_and_bytes_start_over() {
        let ms = Duration::from_millis;
        Millis::epoch();
        let t0 = Instant::now();
        let mut check = QuietCheck::new();
        assert_eq!(check.next_look(t0), t0);
        assert_eq!(check.judge(None, ms(1000), t0), Quiet::Confirm);
        let next = check.next_look_at(t0, t0 + ms(1));
        assert!(next >= t0 + QuietCheck::CONFIRM_AFTER, "{:?}", next - t0);
        assert!(next <= t0 + QuietCheck::CONFIRM_AFTER + ms(1), "{:?}", next - t0);
        assert_eq!(check.judge(None, ms(1002), t0 + ms(2)), Quiet::Idle);

        // Bytes on their way, then nothing: confirmed anew.
        let mut check = QuietCheck::new();
        assert_eq!(check.judge(None, ms(1000), t0), Quiet::Confirm);
        assert_eq!(check.judge(Some(Quiet::Arriving), ms(1002), t0 + ms(2)), Quiet::Arriving);
        // Not looked at again before a turn has passed, whatever the quiet time.
        assert!(check.next_look_at(t0, t0 + ms(3)) >= t0 + ms(2) + QuietCheck::CONFIRM_AFTER);
        assert_eq!(check.judge(None, ms(1000), t0 + ms(1002)), Quiet::Confirm);
        assert_eq!(check.judge(None, ms(1004), t0 + ms(1004)), Quiet::Idle);

        // Progress between two looks (the handler's quiet began after the
        // first): the second is a first look again.
        let mut check = QuietCheck::new();
        assert_eq!(check.judge(None, ms(1000), t0), Quiet::Confirm);
        assert_eq!(check.judge(None, ms(1), t0 + ms(5)), Quiet::Confirm);
        assert_eq!(check.judge(None, ms(8), t0 + ms(10)), Quiet::Idle);

        // An answer still on its way: said as it is, and nothing after it
        // is confirmed anew.
        let mut check = QuietCheck::new();
        let on_its_way = Quiet::Delivering(Duration::ZERO);
        assert_eq!(check.judge(Some(on_its_way), ms(1000), t0), on_its_way);
        assert_eq!(check.judge(None, ms(1000), t0 + ms(1000)), Quiet::Confirm);
        assert_eq!(check.judge(None, ms(1002), t0 + ms(1002)), Quiet::Idle);
        assert_eq!(std::mem::size_of::<QuietCheck>(), 4);
    }

    #[test]
    fn data_is_new_only_well_after_the_last_progress() {
        let ms = Duration::from_millis;
        // The last request came before the last progress (the answer).
        assert!(!data_is_new(ms(1000), ms(1000)));
        assert!(!data_is_new(ms(990), ms(1000)), "within the kernel's tick");
        // A request's first segment, read and held by the TLS layer.
        assert!(data_is_new(ms(100), ms(1000)));
        assert!(data_is_new(ms(0), ms(30)));
        // A zero quiet time finds nothing new by the clock.
        assert!(!data_is_new(ms(0), ms(0)));
    }
}
