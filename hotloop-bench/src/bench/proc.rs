//! Starting, watching and stopping the processes a benchmark runs.
//!
//! Every process the bench starts is owned by a [`Child`], which stops it by
//! pid when dropped, so an error or a panic in the orchestrator never leaves
//! a server running. Every wait is bounded.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped process gets between SIGTERM and SIGKILL.
pub const STOP_GRACE_MS: u64 = 2_000;

/// How often the bench checks a process or a port it waits on.
const POLL_INTERVAL_MS: u64 = 10;

/// A process the bench started; SIGTERM, then SIGKILL, when dropped.
#[derive(Debug)]
pub struct Child {
    name: String,
    inner: std::process::Child,
}

impl Child {
    /// Starts `cmd` pinned to `cpus` (none: unpinned), stdout and stderr
    /// into `log`, stdin closed.
    pub fn spawn(name: &str, mut cmd: Command, cpus: &[usize], log: &Path) -> io::Result<Child> {
        let out = File::create(log)?;
        cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        prepare_command(&mut cmd, cpus);
        let inner =
            cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("start {name}: {e}")))?;
        Ok(Child { name: name.to_string(), inner })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the process, if it is still
    /// running: a busy-polling server is held this way while another one is
    /// measured, so it does not take the CPU they share.
    pub fn set_stopped(&mut self, stopped: bool) {
        if self.exited().is_none() {
            send_signal(self.pid(), if stopped { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// The name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.inner.try_wait().ok().flatten()
    }

    /// Waits until the process ends or `timeout` passes; kills it then.
    /// Returns the status and whether it had to be killed.
    pub fn wait_bounded(&mut self, timeout: Duration) -> io::Result<(ExitStatus, bool)> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.inner.try_wait()? {
                return Ok((status, false));
            }
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
        self.stop();
        Ok((self.inner.wait()?, true))
    }

    /// SIGTERM, a bounded wait, then SIGKILL; reaps the process.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        send_signal(self.pid(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_millis(STOP_GRACE_MS);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
        send_signal(self.pid(), libc::SIGKILL);
        let _ = self.inner.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop();
    }
}

fn send_signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions. The pid belongs to
    // a child of ours that has not been reaped (callers check `exited` first),
    // so it cannot have been reused by an unrelated process.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// The prefix of the variables hotloop reads its settings from
/// (`HOTLOOP_DRIVER`, `HOTLOOP_URING_*`, ...).
pub const HOTLOOP_VAR_PREFIX: &str = "HOTLOOP_";

/// The `HOTLOOP_*` names among `parent` (this process's environment) that
/// a child must not inherit: all but those in `set`, which the child's
/// command sets (or removes) itself. A row names its configuration; a
/// variable left in the shell that started the bench would change it
/// unseen (`HOTLOOP_DRIVER` overrides `--driver`).
pub fn hotloop_vars_to_clear(
    parent: impl IntoIterator<Item = OsString>,
    set: &[&OsStr],
) -> Vec<OsString> {
    parent
        .into_iter()
        .filter(|k| k.as_bytes().starts_with(HOTLOOP_VAR_PREFIX.as_bytes()))
        .filter(|k| !set.contains(&k.as_os_str()))
        .collect()
}

/// Makes `cmd`'s process run only on `cpus` (like `taskset -c`; none:
/// unpinned), without the `HOTLOOP_*` variables it does not set itself,
/// and receive SIGTERM if the bench dies without stopping it.
fn prepare_command(cmd: &mut Command, cpus: &[usize]) {
    let set: Vec<&OsStr> = cmd.get_envs().map(|(k, _)| k).collect();
    let clear = hotloop_vars_to_clear(std::env::vars_os().map(|(k, _)| k), &set);
    for name in clear {
        cmd.env_remove(name);
    }
    // SAFETY: cpu_set_t is plain data and all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE, so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let pin = !cpus.is_empty();
    // SAFETY: the closure runs between fork and exec, where only
    // async-signal-safe calls are allowed; it makes two system calls,
    // prctl(2) and sched_setaffinity(2), on data built before the fork, and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // The parent-death signal covers a bench killed by SIGKILL, where
            // no destructor runs. It fires when the spawning thread exits;
            // the bench spawns from its main thread only.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if pin && libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `cmd` to completion within `timeout`, killing it by pid after that,
/// and returns its status and standard output. Standard error goes to `log`.
pub fn run_bounded(
    name: &str,
    mut cmd: Command,
    cpus: &[usize],
    log: &Path,
    timeout: Duration,
) -> io::Result<(ExitStatus, String)> {
    let err = File::create(log)?;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(err);
    prepare_command(&mut cmd, cpus);
    let inner = cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("start {name}: {e}")))?;
    let mut child = Child { name: name.to_string(), inner };
    let mut stdout = child.inner.stdout.take().expect("stdout is piped");
    // Read on a thread so a chatty child cannot block on a full pipe.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let (status, killed) = child.wait_bounded(timeout)?;
    let text = reader.join().unwrap_or_default();
    if killed {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{name} did not finish within {} s and was killed", timeout.as_secs()),
        ));
    }
    Ok((status, text))
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `addr` accepts a connection or `child` exits, within `timeout`.
pub fn wait_accepting(child: &mut Child, addr: SocketAddr, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.exited() {
            return Err(io::Error::other(format!("{} exited at start ({status})", child.name())));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} did not accept on {addr} within {} ms",
                    child.name(),
                    timeout.as_millis()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

/// A process's CPU time so far, and the finest step the clock it was read
/// from takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuTime {
    /// CPU seconds, user and system, every thread.
    pub seconds: f64,
    /// The clock's step in seconds: a difference of two readings is known
    /// to within this.
    pub resolution_s: f64,
}

