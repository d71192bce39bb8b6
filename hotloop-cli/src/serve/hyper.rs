//! `serve hyper`: the hyper service of `hotloop_proto::hyper_app` on
//! hotloop's hyper integration (HTTP/1.1, and HTTP/2 by prior knowledge or
//! by ALPN over TLS), with the command's idle, send and header timeouts.

use std::io;

use hotloop::hyper::{serve_hyper, serve_hyper_tls, HyperOptions};
use hotloop::net::{Server, ServerOptions};
use hotloop::tls::{TlsAcceptor, ALPN_H2, ALPN_HTTP11};
use hotloop::Handle;
use hotloop_proto::hyper_app;
use hyper::service::service_fn;

use super::echo_http::Settings;
use super::TcpApp;
use crate::serve_args::{millis_or_never, ServeArgs};

/// `serve hyper`.
pub(super) struct Hyper {
    body_size: usize,
    work_us: u64,
    settings: Settings,
    send_timeout_ms: u64,
}

impl Hyper {
    pub(super) fn new(args: &ServeArgs) -> Hyper {
        Hyper {
            body_size: args.body_size,
            work_us: args.work_us,
            settings: Settings::new(args),
            send_timeout_ms: args.send_timeout_ms,
        }
    }
}

impl TcpApp for Hyper {
    fn alpn(&self) -> &'static [&'static [u8]] {
        &[ALPN_H2, ALPN_HTTP11]
    }

    fn serve(
        self,
        rt: &Handle,
        addr: &str,
        options: ServerOptions,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<Server> {
        let (body, work_us) = (hyper_app::body(self.body_size), self.work_us);
        let make_service = move || {
            let body = body.clone();
            service_fn(move |req| hyper_app::respond(body.clone(), work_us, req))
        };
        let options = HyperOptions {
            server: options,
            idle_timeout: self.settings.idle_timeout,
            send_timeout: millis_or_never(self.send_timeout_ms),
            header_timeout: self.settings.header_timeout,
            idle_release: Some(HyperOptions::IDLE_RELEASE_DEFAULT),
            ..HyperOptions::default()
        };
        match tls {
            None => serve_hyper(rt, addr, options, make_service),
            Some(tls) => serve_hyper_tls(rt, addr, options, tls, make_service),
        }
    }
}
