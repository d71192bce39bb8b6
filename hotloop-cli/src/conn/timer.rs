//! [`ConnTimer`]: a connection's idle, header and send deadlines on one
//! timer; and the two futures that wait on it.

use std::future::Future;
use std::io;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use hotloop::net::{InputProbe, Quiet, QuietCheck};
use hotloop::time::Sleep;

use crate::drain;

/// A connection's deadlines (idle, header, send) on one timer that is
/// moved only when it fires: a request costs a store of the loop's clock,
/// not a timer inserted and cancelled (nginx keeps its timers the same
/// way). A write that has to wait (on io_uring, every write waits for its
/// completion) uses it too, so no timer is filed per response.
///
/// An idle wait also ends when the server stops (once the connection has
/// been quiet for [`drain::idle_quiet`], and nothing is on its way either
/// way: [`DeadlineRead::peeking`]): it checks [`drain::stopping`]
/// whenever it is polled, and the stop wakes every task, so no wrapper
/// future around each read and no registration is needed.
pub(crate) struct ConnTimer {
    /// Made at the first deadline, so a connection that never waits
    /// reads no clock for it.
    timer: Option<Sleep>,
    /// The waker of the task that last waited here (a connection's waits
    /// all come from its own task): the timer is filed in the worker's
    /// wheel with it while `timer_filed`. A wait that finds its own task's
    /// waker here and `timer_filed` set needs nothing from the wheel (the usual
    /// case: the connection's task parks again after every request).
    waker: Option<Waker>,
    timer_filed: bool,
}

impl ConnTimer {
    pub(crate) fn new() -> Self {
        ConnTimer { timer: None, waker: None, timer_filed: false }
    }

    /// Runs `read` (a connection's read, pinned by the caller) until `due`;
    /// the result is `None` when `due` passed, the peer closed, the read
    /// failed, or (`idle`: a keep-alive connection between requests) the
    /// server is stopping and the connection has been quiet for
    /// [`drain::idle_quiet`] since this wait began (or since its client
    /// acknowledged the last answer's end, if that came later; never, with
    /// no quiet time). What is ready is always
    /// taken first, so a request that arrives is answered (with
    /// `Connection: close`) rather than met by a close: the connection is
    /// closed only on a read that found nothing pending (and nothing on
    /// its way in the kernel, with [`DeadlineRead::peeking`]), and not
    /// while its client, just answered, is likely sending the next request.
    pub(crate) fn read<'a, F>(
        &'a mut self,
        read: Pin<&'a mut F>,
        due: Option<Instant>,
        idle: bool,
    ) -> DeadlineRead<'a, F> {
        if let Some(due) = due {
            self.bring_forward(due);
        }
        let idle_since = idle.then(hotloop::time::now);
        DeadlineRead { read, timer: self, due, idle_since, socket: None, check: QuietCheck::new() }
    }

    /// Runs `write` (pinned by the caller); once it has to wait, for at
    /// most `limit`.
    pub(crate) fn write<'a, W: Future>(
        &'a mut self,
        write: Pin<&'a mut W>,
        limit: Option<Duration>,
    ) -> DeadlineWrite<'a, W> {
        DeadlineWrite { write, timer: self, limit, due: None }
    }

    /// For a write that has to wait: true once it has waited `limit`
    /// (counted from its first wait, whose deadline goes in `due`);
    /// registers `cx` to be woken then otherwise. Never without a limit.
    pub(crate) fn write_timed_out(
        &mut self,
        cx: &mut std::task::Context<'_>,
        limit: Option<Duration>,
        due: &mut Option<Instant>,
    ) -> bool {
        let Some(limit) = limit else { return false };
        let due = match *due {
            Some(due) => due,
            None => {
                let at = hotloop::time::now() + limit;
                self.bring_forward(at);
                *due.insert(at)
            }
        };
        self.poll_expired(cx, due)
    }

    /// Makes the timer fire no later than `due`. Only ever moved earlier
    /// here; a later deadline is taken up when the timer fires.
    fn bring_forward(&mut self, due: Instant) {
        match &mut self.timer {
            Some(timer) if timer.deadline() > due => {
                Pin::new(timer).reset(due);
                // A reset may take the timer out of the wheel.
                self.timer_filed = false;
            }
            Some(_) => {}
            None => self.timer = Some(hotloop::time::sleep_until(due)),
        }
    }

    /// Keeps `waker` as the one this connection files; a different task's
    /// waker (the connection polled from elsewhere) is filed anew.
    fn waiting_with(&mut self, waker: &Waker) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.waker = Some(waker.clone());
            self.timer_filed = false;
        }
    }

    /// Whether `due` has passed, as far as the timer knows; registers
    /// `cx` to be woken when it fires otherwise. A timer set for an
    /// earlier deadline that has since moved on is moved to `due`.
    fn poll_expired(&mut self, cx: &mut std::task::Context<'_>, due: Instant) -> bool {
        self.waiting_with(cx.waker());
        let timer = self.timer.get_or_insert_with(|| hotloop::time::sleep_until(due));
        if self.timer_filed && hotloop::time::now() < timer.deadline() {
            return false;
        }
        let mut timer = Pin::new(timer);
        while timer.as_mut().poll(cx).is_ready() {
            self.timer_filed = false;
            // The clock itself as well as the turn's reading: a sleep is
            // ready once the clock has passed its deadline, which may still
            // lie ahead of the turn's reading (by up to a wheel tick); by
            // the turn's reading alone the same deadline would be filed
            // again, be ready again, and this loop spin inside one poll,
            // taking the worker with it.
            if hotloop::time::now().max(Instant::now()) >= due {
                return true;
            }
            timer.as_mut().reset(due);
        }
        // Pending: the timer is in the wheel with this task's waker.
        self.timer_filed = true;
        false
    }
}

