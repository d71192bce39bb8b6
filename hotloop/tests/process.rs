//! Child processes: echo through `cat`, exit codes, a child that exits
//! before it is awaited, kill, kill-on-drop (the pid is gone afterwards),
//! many children at once, `output` with arguments, environment and
//! working directory, a clear error for a missing program, a slow reader
//! getting all its input, and dropped children reaped wherever they are
//! dropped.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use hotloop::process::{Command, Stdio};
use hotloop::task::JoinSet;
use hotloop::time::{sleep, timeout};
use hotloop::DriverKind;

/// The longest any child here may take.
const LIMIT: Duration = Duration::from_secs(15);

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

/// `status` with piped output does not keep the pipes open while it
/// waits (as tokio's and std's): a child writing more than a pipe holds
/// gets a broken pipe and ends, instead of blocking on the full pipe for
/// good.
#[hotloop::test(driver = "all")]
async fn status_with_piped_output_does_not_wait_on_a_full_pipe() {
    let status = timeout(
        LIMIT,
        Command::new("sh")
            .args(["-c", "head -c 4000000 /dev/zero"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .status(),
    )
    .await
    .expect("the child blocked on its full output pipe")
    .unwrap();
    assert!(!status.success(), "nothing read the output, so the child cannot have written it all");
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

/// A child that reads its input only after the send deadline of a write
/// the parent's stream no longer waits for (5 s on io_uring), then counts it.
const SLOW_COUNTER: &str = "sleep 6; wc -c";

/// Writes 64 KiB chunks to `stdin` (one `write` each, through tokio's
/// trait) until one takes longer than a moment, as a parent feeding a
/// child that does not read yet; returns how many bytes the writes
/// reported taken (on io_uring the last of them written behind, in user
/// space).
async fn fill(stdin: &mut hotloop::process::ChildStdin) -> usize {
    use tokio::io::AsyncWriteExt;
    let chunk = vec![7u8; 64 * 1024];
    let mut sent = 0;
    loop {
        match timeout(Duration::from_millis(200), stdin.write(&chunk)).await {
            Ok(n) => sent += n.unwrap(),
            Err(_) => return sent,
        }
    }
}

/// What the slow counter printed.
fn counted(stdout: &[u8]) -> usize {
    std::str::from_utf8(stdout).unwrap().trim().parse().unwrap()
}

/// How a parent ends a slow child's input and waits for it.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Drops the input (tokio's way to end it), then `wait_with_output`.
    DropThenWaitWithOutput,
    /// Drops the input, then `wait`; reads the output after.
    DropThenWait,
    /// Leaves the input in the `Child` to `wait_with_output`.
    LeaveToWaitWithOutput,
    /// Leaves the input in the `Child` to `wait`.
    LeaveToWait,
}

/// Feeds a slow counter as `ending` says; returns what the writes
/// reported taken and what the child counted.
async fn feed_slow_counter(ending: Ending) -> (usize, usize) {
    let mut child = Command::new("sh")
        .args(["-c", SLOW_COUNTER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sent = fill(child.stdin.as_mut().unwrap()).await;
    if matches!(ending, Ending::DropThenWaitWithOutput | Ending::DropThenWait) {
        drop(child.stdin.take());
    }
    let stdout = match ending {
        Ending::DropThenWaitWithOutput | Ending::LeaveToWaitWithOutput => {
            let out = timeout(LIMIT, child.wait_with_output()).await.unwrap().unwrap();
            assert!(out.status.success(), "{ending:?}");
            out.stdout
        }
        Ending::DropThenWait | Ending::LeaveToWait => {
            let stdout = child.stdout.take().unwrap();
            assert!(timeout(LIMIT, child.wait()).await.unwrap().unwrap().success(), "{ending:?}");
            let (n, line) =
                timeout(LIMIT, stdout.read_owned(Vec::with_capacity(64))).await.unwrap();
            n.unwrap();
            line
        }
    };
    (sent, counted(&stdout))
}

/// A child reading its input late gets every byte the parent's writes
/// reported taken, whether the parent dropped the input (tokio's way to
/// end it) before waiting or left it to `wait`/`wait_with_output`: on
/// io_uring the rest written behind is neither cut at the send deadline
/// into a short input with a clean end (a Unix stream has no reset to
/// tell a cut) nor left behind by the wait.
#[hotloop::test(driver = "all")]
async fn a_slow_reader_gets_every_byte_written_before_the_wait() {
    let endings = [
        Ending::DropThenWaitWithOutput,
        Ending::DropThenWait,
        Ending::LeaveToWaitWithOutput,
        Ending::LeaveToWait,
    ];
    let tasks: Vec<_> =
        endings.iter().map(|&e| (e, hotloop::spawn(feed_slow_counter(e)))).collect();
    for (ending, task) in tasks {
        let (sent, counted) = task.await.unwrap();
        assert_eq!(counted, sent, "{ending:?}: the child read less than was written");
    }
}

/// True while `pid` is still a child of this process: running, or a
/// zombie nobody reaped (its `/proc` entry, parent this process).
fn still_our_child(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (comm) state ppid ...`; comm may hold spaces, so after its `)`.
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let ppid: u32 = after_comm.split(' ').nth(1).unwrap().parse().unwrap();
    ppid == std::process::id()
}

/// Waits up to 2 s for `pid` to be reaped.
fn reaped_soon(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while still_our_child(pid) {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// `sleep 0.2`, its `Child` set to kill it when dropped (or not).
fn short_sleeper(kill_on_drop: bool) -> hotloop::process::Child {
    Command::new("sleep").arg("0.2").kill_on_drop(kill_on_drop).spawn().unwrap()
}

/// A `Child` held by a task when the runtime is dropped, on a worker and
/// on `block_on`'s context, killed on drop or left to exit: the process
/// is reaped soon after, not left a zombie for the rest of the parent's
/// life.
#[hotloop::test(driver = "all")]
fn a_child_dropped_with_its_runtime_is_reaped(driver: DriverKind) {
    for kill_on_drop in [true, false] {
        let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
        let (pid_tx, pid_rx) = std::sync::mpsc::channel();
        drop(rt.handle().spawn_on(0, move || async move {
            let child = short_sleeper(kill_on_drop);
            pid_tx.send(child.id().unwrap()).unwrap();
            std::future::pending::<()>().await;
            drop(child);
        }));
        let on_worker = pid_rx.recv_timeout(LIMIT).unwrap();
        let on_block_on = rt.block_on(async {
            let child = short_sleeper(kill_on_drop);
            let pid = child.id().unwrap();
            hotloop::spawn(async move {
                std::future::pending::<()>().await;
                drop(child);
            });
            pid
        });
        drop(rt);
        assert!(reaped_soon(on_worker), "kill_on_drop {kill_on_drop}: a worker's child");
        assert!(reaped_soon(on_block_on), "kill_on_drop {kill_on_drop}: block_on's child");
    }
}

/// A `Child` dropped on `block_on`'s context that is not entered again,
/// or outside any worker, is reaped while the runtime lives on.
#[hotloop::test(driver = "all")]
fn a_child_dropped_where_no_worker_runs_is_reaped(driver: DriverKind) {
    let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (in_block_on, carried_out) = rt.block_on(async {
        let dropped = short_sleeper(true);
        let pid = dropped.id().unwrap();
        drop(dropped);
        (pid, short_sleeper(true))
    });
    let outside = carried_out.id().unwrap();
    drop(carried_out);
    assert!(reaped_soon(in_block_on), "dropped on block_on's context");
    assert!(reaped_soon(outside), "dropped outside any worker");
    drop(rt);
}
