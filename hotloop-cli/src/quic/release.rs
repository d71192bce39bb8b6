//! The memory releaser: a thread that gives the allocator's free memory
//! back to the kernel once many connections have ended.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::settings::Settings;

/// How often the server looks whether many connections have ended.
const RELEASE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Connections that ended (net) since the last look for which the server
/// gives the allocator's free memory back to the kernel.
const RELEASE_CONNECTIONS_ENDED_MIN: usize = 64;
/// Looks after such a release that release again: quinn frees an ended
/// connection's state only after its draining period (three probe timeouts).
const RELEASE_FOLLOW_UPS: u32 = 2;

/// A thread that gives the allocator's free memory back to the kernel once
/// many connections have ended (a flood of handshakes, a crowd of clients
/// gone): glibc keeps what they freed for reuse, so the resident size would
/// otherwise stay at its peak. It runs beside the workers, so the release's
/// walk of the heap holds up no connection's loop. Stopped when dropped.
pub(super) struct MemoryReleaser {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemoryReleaser {
    pub(super) fn start(settings: Arc<Settings>) -> io::Result<MemoryReleaser> {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let thread =
            std::thread::Builder::new().name("hotloop-release".into()).spawn(move || {
                let mut follow_ups = 0;
                loop {
                    let (lock, wake) = &*flag;
                    let stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let (stopped, _) = wake
                        .wait_timeout_while(stopped, RELEASE_CHECK_INTERVAL, |stopped| !*stopped)
                        .unwrap_or_else(|e| e.into_inner());
                    if *stopped {
                        return;
                    }
                    drop(stopped);
                    let open = settings.active.load(Ordering::SeqCst);
                    let peak = settings.peak.swap(open, Ordering::Relaxed).max(open);
                    if peak - open >= RELEASE_CONNECTIONS_ENDED_MIN {
                        follow_ups = RELEASE_FOLLOW_UPS;
                    } else if follow_ups == 0 {
                        continue;
                    } else {
                        follow_ups -= 1;
                    }
                    hotloop::release_free_memory();
                }
            })?;
        Ok(MemoryReleaser { stop, thread: Some(thread) })
    }
}

impl Drop for MemoryReleaser {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
