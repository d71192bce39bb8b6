//! The monoio peer: monoio's thread-per-core style, a runtime per worker
//! thread on io_uring, or on epoll (monoio's "legacy" driver) when the
//! kernel or a seccomp filter refuses io_uring.

use std::io;
use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

use super::{http_step, PeerProto, Shared, Step, READ_BUFFER_BYTES};

/// Submission queue entries per worker ring.
const RING_ENTRIES: u32 = 1024;

/// How long the accept loop backs off when accept fails (for example with
/// EMFILE), so a full file table does not turn into a busy loop.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 5;

/// Runs one worker on the calling thread until the process exits.
pub fn worker(index: usize, listener: std::net::TcpListener, shared: Shared) {
    let built = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .with_entries(RING_ENTRIES)
        .enable_timer()
        .build();
    let mut runtime = match built {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monoio peer worker {index}: cannot build the runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async move {
        let driver = if monoio::utils::is_legacy() { "epoll (legacy)" } else { "io_uring" };
        if index == 0 {
            eprintln!("monoio peer: {driver} driver");
        }
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("monoio peer worker {index}: cannot register the listener: {e}");
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
                monoio::spawn(async move {
                    // Errors end this connection only: resets are routine.
                    let _ = connection(stream, shared).await;
                });
            }
            Err(_) => monoio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await,
        }
    }
}

async fn connection(mut stream: TcpStream, shared: Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // The buffer is owned: each read hands it to the kernel and gets it back.
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
    match shared.proto {
        PeerProto::Hyper => {
            Err(io::Error::new(io::ErrorKind::Unsupported, "the hyper peer runs on tokio only"))
        }
        PeerProto::Echo => loop {
            buf.clear();
            let (res, read_back) = stream.read(buf).await;
            let n = res?;
            if n == 0 {
                return Ok(());
            }
            let (res, written_back) = stream.write_all(read_back).await;
            res?;
            buf = written_back;
        },
        PeerProto::Http => loop {
            // Read after what is already buffered; `len` marks the filled part.
            let filled = buf.len();
            let (res, slice) = stream.read(buf.slice_mut(filled..)).await;
            buf = slice.into_inner();
            if res? == 0 {
                return Ok(());
            }
            while let Step::Respond { response, consumed, close } = http_step(&buf, &shared) {
                let (res, _) = stream.write_all(response).await;
                res?;
                if close {
                    return Ok(());
                }
                buf.drain(..consumed);
                if buf.is_empty() {
                    break;
                }
            }
        },
    }
}
