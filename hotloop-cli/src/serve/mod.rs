//! `hotloop serve echo|http|hyper|quic|h3|static`: the runtime as a real server.
//!
//! `echo` and `http` are hand-written handlers on the owned-buffer API
//! (`echo_http.rs`); `hyper` (`hyper.rs`) runs the hyper service in
//! `hotloop_proto::hyper_app` through [`hotloop::hyper::serve_hyper`]
//! (HTTP/1.1, and HTTP/2 by prior knowledge), so hyper on hotloop can be
//! compared with the same service on tokio; the command's idle, send and
//! header timeouts go to it as `HyperOptions`. With `--tls-cert` and
//! `--tls-key` all three run over TLS (`tls.rs`); `quic` (in `quic/`)
//! echoes QUIC streams, and `h3` answers HTTP/3 there; `static`
//! (`files.rs`, serving `static_files/`) serves the files under `--root`
//! with the same connection handling as `http` (`conn/`).
//!
//! The TCP apps share [`Tcp`], the [`Mode`] that sets up TLS, says the
//! banner and answers SIGUSR1 and SIGHUP for all of them; each says only
//! what it serves on a connection ([`TcpApp`]). A new TCP app is a file
//! here with a [`TcpApp`], a word in [`App`] and a line in [`run`].
//!
//! This module only picks the app and starts it: the top of the command's
//! server modules, it imports the others and none imports it.

mod echo_http;
mod files;
mod hyper;

use echo_http::EchoHttp;
use files::Files;
use hyper::Hyper;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use hotloop::net::{Server, ServerOptions};
use hotloop::tls::{CertReloader, TlsAcceptor};
use hotloop::{Handle, Runtime};

use crate::mode::{self, Mode, Serving, Start};
use crate::runtime_args::RuntimeArgs;
use crate::serve_args::{App, ServeArgs};
use crate::{quic, stop, tls};

/// Runs the server until a stop signal (see `stop.rs` for each signal).
pub fn run(args: &ServeArgs) -> io::Result<()> {
    match args.app {
        App::Echo | App::Http => mode::run(|| Tcp::new(args, || Ok(EchoHttp::new(args)))),
        App::Hyper => mode::run(|| Tcp::new(args, || Ok(Hyper::new(args)))),
        App::Static => mode::run(|| Tcp::new(args, || Files::new(args))),
        App::Quic | App::H3 => mode::run(|| quic::Quic::new(args)),
    }
}

/// What a TCP app of `serve` serves; [`Tcp`] does the rest.
pub(crate) trait TcpApp {
    /// The protocols offered over TLS (ALPN), most preferred first.
    fn alpn(&self) -> &'static [&'static [u8]];

    /// Starts serving `addr` on `rt`'s workers with `options`, over TLS
    /// with `tls`: an accept loop per worker and a task per connection.
    fn serve(
        self,
        rt: &Handle,
        addr: &str,
        options: ServerOptions,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<Server>;
}

/// A `serve` app over TCP (plain or TLS): a [`Mode`] for any [`TcpApp`].
pub(crate) struct Tcp<A> {
    args: ServeArgs,
    /// Taken when it starts.
    app: Option<A>,
    tls: Option<TlsAcceptor>,
    /// The certificate SIGHUP reloads.
    certs: Option<Arc<CertReloader>>,
}

impl<A: TcpApp> Tcp<A> {
    /// Checks the flags no TCP app takes, then makes the app with `app`.
    fn new(args: &ServeArgs, app: impl FnOnce() -> io::Result<A>) -> io::Result<Tcp<A>> {
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
        let app = app()?;
        let (tls, certs) = match tls::acceptor(args, app.alpn())? {
            Some((acceptor, certs)) => (Some(acceptor), Some(certs)),
            None => (None, None),
        };
        Ok(Tcp { args: args.clone(), app: Some(app), tls, certs })
    }
}

impl<A: TcpApp> Mode for Tcp<A> {
    const NAME: &'static str = "hotloop serve";
    const ACTIVE_HELP: &'static str = "Connections open now, over all workers.";

    fn runtime_args(&self) -> &RuntimeArgs {
        &self.args.runtime
    }

    fn start(&mut self, at: &Start<'_>) -> io::Result<Serving> {
        let app = self.app.take().expect("a mode starts once");
        let server =
            app.serve(at.rt.handle(), &self.args.addr, at.server_options(), self.tls.take())?;
        Ok(Serving::Tcp(server))
    }

    fn banner(&self, at: &Start<'_>, on: SocketAddr) -> String {
        let (rt, stats) = (at.rt, at.rt.stats());
        format!(
            "hotloop serve {:?}{} on {on} | workers {} | driver {} ({}) | busy-poll {} | open-file limit {}",
            self.args.app,
            if self.certs.is_some() { " over TLS" } else { "" },
            rt.handle().workers(),
            stats.info.driver,
            stats.info.reason,
            stats.info.busy_poll,
            at.nofile,
        )
    }

    fn status(&self, rt: &Runtime, open: usize) -> String {
        format!("{open} connections open, {} accepted", rt.stats().total.accepted)
    }

    fn reload(&self) -> Option<String> {
        self.certs.as_ref().map(|c| stop::reload_certificate(c))
    }
}
