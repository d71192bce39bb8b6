//! The servers a scenario measures, and how each one is started.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::proc::{self, Child};
use super::{Ctx, SERVER_START_TIMEOUT_MS, STATS_TIMEOUT_MS};

/// What the server is asked to do per request.
#[derive(Debug, Clone)]
pub struct Workload {
    /// `echo`, `http` or `hyper` (an HTTP server built on hyper).
    pub proto: String,
    /// HTTP response body bytes.
    pub body_size: usize,
    /// CPU microseconds spent per request.
    pub work_us: u64,
}

impl Workload {
    /// What the load generator speaks to this workload's servers.
    pub fn load_proto(&self) -> &str {
        match self.proto.as_str() {
            "hyper" => "http",
            other => other,
        }
    }
}

/// One server configuration.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// hotloop, tokio, monoio, floor, nginx, haproxy or h2o.
    pub server: String,
    /// The configuration shown beside the server name.
    pub config: String,
    /// How to start it.
    pub kind: ServerKind,
}

/// How a server is started.
#[derive(Debug, Clone)]
pub enum ServerKind {
    /// `hotloop serve PROTO` with these extra arguments, and these
    /// variables added to its environment.
    Serve(Vec<String>, Vec<(String, String)>),
    /// `hotloop proxy` in front of `hotloop serve http`, with the busy
    /// polling setting for the proxy (or the backend, if the proxy has no
    /// such option: then the row is relabelled and left out of the ratios).
    Proxy {
        /// `--busy-poll` value.
        busy_poll: String,
        /// `--mode http` (requests over pooled backend connections) rather
        /// than the default TCP forwarding.
        http: bool,
    },
    /// `hotloop-bench peer NAME PROTO` with these extra arguments.
    Peer(String, Vec<String>),
    /// nginx with a generated configuration.
    Nginx {
        /// The executable.
        program: PathBuf,
        /// `multi_accept`: accept every pending connection per event (on)
        /// or one (off).
        multi_accept: bool,
    },
    /// haproxy with a generated configuration.
    Haproxy {
        /// The executable.
        program: PathBuf,
        /// `tune.maxaccept` (connections accepted per wakeup; -1 is
        /// unlimited); `None` leaves haproxy's default.
        maxaccept: Option<i32>,
    },
    /// h2o with a generated configuration.
    H2o {
        /// The executable.
        program: PathBuf,
    },
    /// haproxy forwarding to `hotloop serve http` (busy polling off), with
    /// or without haproxy's own `busy-polling`: the original experiment.
    HaproxyForward {
        /// The executable.
        program: PathBuf,
        /// Whether haproxy's `busy-polling` is on.
        busy_polling: bool,
        /// `mode http` rather than `mode tcp`: each side compared with the
        /// `hotloop proxy` mode that does the same work.
        http: bool,
    },
}

impl ServerSpec {
    /// `hotloop serve` with `args`.
    pub fn hotloop(config: &str, args: &[&str]) -> ServerSpec {
        ServerSpec {
            server: "hotloop".into(),
            config: config.into(),
            kind: ServerKind::Serve(args.iter().map(|s| s.to_string()).collect(), Vec::new()),
        }
    }

    /// `hotloop-bench peer NAME`.
    pub fn peer(name: &str) -> ServerSpec {
        ServerSpec {
            server: name.into(),
            config: String::new(),
            kind: ServerKind::Peer(name.into(), Vec::new()),
        }
    }

    /// Whether the server spends a scenario's `work_us` per request: the
    /// off-the-shelf servers (nginx, haproxy, h2o) answer a fixed body with
    /// no work, so beside a workload with work they are reference rows.
    pub fn does_work(&self) -> bool {
        !matches!(
            self.kind,
            ServerKind::Nginx { .. } | ServerKind::Haproxy { .. } | ServerKind::H2o { .. }
        )
    }

    /// Whether the server busy-polls (spins on its CPU while idle), read
    /// from the arguments that start it.
    pub fn busy_polls(&self) -> bool {
        // `--busy-poll MODE`, `--busy-poll=MODE`, or the floors' bare flag.
        let asks = |args: &[String]| {
            args.iter().enumerate().any(|(i, a)| match a.strip_prefix("--busy-poll") {
                Some("") => args.get(i + 1).is_none_or(|v| v != "off"),
                Some(rest) => rest.strip_prefix('=').is_some_and(|v| v != "off"),
                None => false,
            })
        };
        match &self.kind {
            ServerKind::Serve(args, _) | ServerKind::Peer(_, args) => asks(args),
            ServerKind::Proxy { busy_poll, .. } => busy_poll != "off",
            ServerKind::HaproxyForward { busy_polling, .. } => *busy_polling,
            ServerKind::Nginx { .. } | ServerKind::Haproxy { .. } | ServerKind::H2o { .. } => false,
        }
    }
}

