//! An echo server on every core.
//!
//! ```text
//! cargo run --release --example echo -- 127.0.0.1:7000
//! ```

use hotloop::net::{serve, ListenerOptions, TcpStream};
use hotloop::Runtime;

/// Writes back whatever the client sends, until it closes.
async fn echo(stream: TcpStream) {
    let mut buf = Vec::with_capacity(16 * 1024);
    loop {
        let (read, b) = stream.read_owned(buf).await;
        buf = b;
        match read {
            Ok(0) | Err(_) => return, // closed or reset: nothing left to do
            Ok(_) => {}
        }
        let (written, b) = stream.write_all_owned(buf).await;
        buf = b;
        if written.is_err() {
            return;
        }
    }
}

fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7000".into());
    let rt = Runtime::builder().build()?;
    let server = serve(rt.handle(), addr.as_str(), ListenerOptions::default(), echo)?;
    println!("echo server on {} with {} workers", server.local_addr(), rt.handle().workers());
    rt.block_on(server.stopped())
}
