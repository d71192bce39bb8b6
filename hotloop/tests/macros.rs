//! `#[hotloop::test]` and `#[hotloop::main]`: the driver matrix, options,
//! return types and attributes that pass through.

use std::io::{Read, Write};
use std::time::Duration;

use hotloop::net::{TcpListener, TcpStream};
use hotloop::{DriverKind, Handle, Runtime};

/// The driver the current runtime's workers use, as the stats report it.
fn current_driver() -> &'static str {
    Handle::current().stats().info.driver
}

#[hotloop::test]
async fn runs_the_body_on_a_worker() {
    let h = hotloop::spawn(async { 40 + 2 });
    assert_eq!(h.await.unwrap(), 42);
    hotloop::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(Handle::current().workers(), 1, "tests get one worker by default");
}

#[hotloop::test(driver = "all")]
async fn one_test_per_driver(driver: DriverKind) {
    let expected = match driver {
        DriverKind::Epoll => "epoll",
        DriverKind::Uring => "uring",
        DriverKind::Auto => unreachable!("`all` names each driver"),
    };
    assert_eq!(current_driver(), expected);

    // I/O works on that driver: a round trip through a hotloop listener.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"ping").unwrap();
        let mut out = [0u8; 4];
        s.read_exact(&mut out).unwrap();
        out
    });
    let (stream, _) = listener.accept().await.unwrap();
    let (n, buf) = stream.read_owned(Vec::with_capacity(16)).await;
    assert_eq!(n.unwrap(), 4);
    let (res, _) = stream.write_all_owned(buf).await;
    res.unwrap();
    assert_eq!(&client.join().unwrap(), b"ping");
}

#[hotloop::test(driver = "epoll", workers = 3)]
async fn driver_and_workers_options() {
    assert_eq!(current_driver(), "epoll");
    assert_eq!(Handle::current().workers(), 3);
    let out = Handle::current().spawn_on(2, || async { 7 }).await.unwrap();
    assert_eq!(out, 7);
}

#[hotloop::test(driver = "uring")]
async fn uring_only_skips_where_the_kernel_cannot() {
    assert_eq!(current_driver(), "uring");
}

#[hotloop::test]
async fn a_result_test_may_use_question_mark() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let connecting = hotloop::spawn(TcpStream::connect(addr));
    let (_accepted, _) = listener.accept().await?;
    let _connected = connecting.await.expect("connect task")?;
    Ok(())
}

#[hotloop::test]
#[should_panic(expected = "boom")]
async fn should_panic_passes_through() {
    panic!("boom");
}

#[hotloop::test(driver = "all")]
#[ignore = "shows that #[ignore] reaches both generated tests"]
async fn ignore_passes_through() {
    panic!("ignored tests do not run");
}

/// A plain `fn` with `driver = "all"` runs once per driver and gets no
/// runtime: it builds its own, here with two workers.
#[hotloop::test(driver = "all")]
fn a_plain_fn_runs_once_per_driver_on_runtimes_it_builds(driver: DriverKind) {
    let expected = match driver {
        DriverKind::Epoll => "epoll",
        DriverKind::Uring => "uring",
        DriverKind::Auto => unreachable!("`all` names each driver"),
    };
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    assert_eq!(rt.stats().info.driver, expected);
    let from_worker = rt.block_on(async { Handle::current().spawn_on(1, || async { 7 }).await });
    assert_eq!(from_worker.unwrap(), 7);
}

#[hotloop::test(driver = "all")]
fn a_plain_fn_may_return_a_result(driver: DriverKind) -> std::io::Result<()> {
    let rt = Runtime::builder().workers(1).driver(driver).build()?;
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        std::net::TcpStream::connect(listener.local_addr()?)?;
        Ok(())
    })
}

/// Where io_uring cannot run, `HOTLOOP_REQUIRE_URING=1` turns the skip into
/// a failure: run the uring variant in a child process with it set.
#[test]
fn require_uring_fails_instead_of_skipping() {
    if hotloop::runtime::uring_available().is_ok() {
        eprintln!(
            "io_uring runs here, so nothing is skipped; one_test_per_driver::uring checked it"
        );
        return;
    }
    // An `async fn` test, and a plain `fn` one.
    for test in [
        "uring_only_skips_where_the_kernel_cannot",
        "a_plain_fn_runs_once_per_driver_on_runtimes_it_builds::uring",
    ] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &harness_name(test), "--test-threads", "1"])
            .env("HOTLOOP_REQUIRE_URING", "1")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{test} must fail when io_uring is required");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("HOTLOOP_REQUIRE_URING=1"), "{text}");
    }
}

