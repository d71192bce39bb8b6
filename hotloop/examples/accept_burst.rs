//! A burst of short connections against a `net::serve` echo server on
//! io_uring, with multishot accept and with single-shot accept, side by side.
//!
//! Each run starts a fresh server process (so the two modes never share a
//! descriptor table or counters), then opens `--clients` connections at once
//! from a client runtime in this process; each client sends `--size` bytes,
//! reads them back and closes. The time until the last client finishes is
//! reported per run, and the median per mode.
//!
//! ```text
//! cargo run --release -p hotloop --example accept_burst -- [--clients 10000] [--size 128] [--runs 5] [--server-workers 1]
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hotloop::net::AcceptMode;
use hotloop::net::{serve, ListenerOptions, TcpStream};
use hotloop::{DriverKind, Runtime};

struct Args {
    clients: usize,
    size: usize,
    runs: usize,
    server_workers: usize,
}

fn parse_args() -> (Args, Option<AcceptMode>) {
    let mut args = Args { clients: 10_000, size: 128, runs: 5, server_workers: 1 };
    let mut serve_mode = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--clients" => args.clients = value().parse().expect("--clients N"),
            "--size" => args.size = value().parse().expect("--size BYTES"),
            "--runs" => args.runs = value().parse().expect("--runs N"),
            "--server-workers" => {
                args.server_workers = value().parse().expect("--server-workers N")
            }
            "--serve" => serve_mode = Some(value().parse().expect("--serve multishot|single")),
            other => panic!("unknown argument {other}"),
        }
    }
    (args, serve_mode)
}

/// The server process: echo on io_uring, print the port, answer `stats` on stdin.
fn run_server(mode: AcceptMode, workers: usize) {
    hotloop::raise_nofile_limit().expect("raise the descriptor limit");
    let rt = Runtime::builder()
        .workers(workers)
        .driver(DriverKind::Uring)
        .build()
        .expect("an io_uring runtime");
    let options = ListenerOptions { accept_mode: mode, ..ListenerOptions::default() };
    let server = serve(rt.handle(), "127.0.0.1:0", options, |stream| async move {
        let mut buf = Vec::with_capacity(4096);
        loop {
            let (res, b) = stream.read_owned(buf).await;
            buf = b;
            match res {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let (res, b) = stream.write_all_owned(buf).await;
            buf = b;
            if res.is_err() {
                return;
            }
        }
    })
    .expect("serve");
    println!("{}", server.local_addr());
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap_or_default().trim() == "stats" {
            let s = rt.stats().total;
            println!(
                "cpu_ms={:.1} accepted={} accept_wakeups={} max_accepted_per_wakeup={} multishot_rearms={} \
                 uring_enters={} submissions={} completions={} cq_overflows={}",
                cpu_time().as_secs_f64() * 1e3,
                s.accepted,
                s.accept_wakeups,
                s.max_accepted_per_wakeup,
                s.multishot_rearms,
                s.uring_enters,
                s.submissions,
                s.completions,
                s.cq_overflows
            );
            std::io::stdout().flush().unwrap();
        }
    }
    server.stop();
}

/// User plus system CPU time of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the live struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    out: BufReader<std::process::ChildStdout>,
}

impl ServerProcess {
    fn start(mode: AcceptMode, workers: usize) -> ServerProcess {
        let mode = mode_name(mode);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--serve", mode, "--server-workers", &workers.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line.trim().parse().expect("the server prints its address");
        ServerProcess { child, addr, out }
    }

    fn stats(&mut self) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"stats\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn stop(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Opens `clients` connections at once; each echoes `size` bytes. Returns
/// the time until the last one finished and how many failed.
fn burst(client_rt: &Runtime, addr: SocketAddr, clients: usize, size: usize) -> (Duration, usize) {
    client_rt.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                hotloop::spawn(async move {
                    let stream = TcpStream::connect(addr).await?;
                    let (res, _) = stream.write_all_owned(vec![7u8; size]).await;
                    res?;
                    let mut got = 0;
                    let mut buf = Vec::with_capacity(size);
                    while got < size {
                        let (res, b) = stream.read_owned(buf).await;
                        buf = b;
                        match res? {
                            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                            n => got += n,
                        }
                    }
                    reset_on_close(&stream);
                    Ok::<(), std::io::Error>(())
                })
            })
            .collect();
        let mut failed = 0;
        for t in tasks {
            if !matches!(t.await, Ok(Ok(()))) {
                failed += 1;
            }
        }
        (start.elapsed(), failed)
    })
}

/// Makes closing send a reset (`SO_LINGER` 0): without it every run leaves
/// its clients' ports in TIME_WAIT, and the next run's `connect(2)` calls
/// spend their time searching for free ports.
fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: passes a live `linger` and its exact size for the stream's open descriptor.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

fn mode_name(mode: AcceptMode) -> &'static str {
    match mode {
        AcceptMode::Multishot => "multishot",
        AcceptMode::Single => "single",
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let (args, serve_mode) = parse_args();
    if let Some(mode) = serve_mode {
        run_server(mode, args.server_workers);
        return;
    }
    if let Err(why) = hotloop::runtime::uring_available() {
        eprintln!("io_uring is not available here: {why}");
        return;
    }
    hotloop::raise_nofile_limit().expect("raise the descriptor limit");
    // The clients run on epoll in this process, the same for both modes.
    let client_rt =
        Runtime::builder().workers(1).driver(DriverKind::Epoll).build().expect("client runtime");
    println!(
        "{} clients x {} B echo, {} runs per mode, server: net::serve on io_uring, {} worker(s)",
        args.clients, args.size, args.runs, args.server_workers
    );
    let modes = [AcceptMode::Multishot, AcceptMode::Single];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); modes.len()];
    let mut cpu: Vec<Vec<Duration>> = vec![Vec::new(); modes.len()];
    for run in 0..args.runs {
        // Alternate the modes so drift in the machine hits both alike.
        for (i, &mode) in modes.iter().enumerate() {
            let mut server = ServerProcess::start(mode, args.server_workers);
            let (elapsed, failed) = burst(&client_rt, server.addr, args.clients, args.size);
            let stats = server.stats();
            server.stop();
            println!(
                "run {run} {:<9} {:>8.2} ms  failed={failed}  {stats}",
                mode_name(mode),
                elapsed.as_secs_f64() * 1e3
            );
            times[i].push(elapsed);
            let cpu_ms: f64 = stats
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("cpu_ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            cpu[i].push(Duration::from_secs_f64(cpu_ms / 1e3));
        }
    }
    for (i, mode) in modes.iter().enumerate() {
        let m = median(&mut times[i]);
        let c = median(&mut cpu[i]);
        println!(
            "median {:<9} {:>8.2} ms wall, {:>7.1} ms server CPU",
            mode_name(*mode),
            m.as_secs_f64() * 1e3,
            c.as_secs_f64() * 1e3
        );
    }
}
