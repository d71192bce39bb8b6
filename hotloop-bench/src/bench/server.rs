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
    /// such option).
    Proxy {
        /// `--busy-poll` value.
        busy_poll: String,
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
            ServerKind::Proxy { busy_poll } => busy_poll != "off",
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
    /// Substitutions made at start.
    pub notes: Vec<String>,
    children: Vec<Child>,
}

impl Running {
    /// CPU seconds used by all its processes (and their children, such as
    /// nginx's workers) so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.pids().map(|pid| proc::cpu_seconds(pid).ok()).sum()
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
            if !ctx.server_cpus.is_empty() {
                args.push("--pin".into());
            }
            args.extend(extra.iter().cloned());
            let mut child =
                launch_env(ctx, "hotloop serve", &ctx.server_exe.clone(), &args, env, addr)?;
            wait_for_stats(&mut child, stats_addr);
            Ok(Running {
                addr,
                stats_addr: Some(stats_addr),
                notes: Vec::new(),
                children: vec![child],
            })
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
            Ok(Running { addr, stats_addr: None, notes: Vec::new(), children: vec![child] })
        }
        ServerKind::Proxy { busy_poll } => start_proxy(ctx, work, addr, busy_poll),
        ServerKind::HaproxyForward { program, busy_polling } => {
            let (backend, stats_addr, backend_child) = start_backend(ctx, work, "off")?;
            let dir = config_dir(ctx, "haproxy-forward", port)?;
            let role = HaproxyRole::Forward { backend, busy_polling: *busy_polling };
            let conf = haproxy_config(&dir, addr, ctx.workers, work.body_size, role);
            std::fs::write(dir.join("haproxy.cfg"), conf).map_err(|e| e.to_string())?;
            let args =
                vec!["-db".to_string(), "-f".into(), dir.join("haproxy.cfg").display().to_string()];
            let proxy = launch(ctx, "haproxy (forwarding)", program, &args, addr)?;
            Ok(Running {
                addr,
                stats_addr: Some(stats_addr),
                notes: Vec::new(),
                children: vec![proxy, backend_child],
            })
        }
        ServerKind::Nginx { program, multi_accept } => {
            let dir = config_dir(ctx, "nginx", port)?;
            std::fs::write(dir.join("body"), "x".repeat(work.body_size))
                .map_err(|e| e.to_string())?;
            let conf = nginx_config(&dir, addr, ctx.workers, *multi_accept);
            std::fs::write(dir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
            let args = vec![
                "-p".to_string(),
                dir.display().to_string(),
                "-c".into(),
                dir.join("nginx.conf").display().to_string(),
            ];
            let child = launch(ctx, "nginx", program, &args, addr)?;
            Ok(Running { addr, stats_addr: None, notes: Vec::new(), children: vec![child] })
        }
        ServerKind::H2o { program } => {
            let dir = config_dir(ctx, "h2o", port)?;
            std::fs::write(dir.join("body"), "x".repeat(work.body_size))
                .map_err(|e| e.to_string())?;
            let conf = h2o_config(&dir, addr, ctx.workers, running_as_root());
            std::fs::write(dir.join("h2o.conf"), conf).map_err(|e| e.to_string())?;
            let args = vec!["-c".to_string(), dir.join("h2o.conf").display().to_string()];
            let child = launch(ctx, "h2o", program, &args, addr)?;
            Ok(Running { addr, stats_addr: None, notes: Vec::new(), children: vec![child] })
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
            Ok(Running { addr, stats_addr: None, notes: Vec::new(), children: vec![child] })
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

/// `hotloop serve http` as the backend and `hotloop proxy` in front of it.
/// Busy polling goes to the proxy, as in haproxy's test; if the proxy does
/// not take `--busy-poll`, it goes to the backend instead, with a note.
fn start_proxy(
    ctx: &mut Ctx,
    work: &Workload,
    addr: SocketAddr,
    busy_poll: &str,
) -> Result<Running, String> {
    let mut last_error = String::new();
    for busy_on_proxy in [true, false] {
        let backend_busy = if busy_on_proxy { "off" } else { busy_poll };
        let (backend, stats_addr, backend_child) = start_backend(ctx, work, backend_busy)?;
        let mut args = vec![
            "proxy".to_string(),
            "--listen".into(),
            addr.to_string(),
            "--backend".into(),
            backend.to_string(),
            "--workers".into(),
            ctx.workers.to_string(),
        ];
        if busy_on_proxy {
            args.extend(["--busy-poll".to_string(), busy_poll.to_string()]);
        }
        match launch(ctx, "hotloop proxy", &ctx.server_exe.clone(), &args, addr) {
            Ok(proxy) => {
                let notes = if busy_on_proxy {
                    Vec::new()
                } else {
                    vec![format!(
                        "`hotloop proxy --busy-poll` refused ({last_error}); busy polling set on the backend"
                    )]
                };
                return Ok(Running {
                    addr,
                    stats_addr: Some(stats_addr),
                    notes,
                    children: vec![proxy, backend_child],
                });
            }
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
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

/// A minimal nginx configuration: loopback only, foreground, no master,
/// a fixed `200` whose body is the file `body` in `dir`.
pub fn nginx_config(dir: &Path, addr: SocketAddr, workers: usize, multi_accept: bool) -> String {
    let multi_accept = if multi_accept { "on" } else { "off" };
    // Without a master process nginx ignores `worker_processes` and serves
    // from its one process.
    let master = if workers > 1 { "on" } else { "off" };
    format!(
        "daemon off;\nmaster_process {master};\nworker_processes {workers};\npid {pid};\n\
         error_log {err} warn;\nworker_rlimit_nofile 20000;\n\
         events {{ worker_connections 19900; multi_accept {multi_accept}; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  tcp_nodelay on;\n\
         \x20 client_body_temp_path {tmp};\n\
         \x20 server {{\n    listen {addr} reuseport backlog=65535;\n    default_type text/plain;\n\
         \x20   root {root};\n    location / {{ try_files /body =404; }}\n  }}\n}}\n",
        pid = dir.join("nginx.pid").display(),
        err = dir.join("logs/error.log").display(),
        tmp = dir.join("tmp").display(),
        root = dir.display(),
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
    let (busy, action) = match role {
        HaproxyRole::Respond => (
            "",
            format!(
                "  http-request return status 200 content-type text/plain file {}\n",
                dir.join("body").display()
            ),
        ),
        HaproxyRole::Forward { backend, busy_polling } => (
            if busy_polling { "  busy-polling\n" } else { "" },
            format!("  default_backend hotloop\nbackend hotloop\n  server backend {backend}\n"),
        ),
    };
    format!(
        "global\n  maxconn {HAPROXY_MAXCONN}\n  nbthread {workers}\n  tune.bufsize {bufsize}\n{busy}\
         defaults\n  mode http\n  timeout client 30s\n  timeout server 30s\n  timeout connect 5s\n\
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
            kind: ServerKind::Proxy { busy_poll: b.into() },
        };
        assert!(proxy("always").busy_polls() && !proxy("off").busy_polls());
    }

    #[test]
    fn generated_configs_listen_on_loopback_only() {
        let addr: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let n = nginx_config(Path::new("/tmp/n"), addr, 1, true);
        assert!(n.contains("multi_accept on;"), "{n}");
        assert!(nginx_config(Path::new("/tmp/n"), addr, 1, false).contains("multi_accept off;"));
        assert!(n.contains("listen 127.0.0.1:9999") && n.contains("root /tmp/n;"), "{n}");
        assert!(n.contains("master_process off;\nworker_processes 1;"), "{n}");
        let n2 = nginx_config(Path::new("/tmp/n"), addr, 2, false);
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
            HaproxyRole::Forward { backend, busy_polling: true },
        );
        assert!(
            f.contains("  busy-polling\n") && f.contains("server backend 127.0.0.1:9000"),
            "{f}"
        );
    }
}