impl CpuTime {
    /// The sum of two processes' readings (a server and its children): as
    /// coarse as the coarser clock.
    pub fn plus(self, other: CpuTime) -> CpuTime {
        CpuTime {
            seconds: self.seconds + other.seconds,
            resolution_s: self.resolution_s.max(other.resolution_s),
        }
    }
}

/// The step of the nanosecond CPU clocks (the process clock and
/// `schedstat`), rounded up to a microsecond: finer than any figure the
/// bench prints from them.
pub const FINE_CPU_RESOLUTION_S: f64 = 1e-6;

/// CPU time process `pid` has used, from the finest clock that answers: its
/// process CPU clock (`clock_getcpuclockid(3)`: every thread, those that
/// have ended included, in nanoseconds); else the sum of its threads'
/// `/proc/PID/task/*/schedstat` (nanoseconds, live threads); else `utime +
/// stime` from `/proc/PID/stat` in clock ticks (10 ms here).
pub fn cpu_time(pid: u32) -> io::Result<CpuTime> {
    if let Some(seconds) = process_clock_seconds(pid) {
        return Ok(CpuTime { seconds, resolution_s: FINE_CPU_RESOLUTION_S });
    }
    if let Ok(ns) = schedstat_run_ns(pid) {
        return Ok(CpuTime { seconds: ns as f64 / 1e9, resolution_s: FINE_CPU_RESOLUTION_S });
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = parse_stat_cpu_ticks(&stat)
        .ok_or_else(|| io::Error::other(format!("unexpected /proc/{pid}/stat: {stat}")))?;
    let per_second = clock_ticks_per_second();
    Ok(CpuTime { seconds: ticks as f64 / per_second, resolution_s: 1.0 / per_second })
}

/// `pid`'s process CPU clock, in seconds, if the kernel gives it.
fn process_clock_seconds(pid: u32) -> Option<f64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid(3) writes one clockid_t through a valid
    // pointer to a local.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    // SAFETY: timespec is plain data and all zeroes is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime(2) writes one timespec through a valid pointer
    // to a local; an invalid clock (the process ended) is an error return.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// Nanoseconds on a CPU of every live thread of `pid` (the first field of
/// each `/proc/PID/task/TID/schedstat`).
pub fn schedstat_run_ns(pid: u32) -> io::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread that ended between the listing and the read counts as nothing.
        let Ok(text) = std::fs::read_to_string(task?.path().join("schedstat")) else { continue };
        total += parse_schedstat_run_ns(&text).unwrap_or(0);
    }
    Ok(total)
}

/// The time on a CPU, in nanoseconds, from a `schedstat` line (its first
/// field; the second is the time spent waiting on a run queue).
pub fn parse_schedstat_run_ns(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().next()?.parse().ok()
}

/// `pid` and its child processes (from `/proc/PID/task/TID/children`,
/// proc(5)): nginx with more than one worker runs them as children of its
/// master, and their CPU time counts only while they run.
pub fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return pids };
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("children")) else { continue };
        pids.extend(text.split_ascii_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    pids
}

/// Seconds process `pid`'s threads have spent waiting on a run queue for a
/// CPU (the second field of each `/proc/PID/task/TID/schedstat`): on a
/// shared machine, the time the process was ready to run but another
/// process had its CPU.
pub fn run_queue_wait_seconds(pid: u32) -> io::Result<f64> {
    let mut total_ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread that ended between the listing and the read counts as nothing.
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        total_ns += text.split_ascii_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    }
    Ok(total_ns as f64 / 1e9)
}

/// The kernel's TCP extension counters (`TcpExt` in `/proc/net/netstat`),
/// such as `ListenOverflows` (a connection that found its listener's accept
/// queue full, whose handshake the kernel dropped) and `ListenDrops`. They
/// count for the whole network namespace, not one process.
pub fn tcp_ext_counters() -> io::Result<BTreeMap<String, u64>> {
    Ok(parse_tcp_ext(&std::fs::read_to_string("/proc/net/netstat")?))
}

/// The `TcpExt` pair of lines of a `/proc/net/netstat` text: a line of
/// names, then a line of values.
pub fn parse_tcp_ext(text: &str) -> BTreeMap<String, u64> {
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return BTreeMap::new();
    };
    names
        .split_ascii_whitespace()
        .zip(values.split_ascii_whitespace())
        .skip(1)
        .filter_map(|(n, v)| Some((n.to_string(), v.parse().ok()?)))
        .collect()
}