/// A started server: its processes, stopped when this is dropped.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its `GET /stats` endpoint, for hotloop.
    pub stats_addr: Option<SocketAddr>,
    /// Remarks made at start.
    pub notes: Vec<String>,
    /// What was started instead of what the row names, if anything: a
    /// label suffix and the reason. The row is then relabelled and left
    /// out of the ratios.
    pub substituted: Option<(String, String)>,
    children: Vec<Child>,
}

impl Running {
    fn new(addr: SocketAddr, stats_addr: Option<SocketAddr>, children: Vec<Child>) -> Running {
        Running { addr, stats_addr, notes: Vec::new(), substituted: None, children }
    }

    /// A started server with no process, for tests of what is made of one.
    #[cfg(test)]
    pub fn for_tests() -> Running {
        Running::new(([127, 0, 0, 1], 9).into(), None, Vec::new())
    }

    /// CPU time used by all its processes (and their children, such as
    /// nginx's workers) so far, with the clock's resolution.
    pub fn cpu_time(&self) -> Option<proc::CpuTime> {
        let mut total: Option<proc::CpuTime> = None;
        for pid in self.pids() {
            let t = proc::cpu_time(pid).ok()?;
            total = Some(total.map_or(t, |sum| sum.plus(t)));
        }
        total
    }

    /// CPU seconds used by all its processes so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.cpu_time().map(|t| t.seconds)
    }

    /// Seconds its processes' threads waited for a CPU so far.
    pub fn run_queue_wait_seconds(&self) -> Option<f64> {
        self.pids().map(|pid| proc::run_queue_wait_seconds(pid).ok()).sum()
    }

    /// Its processes and their children.
    fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.children.iter().flat_map(|c| proc::with_children(c.pid()))
    }

    /// The numeric fields of `GET /stats`, if the server has the endpoint.
    pub fn stats(&self) -> Option<BTreeMap<String, f64>> {
        parse_stats(&self.stats_body()?)
    }

    /// The numeric fields of each worker's object in `GET /stats`, in
    /// worker order.
    pub fn worker_stats(&self) -> Option<Vec<BTreeMap<String, f64>>> {
        parse_worker_stats(&self.stats_body()?)
    }

    /// The text fields of `GET /stats` (such as `driver` and `busy_poll`).
    pub fn stats_text(&self) -> BTreeMap<String, String> {
        let body = self.stats_body().unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let Some(object) = value.as_object() else { return BTreeMap::new() };
        object.iter().filter_map(|(k, v)| v.as_str().map(|t| (k.clone(), t.to_string()))).collect()
    }

    fn stats_body(&self) -> Option<String> {
        let addr = self.stats_addr?;
        proc::http_get(addr, "/stats", Duration::from_millis(STATS_TIMEOUT_MS)).ok()
    }

    /// The process id of its (first) process.
    pub fn pid(&self) -> Option<u32> {
        self.children.first().map(Child::pid)
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) all its processes.
    pub fn set_stopped(&mut self, stopped: bool) {
        for child in &mut self.children {
            child.set_stopped(stopped);
        }
    }

    /// Whether any of its processes has ended.
    pub fn exited(&mut self) -> bool {
        self.children.iter_mut().any(|c| c.exited().is_some())
    }
}

/// The numeric fields of a stats JSON object.
pub fn parse_stats(body: &str) -> Option<BTreeMap<String, f64>> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let object = value.as_object()?;
    Some(object.iter().filter_map(|(k, v)| v.as_f64().map(|f| (k.clone(), f))).collect())
}

/// The numeric fields of each object in a stats JSON object's `workers`.
pub fn parse_worker_stats(body: &str) -> Option<Vec<BTreeMap<String, f64>>> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let workers = value.get("workers")?.as_array()?;
    let numbers = |w: &serde_json::Value| {
        let object = w.as_object()?;
        Some(object.iter().filter_map(|(k, v)| v.as_f64().map(|f| (k.clone(), f))).collect())
    };
    workers.iter().map(numbers).collect()
}

