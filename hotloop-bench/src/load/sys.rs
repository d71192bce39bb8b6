//! The few process and socket settings that need raw system calls.

use std::io;
use std::os::fd::AsRawFd;

/// Raises the soft open-file limit to the hard limit and returns the new
/// soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit for getrlimit(2) to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: `raised` is a valid rlimit that setrlimit(2) only reads.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(lim.rlim_cur)
}

/// Restricts the calling thread to one CPU with sched_setaffinity(2).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--pin {cpu}: CPU numbers go up to {}", libc::CPU_SETSIZE - 1),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array for which all zeroes is the
    // empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` was checked above to be below CPU_SETSIZE, the number of
    // bits in `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 means the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("--pin {cpu}: sched_setaffinity: {e}")));
    }
    Ok(())
}

/// Sets IP_BIND_ADDRESS_NO_PORT, so that binding a source address before
/// connect(2) leaves the port to be picked at connect time by the whole
/// four-tuple rather than reserved at bind time (see ip(7)).
pub fn set_bind_address_no_port(sock: &impl AsRawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: the fd is an open socket owned by `sock`; `one` is a c_int
    // that lives across the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns on the kernel's software receive timestamps (`SO_TIMESTAMPNS`,
/// socket(7)): each read through [`recv_timestamped`] then says when the
/// last segment it returned reached the socket, so the generator can tell
/// the server's time from its own lateness in reading.
pub fn enable_rx_timestamps(sock: &impl AsRawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: the fd is an open socket owned by `sock`; `one` is a c_int
    // that lives across the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads into `buf` with recvmsg(2). Returns the bytes read and, when the
/// socket has receive timestamps on ([`enable_rx_timestamps`]), the time
/// (`CLOCK_REALTIME`, since the epoch) at which the last segment read
/// reached the socket; TCP reports the newest segment of those a read
/// consumed.
pub fn recv_timestamped(
    sock: &impl AsRawFd,
    buf: &mut [u8],
) -> io::Result<(usize, Option<std::time::Duration>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for one `SCM_TIMESTAMPNS` message (a header and a timespec, 32
    // bytes on 64-bit Linux) and then some; u64s, so it is aligned for
    // `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data for which all zeroes is a valid value
    // (no name, no iovecs, no control buffer).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: the fd is an open socket owned by `sock`; `msg` points at one
    // iovec covering `buf` and at `control`, all of which outlive the call,
    // with their lengths.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: `msg` was filled by recvmsg(2) above, so its control fields
    // describe a valid (possibly empty) list inside `control`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR and CMSG_NXTHDR return either null or a
        // header wholly inside `control`, which is still borrowed by `msg`.
        let header = unsafe { &*cmsg };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_TIMESTAMPNS {
            // SAFETY: an SCM_TIMESTAMPNS message carries one timespec right
            // after its header, inside `control`; read unaligned, since the
            // data's alignment is the kernel's.
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
            stamp = Some(std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
        }
        // SAFETY: `cmsg` is a header of `msg`'s list (see above).
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok((n as usize, stamp))
}

/// How many segments the kernel has retransmitted on this TCP socket so
/// far (`tcpi_total_retrans` of `TCP_INFO`, tcp(7)). Over loopback nothing
/// is lost on a wire: a retransmission means the kernel dropped a segment
/// on its way, such as when a CPU's backlog of received packets was full.
pub fn tcp_total_retrans(sock: &impl AsRawFd) -> io::Result<u32> {
    // SAFETY: tcp_info is plain data for which all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the fd is an open socket owned by `sock`; `info` is writable
    // for `len` bytes, and getsockopt(2) writes at most that many and
    // stores how many in `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.tcpi_total_retrans)
}

/// CPU seconds (user and system) this process has used.
pub fn cpu_seconds_self() -> f64 {
    // SAFETY: rusage is plain data and all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(2) writes only into `usage`, which lives for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// A one-shot `timerfd` on `CLOCK_MONOTONIC`: the open-loop schedule's
/// alarm.
///
/// epoll_wait(2) takes its timeout in whole milliseconds, so a generator
/// that slept on it alone would send an open-loop run's requests in bursts
/// at millisecond edges (50 at once at 50,000 per second), and every
/// server's latency would include waiting behind the rest of its burst. A
/// timerfd expires at the nanosecond asked for (with no timer slack) and
/// wakes the same epoll.
pub struct Alarm {
    fd: std::os::fd::OwnedFd,
}

impl Alarm {
    /// Creates a disarmed, non-blocking alarm.
    pub fn new() -> io::Result<Alarm> {
        // SAFETY: timerfd_create(2) takes no pointers; a non-negative result
        // is a new descriptor that nothing else owns.
        let fd = unsafe {
            libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created above and is owned by no one else.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Alarm { fd })
    }

    /// Arms the alarm to expire once, `after` from now (at least 1 ns: a zero
    /// value would disarm it).
    pub fn arm(&self, after: std::time::Duration) -> io::Result<()> {
        let after = after.max(std::time::Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the fd is the timerfd this alarm owns; `spec` is a valid
        // itimerspec that timerfd_settime(2) only reads; the old value is not
        // asked for (null).
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads and returns the expiry count (0 if it has not expired), so
    /// the next expiry is a new event.
    pub fn clear(&self) -> u64 {
        let mut expiries = [0u8; 8];
        // SAFETY: the fd is the timerfd this alarm owns; `expiries` is 8
        // writable bytes, the size a timerfd read needs.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), expiries.as_mut_ptr().cast(), 8) };
        if n == 8 {
            u64::from_ne_bytes(expiries)
        } else {
            0
        }
    }
}

impl AsRawFd for Alarm {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_connection_over_loopback_retransmits_nothing() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).unwrap();
        assert_eq!(tcp_total_retrans(&client).unwrap(), 0);
        let file = tempfile_like();
        assert!(tcp_total_retrans(&file).is_err(), "not a TCP socket");
    }

    /// Some descriptor that is not a socket.
    fn tempfile_like() -> std::fs::File {
        std::fs::File::open("/proc/self/stat").unwrap()
    }

    #[test]
    fn a_timestamped_read_says_when_the_bytes_arrived() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut buf = [0u8; 16];
        // Without the option a read carries no time.
        client.write_all(b"one").unwrap();
        let (n, stamp) = recv_timestamped(&server, &mut buf).unwrap();
        assert_eq!((n, stamp), (3, None));
        enable_rx_timestamps(&server).unwrap();
        // The kernel turns its timestamps on from a work queue when the
        // first socket asks (net_enable_timestamp): until then segments
        // arrive unstamped, so try a few times.
        let since_epoch =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        let mut stamped = None;
        for _ in 0..100 {
            let before = since_epoch();
            client.write_all(b"two").unwrap();
            std::thread::sleep(Duration::from_millis(30));
            let (n, stamp) = recv_timestamped(&server, &mut buf).unwrap();
            assert_eq!(&buf[..n], b"two");
            if let Some(stamp) = stamp {
                stamped = Some((before, stamp, since_epoch()));
                break;
            }
        }
        let (before, stamp, after) = stamped.expect("a timestamp once SO_TIMESTAMPNS is on");
        // The bytes arrived at the write, well before the read 30 ms later.
        assert!(stamp >= before && stamp + Duration::from_millis(20) <= after, "{stamp:?}");
    }

    #[test]
    fn an_alarm_expires_once_and_a_cleared_one_reads_zero() {
        let alarm = Alarm::new().unwrap();
        assert_eq!(alarm.clear(), 0, "a disarmed alarm has not expired");
        alarm.arm(Duration::from_micros(200)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(alarm.clear(), 1);
        assert_eq!(alarm.clear(), 0, "one-shot: no second expiry");
        alarm.arm(Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(alarm.clear(), 1, "a zero delay still arms (1 ns), it does not disarm");
    }
}