/// Packets the kernel dropped because a CPU's backlog of received packets
/// was full, summed over the CPUs (the second column of
/// `/proc/net/softnet_stat`, in hex; `net.core.netdev_max_backlog` is the
/// backlog's size). Over loopback every packet a process sends passes
/// through its own CPU's backlog.
pub fn softnet_dropped() -> io::Result<u64> {
    Ok(parse_softnet_dropped(&std::fs::read_to_string("/proc/net/softnet_stat")?))
}

/// The dropped column of a `/proc/net/softnet_stat` text, summed.
pub fn parse_softnet_dropped(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_ascii_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

/// utime + stime from a `/proc/PID/stat` line, in clock ticks.
///
/// The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`; utime and stime are fields 14 and 15 (proc(5)).
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // After ")" come field 3 (state) onwards: utime is the 12th of those.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second, the unit of `/proc` CPU times.
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf(3) only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data and all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, so the bit is inside `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Sends `GET path` to `addr` and returns the response body, within `timeout`.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<String> {
    use std::io::Write;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) =
        text.split_once("\r\n\r\n").ok_or_else(|| io::Error::other("no HTTP response head"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(io::Error::other(format!("GET {path}: {}", head.lines().next().unwrap_or(""))));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_ext_counters_pair_names_with_values() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                    TcpExt: 3 120 121\n\
                    IpExt: InNoRoutes\nIpExt: 0\n";
        let c = parse_tcp_ext(text);
        assert_eq!(c["ListenOverflows"], 120);
        assert_eq!(c["ListenDrops"], 121);
        assert_eq!(c.len(), 3);
        assert!(parse_tcp_ext("").is_empty());
        // This machine's own file has the counter the storm reads.
        assert!(tcp_ext_counters().unwrap().contains_key("ListenOverflows"));
    }

    #[test]
    fn softnet_drops_are_summed_over_the_cpus() {
        let text = "00b2284f 00000000 00000000 00000000\n00b6e99c 00002592 00000001 00000000\n";
        assert_eq!(parse_softnet_dropped(text), 0x2592);
        assert!(softnet_dropped().is_ok());
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "1234 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0 3 0 99 0 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(267));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn schedstat_gives_nanoseconds_on_a_cpu() {
        assert_eq!(parse_schedstat_run_ns("210582534 1234 17\n"), Some(210_582_534));
        assert_eq!(parse_schedstat_run_ns(""), None);
        assert_eq!(parse_schedstat_run_ns("x 1 2"), None);
        assert!(schedstat_run_ns(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn cpu_time_resolves_a_few_milliseconds_of_work() {
        // 3 ms of work: a third of a clock tick, which /proc/PID/stat would
        // show as 0 or 1 tick (10 ms). The process clock sees it.
        let pid = std::process::id();
        let before = cpu_time(pid).unwrap();
        assert!(before.resolution_s <= FINE_CPU_RESOLUTION_S, "{before:?}");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(3) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu_time(pid).unwrap();
        let used = after.seconds - before.seconds;
        // Spun 3 ms of wall time; the CPU time is at most that plus the
        // other test threads', and on a busy host at least a part of it.
        assert!(used > 0.000_1, "{before:?} {after:?}");
        let sum = before.plus(CpuTime { seconds: 1.0, resolution_s: 0.01 });
        assert_eq!(sum.resolution_s, 0.01);
    }

    #[test]
    fn only_unset_hotloop_variables_are_cleared() {
        let parent: Vec<OsString> =
            ["PATH", "HOTLOOP_DRIVER", "HOTLOOP_URING_SEND_ZC", "XHOTLOOP_A"]
                .into_iter()
                .map(OsString::from)
                .collect();
        let set = [OsStr::new("HOTLOOP_URING_SEND_ZC")];
        assert_eq!(hotloop_vars_to_clear(parent, &set), vec![OsString::from("HOTLOOP_DRIVER")]);
    }

    #[test]
    fn a_child_does_not_inherit_the_benchs_hotloop_variables() {
        let dir = super::super::TestDir::new("proc-env");
        // The bench's environment, as a shell may leave it.
        std::env::set_var("HOTLOOP_BENCH_ENV_TEST", "uring");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "env | grep ^HOTLOOP_ | sort"]);
        cmd.env("HOTLOOP_ROW_SETS", "1");
        let (status, out) =
            run_bounded("env", cmd, &[], &dir.path().join("env.log"), Duration::from_secs(10))
                .unwrap();
        std::env::remove_var("HOTLOOP_BENCH_ENV_TEST");
        assert!(status.success());
        assert_eq!(out, "HOTLOOP_ROW_SETS=1\n");
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(cpu_time(std::process::id()).unwrap().seconds >= 0.0);
        assert_eq!(with_children(std::process::id())[0], std::process::id());
        assert!(!allowed_cpus().is_empty());
    }

    #[test]
    fn a_child_that_overstays_is_killed() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let dir = super::super::TestDir::new("proc-test");
        let started = Instant::now();
        let err = run_bounded(
            "sleep",
            cmd,
            &[],
            &dir.path().join("sleep.log"),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
