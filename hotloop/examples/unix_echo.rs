//! An echo server on a Unix domain socket, and a client that talks to it,
//! in one program.
//!
//! ```text
//! cargo run --example unix_echo
//! ```
//!
//! The server listens on a socket file in the temporary directory. The
//! client connects, sends one line, prints what comes back, and the
//! program exits. To serve many clients on every core, use
//! `hotloop::net::serve_unix(handle, path, options, echo)` instead of the
//! single accept below.

use std::io;
use std::net::Shutdown;

use hotloop::net::{UnixListener, UnixStream};

/// Writes back whatever the client sends, until it closes its side.
async fn echo(stream: UnixStream) {
    let mut buf = Vec::with_capacity(16 * 1024);
    loop {
        // Owned buffers: the buffer goes into the read and comes back with its result.
        let (read, b) = stream.read_owned(buf).await;
        buf = b;
        match read {
            Ok(0) | Err(_) => return, // the client is done (or gone)
            Ok(_) => {}
        }
        let (written, b) = stream.write_all_owned(buf).await;
        buf = b;
        if written.is_err() {
            return;
        }
    }
}

#[hotloop::main(workers = 1)]
async fn main() -> io::Result<()> {
    // A socket path is a file name. Binding fails if the file exists, and
    // nothing removes it when the listener closes, so the program removes
    // it itself at the end.
    let path = std::env::temp_dir().join(format!("hotloop-echo-{}.sock", std::process::id()));
    let listener = UnixListener::bind(&path)?;
    println!("echo server on {}", path.display());

    // The server: a task on this worker that takes one connection and echoes it.
    let server = hotloop::spawn(async move {
        let (stream, _peer) = listener.accept().await?;
        echo(stream).await;
        io::Result::Ok(())
    });

    // The client: connect, send a line, and say we are done sending, so the
    // server's read sees the end and it closes after echoing.
    let client = UnixStream::connect(&path).await?;
    let (sent, _) = client.write_all_owned(b"hello over a Unix socket\n".to_vec()).await;
    sent?;
    client.shutdown_with(Shutdown::Write).await?;

    // Read until the server closes.
    let mut reply = Vec::new();
    loop {
        let (read, buf) = client.read_owned(Vec::with_capacity(1024)).await;
        if read? == 0 {
            break;
        }
        reply.extend_from_slice(&buf);
    }
    print!("echoed: {}", String::from_utf8_lossy(&reply));

    // The server's own result, once its task ended (a panic would be a JoinError).
    server.await.map_err(|e| io::Error::other(e.to_string()))??;
    std::fs::remove_file(&path)
}