/// The future of [`ConnTimer::read`]: one poll function over the read,
/// the stop and the timer (an `async fn` here would add a state machine
/// of its own to every request's path).
pub(crate) struct DeadlineRead<'a, F> {
    read: Pin<&'a mut F>,
    timer: &'a mut ConnTimer,
    due: Option<Instant>,
    /// For an idle wait, when it began (the connection's last progress).
    idle_since: Option<Instant>,
    /// A probe of the connection's socket, used before an idle wait ends
    /// for a stop (see [`DeadlineRead::peeking`]).
    socket: Option<InputProbe>,
    /// What the looks into `socket` found so far.
    check: QuietCheck,
}

impl<F> DeadlineRead<'_, F> {
    /// Before an idle wait ends for a stop, looks into the socket itself
    /// ([`QuietCheck`]): bytes there that the read has not seen yet (on
    /// io_uring they come with a completion a loop turn later), or bytes
    /// the kernel received since the wait began that have not reached it
    /// (in io_uring's buffer ring; a TLS record's first segments, which
    /// give no plaintext until the rest comes), mean the next request is
    /// arriving, and the wait goes on. So do bytes of the last answer the
    /// client has not acknowledged: the last write returned once the
    /// kernel took them, and a client reading slowly is still reading; the
    /// quiet time then counts from its acknowledgement of the last byte.
    pub(crate) fn peeking(mut self, socket: InputProbe) -> Self {
        self.socket = Some(socket);
        self
    }

    /// During a stop: true once the idle wait should end, the connection
    /// quiet for [`drain::idle_quiet`] since `since` and, with a socket to
    /// look into, its [`QuietCheck`] saying [`Quiet::Idle`]. Otherwise the
    /// timer is filed for the next look. Never without a quiet time (at or
    /// above the drain timeout: the drain's deadline ends the wait).
    fn quiet_over(&mut self, cx: &mut std::task::Context<'_>, mut since: Instant) -> bool {
        let Some(quiet) = drain::idle_quiet() else { return false };
        let mut looked = false;
        loop {
            // Never past the read's own deadline: the shared timer, moved
            // to a later look, would hide it.
            let at = self.check.next_look(since + quiet);
            let at = self.due.map_or(at, |due| at.min(due));
            self.timer.bring_forward(at);
            // Once per poll: bytes found on their way reach the read only
            // after a return to the loop.
            if !self.timer.poll_expired(cx, at) || looked {
                return false;
            }
            looked = true;
            let Some(socket) = &self.socket else { return true };
            // The clock itself: the turn's reading may lie behind it.
            let now = Instant::now();
            match self.check.look(socket, now.saturating_duration_since(since)) {
                Quiet::Idle => return true,
                // Not quiet after all: the read wakes this task when the
                // bytes reach it, and the quiet time starts again.
                Quiet::Arriving => {
                    since = now;
                    self.idle_since = Some(now);
                }
                // The last answer is still on its way to the client, or got
                // there `ago`: quiet from then.
                Quiet::Delivering(ago) => {
                    since = now.checked_sub(ago).unwrap_or(now).max(since);
                    self.idle_since = Some(since);
                }
                Quiet::Confirm => {}
            }
        }
    }
}

impl<F, B> Future for DeadlineRead<'_, F>
where
    F: Future<Output = io::Result<B>>,
    B: Deref<Target = [u8]>,
{
    type Output = Option<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin` (`Sleep` included): no pin projection needed.
        let this = &mut *self;
        if let Poll::Ready(r) = this.read.as_mut().poll(cx) {
            return Poll::Ready(r.ok().filter(|b| !b.is_empty()));
        }
        if let Some(since) = this.idle_since.filter(|_| drain::stopping()) {
            if this.quiet_over(cx, since) {
                return Poll::Ready(None);
            }
        }
        match this.due {
            Some(due) if this.timer.poll_expired(cx, due) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

/// The future of [`ConnTimer::write`]: the write, and once it has had to
/// wait, the connection's timer. `Err(TimedOut)` when `limit` passed with
/// the write still waiting.
pub(crate) struct DeadlineWrite<'a, W> {
    write: Pin<&'a mut W>,
    timer: &'a mut ConnTimer,
    limit: Option<Duration>,
    /// When the wait runs out, set at the first poll that had to wait.
    due: Option<Instant>,
}

impl<W: Future> Future for DeadlineWrite<'_, W> {
    type Output = io::Result<W::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin`: no pin projection needed.
        let this = &mut *self;
        if let Poll::Ready(out) = this.write.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if this.timer.write_timed_out(cx, this.limit, &mut this.due) {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        Poll::Pending
    }
}