/// Starts `spec` and waits until it accepts connections.
pub fn start(ctx: &mut Ctx, spec: &ServerSpec, work: &Workload) -> Result<Running, String> {
    let port = proc::free_port().map_err(|e| e.to_string())?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let common = |args: &mut Vec<String>| {
        args.extend([
            "--workers".to_string(),
            ctx.workers.to_string(),
            "--body-size".into(),
            work.body_size.to_string(),
            "--work-us".into(),
            work.work_us.to_string(),
        ]);
    };
    match &spec.kind {
        ServerKind::Serve(extra, env) => {
            let stats_addr: SocketAddr =
                ([127, 0, 0, 1], proc::free_port().map_err(|e| e.to_string())?).into();
            let mut args =
                vec!["serve".to_string(), work.proto.clone(), "--addr".into(), addr.to_string()];
            common(&mut args);
            args.extend(["--stats-addr".to_string(), stats_addr.to_string()]);
            let mut notes = Vec::new();
            match pin_fits(&ctx.server_cpus) {
                Some(true) => args.push("--pin".into()),
                Some(false) => notes.push(format!(
                    "workers not pinned one to a CPU: `--pin` puts worker i on CPU i, outside the \
                     bench's CPUs {:?}; the process runs on those CPUs, as the peers do",
                    ctx.server_cpus
                )),
                None => {}
            }
            args.extend(extra.iter().cloned());
            let mut child =
                launch_env(ctx, "hotloop serve", &ctx.server_exe.clone(), &args, env, addr)?;
            wait_for_stats(&mut child, stats_addr);
            let mut running = Running::new(addr, Some(stats_addr), vec![child]);
            running.notes = notes;
            verify_config(&running, &args)?;
            Ok(running)
        }
        ServerKind::Peer(name, extra) => {
            let mut args = vec![
                "peer".to_string(),
                name.clone(),
                work.proto.clone(),
                "--addr".into(),
                addr.to_string(),
            ];
            common(&mut args);
            args.extend(extra.iter().cloned());
            let child =
                launch(ctx, &format!("hotloop-bench peer {name}"), &ctx.exe.clone(), &args, addr)?;
            Ok(Running::new(addr, None, vec![child]))
        }
        ServerKind::Proxy { busy_poll, http } => start_proxy(ctx, work, addr, busy_poll, *http),
        ServerKind::HaproxyForward { program, busy_polling, http } => {
            let (backend, stats_addr, backend_child) = start_backend(ctx, work, "off")?;
            let dir = config_dir(ctx, "haproxy-forward", port)?;
            let role = HaproxyRole::Forward { backend, busy_polling: *busy_polling, http: *http };
            let conf = haproxy_config(&dir, addr, ctx.workers, work.body_size, role);
            std::fs::write(dir.join("haproxy.cfg"), conf).map_err(|e| e.to_string())?;
            let args =
                vec!["-db".to_string(), "-f".into(), dir.join("haproxy.cfg").display().to_string()];
            let proxy = launch(ctx, "haproxy (forwarding)", program, &args, addr)?;
            Ok(Running::new(addr, Some(stats_addr), vec![proxy, backend_child]))
        }
        ServerKind::Nginx { program, multi_accept } => {
            let dir = config_dir(ctx, "nginx", port)?;
            std::fs::write(dir.join("body"), "x".repeat(work.body_size))
                .map_err(|e| e.to_string())?;
            let conf = nginx_config(&dir, addr, ctx.workers, *multi_accept, work.body_size);
            std::fs::write(dir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
            let args = vec![
                "-p".to_string(),
                dir.display().to_string(),
                "-c".into(),
                dir.join("nginx.conf").display().to_string(),
            ];
            let child = launch(ctx, "nginx", program, &args, addr)?;
            Ok(Running::new(addr, None, vec![child]))
        }
        ServerKind::H2o { program } => {
            let dir = config_dir(ctx, "h2o", port)?;
            std::fs::write(dir.join("body"), "x".repeat(work.body_size))
                .map_err(|e| e.to_string())?;
            let conf = h2o_config(&dir, addr, ctx.workers, running_as_root());
            std::fs::write(dir.join("h2o.conf"), conf).map_err(|e| e.to_string())?;
            let args = vec!["-c".to_string(), dir.join("h2o.conf").display().to_string()];
            let child = launch(ctx, "h2o", program, &args, addr)?;
            Ok(Running::new(addr, None, vec![child]))
        }
        ServerKind::Haproxy { program, maxaccept } => {
            let dir = config_dir(ctx, "haproxy", port)?;
            std::fs::write(dir.join("body"), "x".repeat(work.body_size))
                .map_err(|e| e.to_string())?;
            let conf =
                haproxy_config(&dir, addr, ctx.workers, work.body_size, HaproxyRole::Respond);
            let conf = match maxaccept {
                Some(n) => conf.replacen("global\n", &format!("global\n  tune.maxaccept {n}\n"), 1),
                None => conf,
            };
            std::fs::write(dir.join("haproxy.cfg"), conf).map_err(|e| e.to_string())?;
            let args =
                vec!["-db".to_string(), "-f".into(), dir.join("haproxy.cfg").display().to_string()];
            let child = launch(ctx, "haproxy", program, &args, addr)?;
            Ok(Running::new(addr, None, vec![child]))
        }
    }
}

/// Starts `hotloop serve http` on epoll as a backend; returns its address,
/// its stats address and its process.
fn start_backend(
    ctx: &mut Ctx,
    work: &Workload,
    busy_poll: &str,
) -> Result<(SocketAddr, SocketAddr, Child), String> {
    let backend: SocketAddr =
        ([127, 0, 0, 1], proc::free_port().map_err(|e| e.to_string())?).into();
    let stats_addr: SocketAddr =
        ([127, 0, 0, 1], proc::free_port().map_err(|e| e.to_string())?).into();
    let args: Vec<String> = [
        "serve",
        "http",
        "--addr",
        &backend.to_string(),
        "--driver",
        "epoll",
        "--workers",
        &ctx.workers.to_string(),
        "--body-size",
        &work.body_size.to_string(),
        "--work-us",
        &work.work_us.to_string(),
        "--stats-addr",
        &stats_addr.to_string(),
        "--busy-poll",
        busy_poll,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // With one server CPU, the backend runs beside the load generator, so
    // the proxy has a core of its own (as in haproxy's busy-polling test).
    let cpus = match (ctx.server_cpus.len(), ctx.load_cpu) {
        (n, Some(load)) if n < 2 => vec![load],
        _ => ctx.server_cpus.clone(),
    };
    let mut child =
        launch_on(ctx, "hotloop serve (backend)", &ctx.server_exe.clone(), &args, backend, &cpus)?;
    wait_for_stats(&mut child, stats_addr);
    Ok((backend, stats_addr, child))
}

/// `hotloop serve http` as the backend and `hotloop proxy` (TCP, or
/// `--mode http`) in front of it, with its own stats endpoint. Busy polling
/// goes to the proxy, as in haproxy's test; if the proxy does not take
/// `--busy-poll`, it goes to the backend instead, and the result says so
/// ([`Running::substituted`]).
fn start_proxy(
    ctx: &mut Ctx,
    work: &Workload,
    addr: SocketAddr,
    busy_poll: &str,
    http: bool,
) -> Result<Running, String> {
    let mut last_error = String::new();
    for busy_on_proxy in [true, false] {
        let backend_busy = if busy_on_proxy { "off" } else { busy_poll };
        let (backend, _, backend_child) = start_backend(ctx, work, backend_busy)?;
        let stats_addr: SocketAddr =
            ([127, 0, 0, 1], proc::free_port().map_err(|e| e.to_string())?).into();
        let mut args = vec![
            "proxy".to_string(),
            "--mode".into(),
            if http { "http" } else { "tcp" }.into(),
            "--listen".into(),
            addr.to_string(),
            "--backend".into(),
            backend.to_string(),
            "--workers".into(),
            ctx.workers.to_string(),
            "--stats-addr".into(),
            stats_addr.to_string(),
        ];
        if busy_on_proxy {
            args.extend(["--busy-poll".to_string(), busy_poll.to_string()]);
        }
        match launch(ctx, "hotloop proxy", &ctx.server_exe.clone(), &args, addr) {
            Ok(mut proxy) => {
                wait_for_stats(&mut proxy, stats_addr);
                let mut running = Running::new(addr, Some(stats_addr), vec![proxy, backend_child]);
                if busy_on_proxy {
                    verify_config(&running, &args)?;
                } else {
                    running.substituted = Some((
                        format!("(busy-poll {busy_poll} on the backend)"),
                        format!(
                            "substituted: `hotloop proxy --busy-poll {busy_poll}` refused \
                             ({last_error}), so busy polling ran on the backend"
                        ),
                    ));
                }
                return Ok(running);
            }
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
}

/// Whether `hotloop --pin` (worker i on CPU i, over as many CPUs as the
/// process may use) keeps the workers on `cpus`, the CPUs the bench gives
/// the servers: only when they are CPUs 0 to n - 1. `None` when the
/// servers are not pinned at all.
pub fn pin_fits(cpus: &[usize]) -> Option<bool> {
    if cpus.is_empty() {
        return None;
    }
    Some(cpus.iter().enumerate().all(|(i, &cpu)| i == cpu))
}

/// Checks that a hotloop server runs the driver and busy polling its
/// arguments ask for, from what its stats endpoint reports; an error (the
/// row then is unavailable) says what differs. A server without stats
/// cannot be checked and passes.
fn verify_config(running: &Running, args: &[String]) -> Result<(), String> {
    let reported = running.stats_text();
    match config_mismatch(args, &reported) {
        Some(why) => Err(format!("not the configuration the row names: {why}")),
        None => Ok(()),
    }
}

/// What differs between the driver and busy polling `args` ask for and
/// those a server `reported` (its stats' `driver` and `busy_poll`), if
/// anything. `--driver auto`, or none, takes either driver; an absent
/// `--busy-poll` means `off`; `adaptive` takes any `adaptive:MICROS`.
pub fn config_mismatch(args: &[String], reported: &BTreeMap<String, String>) -> Option<String> {
    let value_of = |flag: &str| {
        let eq = format!("{flag}=");
        let mut found = None;
        for (i, a) in args.iter().enumerate() {
            if a == flag {
                found = args.get(i + 1).cloned();
            } else if let Some(v) = a.strip_prefix(&eq) {
                found = Some(v.to_string());
            }
        }
        found
    };
    let mut wrong = Vec::new();
    if let (Some(asked), Some(got)) = (value_of("--driver"), reported.get("driver")) {
        if asked != "auto" && &asked != got {
            let why = reported.get("driver_reason").map_or(String::new(), |r| format!(" ({r})"));
            wrong.push(format!("driver {got}{why}, not {asked}"));
        }
    }
    if let Some(got) = reported.get("busy_poll") {
        let asked = value_of("--busy-poll").unwrap_or_else(|| "off".into());
        let same = if asked == "adaptive" { got.starts_with("adaptive") } else { &asked == got };
        if !same {
            wrong.push(format!("busy polling {got}, not {asked}"));
        }
    }
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

/// Gives the stats endpoint, which may start after the listener, a moment
/// to come up. Figures that need it are left out if it never does.
fn wait_for_stats(child: &mut Child, stats_addr: SocketAddr) {
    let _ = proc::wait_accepting(child, stats_addr, Duration::from_millis(STATS_TIMEOUT_MS));
}

/// Spawns `program args` pinned to the server CPUs and waits for `addr`.
fn launch(
    ctx: &mut Ctx,
    name: &str,
    program: &Path,
    args: &[String],
    addr: SocketAddr,
) -> Result<Child, String> {
    launch_env(ctx, name, program, args, &[], addr)
}

/// Like [`launch`], with `env` added to the server's environment.
fn launch_env(
    ctx: &mut Ctx,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    addr: SocketAddr,
) -> Result<Child, String> {
    let cpus = ctx.server_cpus.clone();
    launch_with(ctx, name, program, args, env, addr, &cpus)
}

/// Like [`launch`], pinned to `cpus`.
fn launch_on(
    ctx: &mut Ctx,
    name: &str,
    program: &Path,
    args: &[String],
    addr: SocketAddr,
    cpus: &[usize],
) -> Result<Child, String> {
    launch_with(ctx, name, program, args, &[], addr, cpus)
}

/// Starts `program` with `args` and `env` added to its environment,
/// pinned to `cpus`, and waits until it accepts on `addr`.
fn launch_with(
    ctx: &mut Ctx,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    addr: SocketAddr,
    cpus: &[usize],
) -> Result<Child, String> {
    let log = ctx.log_path(name);
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = Child::spawn(name, cmd, cpus, &log).map_err(|e| e.to_string())?;
    match proc::wait_accepting(&mut child, addr, Duration::from_millis(SERVER_START_TIMEOUT_MS)) {
        Ok(()) => Ok(child),
        Err(e) => {
            drop(child);
            Err(format!("{e}: {}", super::last_line(&log)))
        }
    }
}

fn config_dir(ctx: &Ctx, name: &str, port: u16) -> Result<PathBuf, String> {
    let dir = ctx.out.join("tmp").join(format!("{name}-{port}"));
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// The largest body nginx answers from its configuration (`return 200
/// "..."`): a directive's argument must fit nginx's 4 KiB parse buffer.
pub const NGINX_RETURN_BODY_MAX: usize = 3_072;

/// A minimal nginx configuration: loopback only, foreground, no master,
/// a fixed `200` of `body_size` bytes held in memory: up to
/// [`NGINX_RETURN_BODY_MAX`] from the configuration (`return`), above it
/// the file `body` in `dir` with its descriptor cached (`open_file_cache`)
/// and sent with `sendfile`, so no request opens or reads the file.
pub fn nginx_config(
    dir: &Path,
    addr: SocketAddr,
    workers: usize,
    multi_accept: bool,
    body_size: usize,
) -> String {
    let multi_accept = if multi_accept { "on" } else { "off" };
    // Without a master process nginx ignores `worker_processes` and serves
    // from its one process.
    let master = if workers > 1 { "on" } else { "off" };
    let answer = if body_size <= NGINX_RETURN_BODY_MAX {
        format!("location / {{ return 200 \"{}\"; }}", "x".repeat(body_size))
    } else {
        format!(
            "open_file_cache max=16 inactive=3600s;\n    open_file_cache_valid 3600s;\n    \
             sendfile on;\n    root {};\n    location / {{ try_files /body =404; }}",
            dir.display()
        )
    };
    format!(
        "daemon off;\nmaster_process {master};\nworker_processes {workers};\npid {pid};\n\
         error_log {err} warn;\nworker_rlimit_nofile 20000;\n\
         events {{ worker_connections 19900; multi_accept {multi_accept}; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  tcp_nodelay on;\n\
         \x20 client_body_temp_path {tmp};\n\
         \x20 server {{\n    listen {addr} reuseport backlog=65535;\n    default_type text/plain;\n\
         \x20   {answer}\n  }}\n}}\n",
        pid = dir.join("nginx.pid").display(),
        err = dir.join("logs/error.log").display(),
        tmp = dir.join("tmp").display(),
    )
}

/// An h2o configuration with the settings its documentation gives for
/// speed: loopback only, `workers` threads (`num-threads`), no access log
/// (none is configured), no compressed variants looked for, connections
/// limited only by the open-file limit; a fixed `200` whose body is the
/// file `body` in `dir`. As root, h2o would switch to `nobody` unless told
/// to stay (`user`).
pub fn h2o_config(dir: &Path, addr: SocketAddr, workers: usize, as_root: bool) -> String {
    let user = if as_root { "user: root\n" } else { "" };
    format!(
        "{user}num-threads: {workers}\nmax-connections: 19900\npid-file: {pid}\n\
         error-log: {err}\nfile.send-compressed: OFF\nlisten:\n  host: {host}\n  port: {port}\n\
         hosts:\n  default:\n    paths:\n      /:\n        file.file: {body}\n",
        pid = dir.join("h2o.pid").display(),
        err = dir.join("logs/error.log").display(),
        host = addr.ip(),
        port = addr.port(),
        body = dir.join("body").display(),
    )
}

/// True if this process runs as root.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .is_some_and(|euid| euid == "0")
    })
}

/// haproxy's connection limit: it budgets two files per connection (it is
/// a proxy), and a process may hold 20,000 here.
pub const HAPROXY_MAXCONN: u32 = 9_900;

/// What a generated haproxy configuration does with a request.
#[derive(Debug, Clone, Copy)]
pub enum HaproxyRole {
    /// Answers `200` itself with the file `body` in the configuration's directory.
    Respond,
    /// Forwards to a backend, with haproxy's `busy-polling` on or off.
    Forward {
        /// The backend's address.
        backend: SocketAddr,
        /// Whether `busy-polling` is on.
        busy_polling: bool,
        /// `mode http` (requests) rather than `mode tcp` (connections,
        /// byte for byte, as `hotloop proxy` does by default).
        http: bool,
    },
}

/// A minimal haproxy configuration, loopback only.
pub fn haproxy_config(
    dir: &Path,
    addr: SocketAddr,
    workers: usize,
    body_size: usize,
    role: HaproxyRole,
) -> String {
    // The response must fit in one buffer.
    let bufsize = (body_size + 1024).max(16_384);
    let (busy, mode, action) = match role {
        HaproxyRole::Respond => (
            "",
            "http",
            format!(
                "  http-request return status 200 content-type text/plain file {}\n",
                dir.join("body").display()
            ),
        ),
        HaproxyRole::Forward { backend, busy_polling, http } => (
            if busy_polling { "  busy-polling\n" } else { "" },
            if http { "http" } else { "tcp" },
            format!("  default_backend hotloop\nbackend hotloop\n  server backend {backend}\n"),
        ),
    };
    format!(
        "global\n  maxconn {HAPROXY_MAXCONN}\n  nbthread {workers}\n  tune.bufsize {bufsize}\n{busy}\
         defaults\n  mode {mode}\n  timeout client 30s\n  timeout server 30s\n  timeout connect 5s\n\
         frontend bench\n  bind {addr}\n{action}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_keep_numbers_only() {
        let s = parse_stats(r#"{"accepted":10,"driver":"uring","registrations":2.5}"#).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s["registrations"], 2.5);
        assert!(parse_stats("[1]").is_none());
    }

    #[test]
    fn worker_stats_keep_each_workers_numbers() {
        let body = r#"{"accepted":3,"workers":[{"accepted":1,"handoffs_in":0},{"accepted":2}]}"#;
        let w = parse_worker_stats(body).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!((w[0]["accepted"], w[1]["accepted"]), (1.0, 2.0));
        assert!(parse_worker_stats(r#"{"accepted":3}"#).is_none());
    }

    #[test]
    fn busy_polling_is_read_from_the_arguments() {
        let serve = |args: &[&str]| ServerSpec::hotloop("x", args).busy_polls();
        assert!(serve(&["--driver", "epoll", "--busy-poll", "always"]));
        assert!(serve(&["--busy-poll", "adaptive:100"]));
        assert!(serve(&["--busy-poll=always"]));
        assert!(!serve(&["--busy-poll", "off", "--driver", "uring"]));
        assert!(!serve(&["--busy-poll=off"]));
        assert!(!serve(&["--driver", "epoll"]));
        let peer = |args: Vec<String>| ServerSpec {
            server: "floor".into(),
            config: String::new(),
            kind: ServerKind::Peer("floor".into(), args),
        };
        assert!(peer(vec!["--busy-poll".into()]).busy_polls());
        assert!(peer(vec!["--busy-poll".into(), "--max-accepts".into(), "8".into()]).busy_polls());
        assert!(!peer(Vec::new()).busy_polls());
        assert!(!ServerSpec::peer("tokio").busy_polls());
        let proxy = |b: &str| ServerSpec {
            server: "hotloop".into(),
            config: String::new(),
            kind: ServerKind::Proxy { busy_poll: b.into(), http: false },
        };
        assert!(proxy("always").busy_polls() && !proxy("off").busy_polls());
    }

    #[test]
    fn generated_configs_listen_on_loopback_only() {
        let addr: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let n = nginx_config(Path::new("/tmp/n"), addr, 1, true, 16_384);
        assert!(n.contains("multi_accept on;"), "{n}");
        assert!(nginx_config(Path::new("/tmp/n"), addr, 1, false, 64).contains("multi_accept off;"));
        assert!(n.contains("listen 127.0.0.1:9999") && n.contains("root /tmp/n;"), "{n}");
        assert!(n.contains("master_process off;\nworker_processes 1;"), "{n}");
        let n2 = nginx_config(Path::new("/tmp/n"), addr, 2, false, 64);
        assert!(n2.contains("master_process on;\nworker_processes 2;"), "{n2}");
        let o = h2o_config(Path::new("/tmp/o"), addr, 1, false);
        assert!(o.starts_with("num-threads: 1\n") && o.contains("host: 127.0.0.1\n"), "{o}");
        assert!(o.contains("port: 9999\n") && o.contains("file.file: /tmp/o/body\n"), "{o}");
        assert!(h2o_config(Path::new("/tmp/o"), addr, 2, true).starts_with("user: root\n"));
        let h2 = haproxy_config(Path::new("/tmp/h"), addr, 2, 64, HaproxyRole::Respond);
        assert!(h2.contains("nbthread 2\n"), "{h2}");
        let h = haproxy_config(Path::new("/tmp/h"), addr, 1, 20_000, HaproxyRole::Respond);
        assert!(h.contains("bind 127.0.0.1:9999") && h.contains("tune.bufsize 21024"), "{h}");
        assert!(h.contains("file /tmp/h/body") && !h.contains("busy-polling"), "{h}");
        let backend = "127.0.0.1:9000".parse().unwrap();
        let f = haproxy_config(
            Path::new("/tmp/h"),
            addr,
            1,
            64,
            HaproxyRole::Forward { backend, busy_polling: true, http: false },
        );
        assert!(
            f.contains("  busy-polling\n") && f.contains("server backend 127.0.0.1:9000"),
            "{f}"
        );
    }

    #[test]
    fn nginx_answers_from_memory_not_by_reading_a_file_per_request() {
        let addr: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        // A small body is in the configuration itself.
        let small = nginx_config(Path::new("/tmp/n"), addr, 1, true, 64);
        assert!(small.contains(&format!("return 200 \"{}\";", "x".repeat(64))), "{small}");
        assert!(!small.contains("try_files"), "{small}");
        // A large one (past nginx's 4 KiB argument limit) is the file, its
        // descriptor cached and sent with sendfile.
        let large = nginx_config(Path::new("/tmp/n"), addr, 1, true, 8_192);
        assert!(
            large.contains("open_file_cache max=") && large.contains("sendfile on;"),
            "{large}"
        );
        assert!(!large.contains("return 200"), "{large}");
    }

    #[test]
    fn haproxy_forwards_as_the_hotloop_proxy_it_is_compared_with() {
        let addr: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let backend = "127.0.0.1:9000".parse().unwrap();
        let forward = |http| {
            let role = HaproxyRole::Forward { backend, busy_polling: false, http };
            haproxy_config(Path::new("/tmp/h"), addr, 1, 64, role)
        };
        assert!(forward(false).contains("defaults\n  mode tcp\n"), "{}", forward(false));
        assert!(forward(true).contains("defaults\n  mode http\n"), "{}", forward(true));
        let respond = haproxy_config(Path::new("/tmp/h"), addr, 1, 64, HaproxyRole::Respond);
        assert!(respond.contains("mode http"), "{respond}");
    }

    #[test]
    fn a_server_not_running_what_its_row_names_is_caught() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let reported = |driver: &str, busy: &str| {
            [
                ("driver", driver),
                ("busy_poll", busy),
                ("driver_reason", "io_uring was requested (HOTLOOP_DRIVER)"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
        };
        let epoll = args(&["serve", "http", "--driver", "epoll"]);
        assert_eq!(config_mismatch(&epoll, &reported("epoll", "off")), None);
        let why = config_mismatch(&epoll, &reported("uring", "off")).unwrap();
        assert!(why.contains("driver uring") && why.contains("HOTLOOP_DRIVER"), "{why}");
        let busy = args(&["--driver", "uring", "--busy-poll", "adaptive"]);
        assert_eq!(config_mismatch(&busy, &reported("uring", "adaptive:200")), None);
        assert!(config_mismatch(&busy, &reported("uring", "off"))
            .unwrap()
            .contains("busy polling off"));
        assert_eq!(
            config_mismatch(&args(&["--busy-poll=always"]), &reported("epoll", "always")),
            None
        );
        // auto, or no --driver, takes either; no stats, nothing to check.
        assert_eq!(config_mismatch(&args(&["--driver", "auto"]), &reported("uring", "off")), None);
        assert_eq!(config_mismatch(&epoll, &BTreeMap::new()), None);
    }

    #[test]
    fn pin_is_passed_only_when_it_keeps_workers_on_the_benchs_cpus() {
        assert_eq!(pin_fits(&[]), None);
        assert_eq!(pin_fits(&[0]), Some(true));
        assert_eq!(pin_fits(&[0, 1]), Some(true));
        // --pin puts worker 0 on CPU 0, which the bench did not give it.
        assert_eq!(pin_fits(&[2]), Some(false));
        assert_eq!(pin_fits(&[1, 2]), Some(false));
    }
}
