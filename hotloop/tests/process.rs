//! Child processes: echo through `cat`, exit codes, a child that exits
//! before it is awaited, kill, kill-on-drop (the pid is gone afterwards),
//! many children at once, `output` with arguments, environment and
//! working directory, and a clear error for a missing program.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use hotloop::process::{Command, Stdio};
use hotloop::task::JoinSet;
use hotloop::time::{sleep, timeout};

/// The longest any child here may take.
const LIMIT: Duration = Duration::from_secs(10);

#[hotloop::test(driver = "all")]
async fn echoes_through_cat() {
    let mut child =
        Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut echoed = Vec::new();
    for line in ["one\n", "two\n", "three\n"] {
        let (res, _) = stdin.write_all_owned(line.as_bytes().to_vec()).await;
        res.unwrap();
        while echoed.len() < line.len() {
            let (n, buf) = timeout(LIMIT, stdout.read_owned(Vec::with_capacity(64))).await.unwrap();
            assert!(n.unwrap() > 0, "cat ended early");
            echoed.extend_from_slice(&buf);
        }
        assert_eq!(echoed, line.as_bytes());
        echoed.clear();
    }
    drop(stdin); // cat sees the end of its input and exits
    let (n, _) = timeout(LIMIT, stdout.read_owned(Vec::with_capacity(64))).await.unwrap();
    assert_eq!(n.unwrap(), 0, "cat's output ends when it exits");
    let status = timeout(LIMIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
}

#[hotloop::test(driver = "all")]
async fn reports_exit_codes() {
    for code in [0, 1, 3, 42, 255] {
        let status =
            timeout(LIMIT, Command::new("sh").arg("-c").arg(format!("exit {code}")).status())
                .await
                .unwrap()
                .unwrap();
        assert_eq!(status.code(), Some(code));
    }
}

#[hotloop::test(driver = "all")]
async fn a_child_that_exited_before_the_wait_is_reaped() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id().unwrap();
    // Long enough for `true` to have exited (its pidfd is readable before the first wait).
    sleep(Duration::from_millis(200)).await;
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "a zombie until waited for");
    let status = timeout(LIMIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success());
    assert_eq!(child.id(), None, "no id once waited for");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "reaped");
    // Waiting again gives the same status.
    assert_eq!(child.wait().await.unwrap(), status);
}

#[hotloop::test(driver = "all")]
async fn kill_ends_a_running_child() {
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    assert_eq!(child.try_wait().unwrap(), None, "still running");
    timeout(LIMIT, child.kill()).await.unwrap().unwrap();
    let status = child.wait().await.unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
}

#[hotloop::test(driver = "all")]
async fn kill_on_drop_kills_and_reaps() {
    let child = Command::new("sleep").arg("60").kill_on_drop(true).spawn().unwrap();
    let pid = child.id().unwrap();
    let proc_entry = format!("/proc/{pid}");
    drop(child);
    // Killed, and then reaped by a task on this worker: the pid is gone.
    let gone = timeout(LIMIT, async {
        while std::path::Path::new(&proc_entry).exists() {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "pid {pid} still exists after its Child was dropped");
}

#[hotloop::test(driver = "all")]
async fn runs_many_children_at_once() {
    const CHILDREN: i32 = 64;
    let mut set = JoinSet::new();
    for i in 0..CHILDREN {
        set.spawn(async move {
            let status =
                Command::new("sh").arg("-c").arg(format!("sleep 0.05; exit {i}")).status().await;
            (i, status.unwrap().code())
        });
    }
    let mut seen = 0;
    while let Some(r) = timeout(LIMIT, set.join_next()).await.unwrap() {
        let (i, code) = r.unwrap();
        assert_eq!(code, Some(i));
        seen += 1;
    }
    assert_eq!(seen, CHILDREN);
}

#[hotloop::test(driver = "all")]
async fn output_collects_both_streams_with_env_and_dir() {
    let out = timeout(
        LIMIT,
        Command::new("sh")
            .args(["-c", "echo \"$GREETING\"; pwd; echo oops >&2; exit 2"])
            .env("GREETING", "hello")
            .current_dir("/")
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stdout, b"hello\n/\n");
    assert_eq!(out.stderr, b"oops\n");
}

#[hotloop::test(driver = "all")]
async fn large_output_on_both_streams_does_not_deadlock() {
    // 1 MiB on each stream, more than any socket buffer holds.
    let script = "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2";
    let out =
        timeout(LIMIT, Command::new("sh").args(["-c", script]).output()).await.unwrap().unwrap();
    assert!(out.status.success());
    assert_eq!((out.stdout.len(), out.stderr.len()), (1 << 20, 1 << 20));
}

#[hotloop::test(driver = "all")]
async fn a_missing_program_is_a_clear_error() {
    let err = Command::new("hotloop-no-such-program").spawn().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    let msg = err.to_string();
    assert!(msg.contains("hotloop-no-such-program") && msg.contains("PATH"), "{msg}");
    // Nothing leaked: the next spawn works.
    assert!(Command::new("true").status().await.unwrap().success());
}

/// Waiting parks on the pidfd: the waiting task is not polled over and
/// over while the child runs.
#[hotloop::test(driver = "all")]
async fn waiting_parks_instead_of_spinning() {
    let mut child = Command::new("sleep").arg("0.3").spawn().unwrap();
    let before = hotloop::Handle::current().stats().total.tasks_polled;
    timeout(LIMIT, child.wait()).await.unwrap().unwrap();
    let polls = hotloop::Handle::current().stats().total.tasks_polled - before;
    // A handful of polls (the first, the wake at exit); a spin would be thousands.
    assert!(polls < 20, "the waiting task was polled {polls} times");
}

/// Outside a worker, spawning is an error, and no process is started.
#[test]
fn spawning_outside_a_worker_is_an_error() {
    let err = Command::new("true").spawn().unwrap_err();
    assert!(err.to_string().contains("hotloop worker"), "{err}");
}
