//! The tokio peer: a current-thread runtime per worker thread, each with its
//! own `SO_REUSEPORT` listener, and a task per connection, written as a
//! tokio user writes one (`tokio::spawn` on the current-thread runtime,
//! not a `LocalSet`, whose tasks are woken through a shared queue when
//! another task wakes them: h2's stream tasks wake their connection's
//! task on every request, which cost the `LocalSet` version about 10% of
//! its HTTP/2 throughput).

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{http_step, PeerProto, Shared, Step, READ_BUFFER_BYTES};

/// How long the accept loop backs off when accept fails (for example with
/// EMFILE), so a full file table does not turn into a busy loop.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 5;

/// Runs one worker on the calling thread until the process exits.
pub fn worker(index: usize, listener: std::net::TcpListener, shared: Shared) {
    let runtime =
        match tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("tokio peer worker {index}: cannot build the runtime: {e}");
                std::process::exit(1);
            }
        };
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("tokio peer worker {index}: cannot register the listener: {e}");
                std::process::exit(1);
            }
        };
        accept_loop(listener, shared).await;
    });
}

async fn accept_loop(listener: TcpListener, shared: Shared) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(async move {
                    // Errors end this connection only: resets are routine.
                    let _ = connection(stream, shared).await;
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await,
        }
    }
}

async fn connection(mut stream: TcpStream, shared: Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    match shared.proto {
        PeerProto::Hyper => {
            let body = crate::hyper_app::body(shared.body_size);
            let work_us = shared.work_us;
            let service = hyper::service::service_fn(move |req| {
                crate::hyper_app::respond(body.clone(), work_us, req)
            });
            // The builder `serve_hyper` uses on hotloop: keep-alive, and the
            // runtime's timer, so hyper's header timeout runs on both sides.
            let mut builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            builder.http1().timer(hyper_util::rt::TokioTimer::new()).keep_alive(true);
            builder.http2().timer(hyper_util::rt::TokioTimer::new());
            builder
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
                .map_err(|e| io::Error::other(e.to_string()))
        }
        PeerProto::Echo => loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            stream.write_all(&buf[..n]).await?;
        },
        PeerProto::Http => {
            let mut filled = 0;
            loop {
                let n = stream.read(&mut buf[filled..]).await?;
                if n == 0 {
                    return Ok(());
                }
                filled += n;
                // Answer every complete request buffered, in order.
                while let Step::Respond { response, consumed, close } =
                    http_step(&buf[..filled], &shared)
                {
                    stream.write_all(response).await?;
                    if close {
                        return Ok(());
                    }
                    buf.copy_within(consumed..filled, 0);
                    filled -= consumed;
                    if filled == 0 {
                        break;
                    }
                }
            }
        }
    }
}
