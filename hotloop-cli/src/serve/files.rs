//! `serve static --root DIR`: the files under a directory
//! (`static_files/`), with `serve http`'s timeouts.

use std::io;

use hotloop::net::{Server, ServerOptions};
use hotloop::tls::{TlsAcceptor, ALPN_HTTP11};
use hotloop::Handle;

use super::echo_http::Settings;
use super::TcpApp;
use crate::serve_args::ServeArgs;
use crate::static_files::{self, Site};

/// `serve static`.
pub(super) struct Files(Site);

impl Files {
    /// Opens `--root` (which [`super::Tcp`] checked is there).
    pub(super) fn new(args: &ServeArgs) -> io::Result<Files> {
        let settings = Settings::new(args);
        Ok(Files(Site {
            root: hotloop::fs::Dir::open_blocking(args.root.as_deref().unwrap_or(".".as_ref()))?,
            idle_timeout: settings.idle_timeout,
            header_timeout: settings.header_timeout,
            write_limit: settings.write_limit,
            max_headers: args.max_headers,
        }))
    }
}

impl TcpApp for Files {
    fn alpn(&self) -> &'static [&'static [u8]] {
        &[ALPN_HTTP11]
    }

    fn serve(
        self,
        rt: &Handle,
        addr: &str,
        options: ServerOptions,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<Server> {
        static_files::start(rt, addr, options, tls, self.0)
    }
}
