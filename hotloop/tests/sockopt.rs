//! Socket options on both drivers: each set through the API, read back
//! through the API and, independently, through `getsockopt` on the raw
//! descriptor (`socket2::SockRef`); bad values are clear errors.

use std::io::ErrorKind;
use std::time::Duration;

use hotloop::net::{TcpKeepalive, TcpListener, TcpStream, UnixStream};
use hotloop::time::timeout;
use socket2::SockRef;

const LIMIT: Duration = Duration::from_secs(20);

/// `net.core.wmem_max`, the cap on `SO_SNDBUF`.
fn wmem_max() -> usize {
    std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(usize::MAX / 4)
}

/// A connected pair over loopback: (client, accepted).
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = hotloop::spawn(async move { TcpStream::connect(addr).await.unwrap() });
    let (server, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    (client.await.unwrap(), server)
}

#[hotloop::test(driver = "all")]
async fn nodelay_and_linger() {
    let (c, s) = tcp_pair().await;
    assert!(s.nodelay().unwrap(), "accepted sockets inherit the listener's TCP_NODELAY");
    c.set_nodelay(true).unwrap();
    assert!(c.nodelay().unwrap());
    assert!(SockRef::from(&c).tcp_nodelay().unwrap());
    c.set_nodelay(false).unwrap();
    assert!(!c.nodelay().unwrap());
    assert!(!SockRef::from(&c).tcp_nodelay().unwrap());

    assert_eq!(c.linger().unwrap(), None);
    c.set_linger(Some(Duration::from_secs(3))).unwrap();
    assert_eq!(c.linger().unwrap(), Some(Duration::from_secs(3)));
    assert_eq!(SockRef::from(&c).linger().unwrap(), Some(Duration::from_secs(3)));
    c.set_linger(None).unwrap();
    assert_eq!(SockRef::from(&c).linger().unwrap(), None);
}

#[hotloop::test(driver = "all")]
async fn keepalive_timings_read_back() {
    let (c, _s) = tcp_pair().await;
    assert_eq!(c.keepalive().unwrap(), None, "off by default");
    let ka = TcpKeepalive {
        idle: Some(Duration::from_secs(30)),
        interval: Some(Duration::from_secs(5)),
        retries: Some(4),
    };
    c.set_keepalive(Some(ka)).unwrap();
    assert_eq!(c.keepalive().unwrap(), Some(ka));
    let raw = SockRef::from(&c);
    assert!(raw.keepalive().unwrap());
    assert_eq!(raw.tcp_keepalive_time().unwrap(), Duration::from_secs(30));
    assert_eq!(raw.tcp_keepalive_interval().unwrap(), Duration::from_secs(5));
    assert_eq!(raw.tcp_keepalive_retries().unwrap(), 4);

    // A field left out keeps the kernel's value; a fraction rounds up.
    c.set_keepalive(Some(TcpKeepalive {
        idle: Some(Duration::from_millis(1500)),
        ..Default::default()
    }))
    .unwrap();
    let now = c.keepalive().unwrap().unwrap();
    assert_eq!(now.idle, Some(Duration::from_secs(2)));
    assert_eq!(now.interval, Some(Duration::from_secs(5)));
    assert_eq!(now.retries, Some(4));

    c.set_keepalive(None).unwrap();
    assert_eq!(c.keepalive().unwrap(), None);
    assert!(!raw.keepalive().unwrap());
}

#[hotloop::test(driver = "all")]
async fn keepalive_rejects_what_the_kernel_would() {
    let (c, _s) = tcp_pair().await;
    let bad = [
        TcpKeepalive { idle: Some(Duration::ZERO), ..Default::default() },
        TcpKeepalive { interval: Some(Duration::from_secs(40_000)), ..Default::default() },
        TcpKeepalive { retries: Some(0), ..Default::default() },
        TcpKeepalive { retries: Some(200), ..Default::default() },
    ];
    for ka in bad {
        let err = c.set_keepalive(Some(ka)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{ka:?}");
        assert!(err.to_string().contains("keepalive"), "the error names the option: {err}");
    }
    assert_eq!(c.keepalive().unwrap(), None, "a rejected value changes nothing");
}

#[hotloop::test(driver = "all")]
async fn buffer_sizes_read_back() {
    let (c, _s) = tcp_pair().await;
    c.set_send_buffer_size(64 * 1024).unwrap();
    let snd = c.send_buffer_size().unwrap();
    assert_eq!(snd, SockRef::from(&c).send_buffer_size().unwrap());
    // Linux doubles what it is given, within net.core.wmem_max.
    assert!(snd > 64 * 1024 || snd == 2 * wmem_max(), "send buffer {snd}");
    c.set_recv_buffer_size(32 * 1024).unwrap();
    let rcv = c.recv_buffer_size().unwrap();
    assert_eq!(rcv, SockRef::from(&c).recv_buffer_size().unwrap());
    assert_eq!(rcv, 64 * 1024, "recv buffer {rcv}: doubled");
    let err = c.set_send_buffer_size(usize::MAX).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);

    // The same on a Unix stream.
    let (a, _b) = UnixStream::pair().unwrap();
    a.set_send_buffer_size(16 * 1024).unwrap();
    let snd = a.send_buffer_size().unwrap();
    assert_eq!(snd, SockRef::from(&a).send_buffer_size().unwrap());
    assert_eq!(snd, 32 * 1024, "Linux doubles it");
    a.set_recv_buffer_size(16 * 1024).unwrap();
    assert_eq!(a.recv_buffer_size().unwrap(), SockRef::from(&a).recv_buffer_size().unwrap());
    assert_eq!(a.recv_buffer_size().unwrap(), 32 * 1024);
}

#[hotloop::test(driver = "all")]
async fn quickack_ttl_and_incoming_cpu() {
    let (c, s) = tcp_pair().await;
    c.set_quickack(true).unwrap();
    assert!(c.quickack().unwrap());
    assert!(SockRef::from(&c).tcp_quickack().unwrap());
    c.set_quickack(false).unwrap();
    assert!(!c.quickack().unwrap());
    assert!(!SockRef::from(&c).tcp_quickack().unwrap());

    c.set_ttl(42).unwrap();
    assert_eq!(c.ttl().unwrap(), 42);
    assert_eq!(SockRef::from(&c).ttl_v4().unwrap(), 42);

    // After a packet arrived, the kernel knows which CPU took it.
    c.write_all_owned(b"ping".to_vec()).await.0.unwrap();
    let (res, _) = timeout(LIMIT, s.read_owned(Vec::with_capacity(8))).await.unwrap();
    assert_eq!(res.unwrap(), 4);
    let cpu = s.incoming_cpu().unwrap().expect("a packet arrived");
    assert_eq!(cpu, SockRef::from(&s).cpu_affinity().unwrap());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpu < cpus.max(1024), "cpu {cpu}");
}

#[hotloop::test(driver = "all")]
async fn ttl_on_ipv6_is_the_hop_limit() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    };
    let addr = listener.local_addr().unwrap();
    let client = hotloop::spawn(async move { TcpStream::connect(addr).await.unwrap() });
    let (_s, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    let c = client.await.unwrap();
    c.set_ttl(17).unwrap();
    assert_eq!(c.ttl().unwrap(), 17);
    assert_eq!(SockRef::from(&c).unicast_hops_v6().unwrap(), 17);
}
