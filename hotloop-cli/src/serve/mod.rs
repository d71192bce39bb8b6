//! `hotloop serve echo|http|hyper|quic|h3|static`: the runtime as a real server.
//!
//! `echo` and `http` are hand-written handlers on the owned-buffer API
//! (`echo_http.rs`); `hyper` runs the hyper service in
//! `hotloop_proto::hyper_app` through [`hotloop::hyper::serve_hyper`]
//! (HTTP/1.1, and HTTP/2 by prior knowledge), so hyper on hotloop can be
//! compared with the same service on tokio; the command's idle, send and
//! header timeouts go to it as [`HyperOptions`]. With `--tls-cert` and
//! `--tls-key` all three run over TLS (`tls.rs`); `quic` (in `quic/`)
//! echoes QUIC streams, and `h3` answers HTTP/3 there; `static` (in
//! `static_files/`) serves the files under `--root` with the same
//! connection handling as `http` (`conn/`).
//!
//! This module only picks the app and starts it: the top of the command's
//! server modules, it imports the others and none imports it.

mod echo_http;

use std::io;
use std::sync::Arc;

use hotloop::hyper::{serve_hyper, serve_hyper_tls, HyperOptions};
use hotloop::net::serve;
use hotloop::signal::ShutdownSignals;
use hotloop::tls::{serve_tls, ALPN_H2, ALPN_HTTP11};
use hotloop_proto::hyper_app;
use hyper::service::service_fn;

use crate::serve_args::{millis_or_never, App, ServeArgs};
use crate::stats_server::StatsServer;
use crate::{quic, static_files, stop, tls};
use echo_http::{handle_connection, Settings};

/// Runs the server until a stop signal (see `stop.rs` for each signal).
pub fn run(args: &ServeArgs) -> std::io::Result<()> {
    let signals = ShutdownSignals::block()?;
    let nofile = hotloop::raise_nofile_limit()?;
    let rt = args.runtime.build_runtime()?;
    if matches!(args.app, App::Quic | App::H3) {
        return quic::run(args, &signals, &rt, nofile);
    }
    if args.root.is_some() != (args.app == App::Static) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--root DIR is what `serve static` serves, and only `serve static` takes it",
        ));
    }
    if args.write_cert.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--write-cert is for `serve quic` and `serve h3` (the other apps make no certificate)",
        ));
    }
    let alpn: &[&[u8]] = match args.app {
        App::Hyper => &[ALPN_H2, ALPN_HTTP11],
        App::Http | App::Static => &[ALPN_HTTP11],
        App::Echo | App::Quic | App::H3 => &[],
    };
    let (tls, certs) = match tls::acceptor(args, alpn)? {
        Some((acceptor, certs)) => (Some(acceptor), Some(certs)),
        None => (None, None),
    };
    let settings = Arc::new(Settings::new(args));
    // The sockets of a predecessor (or systemd), taken once the options
    // have proved good: a successor that cannot start never takes them.
    let handover = args.runtime.handover()?;
    let (addr, options) = (args.addr.as_str(), args.runtime.server_options(&handover));
    let server = match (args.app, tls) {
        (App::Static, tls) => {
            let site = static_files::Site {
                root: hotloop::fs::Dir::open_blocking(
                    args.root.as_deref().unwrap_or(".".as_ref()),
                )?,
                idle_timeout: settings.idle_timeout,
                header_timeout: settings.header_timeout,
                write_limit: settings.write_limit,
                max_headers: args.max_headers,
            };
            static_files::start(rt.handle(), addr, options, tls, site)?
        }
        (App::Hyper, tls) => {
            let body = hyper_app::body(args.body_size);
            let work_us = args.work_us;
            let make_service = move || {
                let body = body.clone();
                service_fn(move |req| hyper_app::respond(body.clone(), work_us, req))
            };
            let options = HyperOptions {
                server: options,
                idle_timeout: settings.idle_timeout,
                send_timeout: millis_or_never(args.send_timeout_ms),
                header_timeout: Some(settings.header_timeout),
                idle_release: Some(HyperOptions::IDLE_RELEASE_DEFAULT),
            };
            match tls {
                None => serve_hyper(rt.handle(), addr, options, make_service)?,
                Some(tls) => serve_hyper_tls(rt.handle(), addr, options, tls, make_service)?,
            }
        }
        // Two instances of the handlers: the plain one on `TcpStream` as it was.
        (_, None) => serve(rt.handle(), addr, options, move |stream| {
            handle_connection(stream, settings.clone())
        })?,
        (_, Some(tls)) => serve_tls(rt.handle(), addr, options, tls, move |stream| {
            handle_connection(stream, settings.clone())
        })?,
    };
    let stats = rt.stats();
    eprintln!(
        "hotloop serve {:?}{} on {} | workers {} | driver {} ({}) | busy-poll {} | open-file limit {nofile}",
        args.app,
        if args.tls_cert.is_some() { " over TLS" } else { "" },
        server.local_addr(),
        rt.handle().workers(),
        stats.info.driver,
        stats.info.reason,
        stats.info.busy_poll,
    );
    let active = Arc::new(server.active_connections_reader());
    let _stats_server = {
        let active = active.clone();
        StatsServer::start_with_active(
            "hotloop serve",
            args.runtime.stats_addr.as_deref(),
            rt.handle().clone(),
            "Connections open now, over all workers.",
            move || active(),
        )?
    };
    // Serving: a predecessor stops accepting now, and drains.
    handover.ready()?;
    if let Some(pid) = handover.predecessor() {
        eprintln!("hotloop serve: took the listening sockets over from pid {pid}, which drains");
    }
    let status =
        || format!("{} connections open, {} accepted", active(), rt.stats().total.accepted);
    let reload = || certs.as_ref().map(|c| stop::reload_certificate(c));
    let control = stop::Control {
        name: "hotloop serve",
        signals: &signals,
        handover: &handover,
        drain_timeout: args.runtime.drain_timeout(),
        status: &status,
        reload: &reload,
    };
    let stopped = stop::run_until_stopped(&control, &rt, server)?;
    stop::say_stopped("hotloop serve", &stopped, rt.stats().total.accepted);
    Ok(())
}
