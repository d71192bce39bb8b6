//! tokio's extension traits on hotloop streams by plain method calls:
//! `use tokio::io::{AsyncReadExt, AsyncWriteExt}` and then
//! `stream.write_all(b"..")`, `read_exact`, `read_to_end`, `flush`,
//! `shutdown()`, with the owned-buffer methods (`read_owned`,
//! `write_all_owned`, `shutdown_with`) beside them on the same stream.

use std::net::Shutdown;

use hotloop::net::{TcpListener, TcpStream, UnixStream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[hotloop::test(driver = "all")]
async fn tokio_ext_methods_work_on_a_tcp_stream() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (mut server, _) = listener.accept().await.unwrap();

    client.write_all(b"hello ").await.unwrap();
    client.write_all(b"world\n").await.unwrap();
    client.flush().await.unwrap();
    let mut head = [0u8; 6];
    server.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"hello ");
    let mut line = String::new();
    BufReader::new(&mut server).read_line(&mut line).await.unwrap();
    assert_eq!(line, "world\n");

    // The owned-buffer family on the same streams, no qualification needed.
    let (res, _) = server.write_all_owned(b"owned".to_vec()).await;
    res.unwrap();
    let mut got = [0u8; 5];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"owned");

    client.write_u32(7).await.unwrap();
    assert_eq!(server.read_u32().await.unwrap(), 7);

    // tokio's `shutdown()` ends the write side: the peer reads to the end.
    client.write_all(b"last").await.unwrap();
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"last");
}

#[hotloop::test(driver = "all")]
async fn tokio_ext_methods_work_on_a_unix_stream() {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    a.write_all(b"ping").await.unwrap();
    // An owned read and tokio's reads on the same stream.
    let (n, got) = b.read_owned(Vec::with_capacity(2)).await;
    assert_eq!((n.unwrap(), &got[..]), (2, &b"pi"[..]));
    let mut rest = [0u8; 2];
    b.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"ng");
    b.write_all(b"pong").await.unwrap();
    let mut reply = [0u8; 4];
    a.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"pong");
    a.shutdown_with(Shutdown::Write).await.unwrap();
    let mut tail = Vec::new();
    b.read_to_end(&mut tail).await.unwrap();
    assert!(tail.is_empty());
}