/// A `#[should_panic]` test on both drivers: the harness checks the epoll
/// variant's panic, the io_uring variant checks its own.
#[hotloop::test(driver = "all")]
#[should_panic(expected = "boom on")]
async fn should_panic_on_every_driver(driver: DriverKind) {
    panic!("boom on {driver:?}");
}

/// The same without an expected message, as a plain `fn`.
#[hotloop::test(driver = "all")]
#[should_panic]
fn should_panic_without_a_message(_driver: DriverKind) {
    panic!("any message");
}

/// Run in a child process by `should_panic_on_uring_is_skipped_not_failed`:
/// it must fail, since it does not panic.
#[hotloop::test(driver = "uring")]
#[should_panic(expected = "boom")]
#[ignore = "run in a child process, where it must fail"]
async fn should_panic_that_does_not() {}

/// As above: it must fail, since its panic has another message.
#[hotloop::test(driver = "uring")]
#[should_panic = "boom"]
#[ignore = "run in a child process, where it must fail"]
async fn should_panic_with_another_message() {
    panic!("bang");
}

/// Where the io_uring variant of a `#[should_panic]` test is skipped (here
/// because `HOTLOOP_DRIVER=epoll` forces epoll, as it would be where the
/// kernel cannot run io_uring), it passes without running and says so, as
/// every skipped test does; before, the harness failed it with "did not
/// panic". With `HOTLOOP_REQUIRE_URING=1` it fails; before, a bare
/// `#[should_panic]` took that failure's panic for the expected one and
/// passed. Where io_uring runs, a panic that does not come, or comes with
/// another message, fails the variant.
#[test]
fn should_panic_on_uring_is_skipped_not_failed() {
    let run = |test: &str, env: &[(&str, &str)]| {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args(["--exact", &harness_name(test), "--include-ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env_remove("HOTLOOP_DRIVER")
            .env_remove("HOTLOOP_REQUIRE_URING")
            .envs(env.iter().copied());
        let out = child.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success() && text.contains("1 passed"), text)
    };
    let forced = [("HOTLOOP_DRIVER", "epoll")];
    let required = [("HOTLOOP_DRIVER", "epoll"), ("HOTLOOP_REQUIRE_URING", "1")];
    for test in ["should_panic_on_every_driver::uring", "should_panic_without_a_message::uring"] {
        let (passed, text) = run(test, &forced);
        assert!(passed, "{test}: a skip must pass:\n{text}");
        assert!(text.contains("skipped on io_uring: HOTLOOP_DRIVER=epoll"), "{test}:\n{text}");
        let (passed, text) = run(test, &required);
        assert!(!passed, "{test}: a skip under HOTLOOP_REQUIRE_URING=1 must fail:\n{text}");
        assert!(text.contains("HOTLOOP_REQUIRE_URING=1, but io_uring cannot run"), "{text}");
    }
    if hotloop::runtime::uring_available().is_err() {
        eprintln!("io_uring cannot run here: its variants' own panic checks were not run");
        return;
    }
    for test in ["should_panic_on_every_driver::uring", "should_panic_without_a_message::uring"] {
        let (passed, text) = run(test, &[]);
        assert!(passed, "{test} panics as expected:\n{text}");
    }
    for (test, says) in [
        ("should_panic_that_does_not", "did not panic"),
        ("should_panic_with_another_message", "did not contain the expected string"),
    ] {
        let (passed, text) = run(test, &[]);
        assert!(!passed, "{test} must fail:\n{text}");
        assert!(text.contains(says), "{test}:\n{text}");
    }
}

/// The name the test harness knows `name` by: prefixed with this file's
/// module path below the test crate (`file::name` in `tests/suite.rs`, just
/// `name` in a binary of its own), for running one test in a child.
fn harness_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
