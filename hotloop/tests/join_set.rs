//! `JoinSet`: many tasks joined, results in the order the tasks finish, a
//! panic reported as `JoinError`, `abort_all`, `shutdown`, and a dropped
//! set aborting its tasks (their destructors run).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use hotloop::task::JoinSet;
use hotloop::time::{sleep, timeout};

/// Records its name in a shared log when dropped.
struct OnDrop(&'static str, Rc<RefCell<Vec<&'static str>>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.1.borrow_mut().push(self.0);
    }
}

#[hotloop::test(driver = "all")]
async fn joins_many_tasks() {
    let mut set = JoinSet::new();
    for i in 0..1000u64 {
        set.spawn(async move {
            hotloop::yield_now().await;
            i
        });
    }
    assert_eq!(set.len(), 1000);
    let mut seen = vec![false; 1000];
    while let Some(result) = set.join_next().await {
        let i = result.expect("no task fails") as usize;
        assert!(!seen[i], "task {i} joined twice");
        seen[i] = true;
    }
    assert!(seen.iter().all(|s| *s));
    assert!(set.is_empty());
    assert!(set.join_next().await.is_none(), "an empty set gives None");
}

#[hotloop::test(driver = "all")]
async fn results_come_in_the_order_tasks_finish() {
    let mut set = JoinSet::new();
    // Spawned slowest first: the join order must be the finish order, not the spawn order.
    for ms in [60u64, 40, 20, 0] {
        set.spawn(async move {
            sleep(Duration::from_millis(ms)).await;
            ms
        });
    }
    let mut order = Vec::new();
    while let Some(result) = set.join_next().await {
        order.push(result.unwrap());
    }
    assert_eq!(order, [0, 20, 40, 60]);
}

#[hotloop::test(driver = "all")]
async fn a_panicking_task_gives_a_join_error_and_the_others_still_join() {
    let mut set = JoinSet::new();
    set.spawn(async { 1u32 });
    set.spawn(async {
        hotloop::yield_now().await;
        panic!("boom")
    });
    set.spawn(async { 3u32 });
    let (mut ok, mut panicked) = (Vec::new(), 0);
    while let Some(result) = set.join_next().await {
        match result {
            Ok(v) => ok.push(v),
            Err(e) => {
                assert!(e.is_panic(), "{e:?}");
                panicked += 1;
            }
        }
    }
    ok.sort();
    assert_eq!((ok, panicked), (vec![1, 3], 1));
}

#[hotloop::test(driver = "all")]
async fn dropping_the_set_aborts_its_tasks() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut set = JoinSet::new();
    for name in ["a", "b", "c"] {
        let guard = OnDrop(name, log.clone());
        set.spawn(async move {
            let _guard = guard;
            sleep(Duration::from_secs(60)).await;
        });
    }
    // Let each task start and park on its sleep.
    hotloop::yield_now().await;
    assert!(log.borrow().is_empty());
    drop(set);
    // As tokio's: aborted at once, their futures dropped at their turn on
    // the worker (not inside the drop, which may hold borrows they take).
    hotloop::yield_now().await;
    let mut dropped = log.borrow().clone();
    dropped.sort();
    assert_eq!(dropped, ["a", "b", "c"], "every task's future was dropped after the set");
}

#[hotloop::test(driver = "all")]
async fn abort_all_and_shutdown_cancel_running_tasks() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut set = JoinSet::new();
    set.spawn(async { 7u32 });
    for name in ["x", "y"] {
        let guard = OnDrop(name, log.clone());
        set.spawn(async move {
            let _guard = guard;
            sleep(Duration::from_secs(60)).await;
            0
        });
    }
    sleep(Duration::from_millis(5)).await;
    set.abort_all();
    let mut results = Vec::new();
    while let Some(r) = timeout(Duration::from_secs(5), set.join_next()).await.unwrap() {
        results.push(r.map_err(|e| e.is_cancelled()));
    }
    results.sort();
    assert_eq!(results, [Ok(7), Err(true), Err(true)]);
    assert_eq!(log.borrow().len(), 2);

    let guard = OnDrop("z", log.clone());
    set.spawn(async move {
        let _guard = guard;
        sleep(Duration::from_secs(60)).await;
        0
    });
    timeout(Duration::from_secs(5), set.shutdown()).await.expect("shutdown does not hang");
    assert!(set.is_empty());
    assert_eq!(log.borrow().last(), Some(&"z"));
}

#[hotloop::test(driver = "all")]
async fn try_join_next_and_join_all() {
    let mut set = JoinSet::new();
    assert!(set.try_join_next().is_none());
    set.spawn(async { 1u8 });
    assert!(set.try_join_next().is_none(), "the task has not run yet");
    hotloop::yield_now().await;
    assert_eq!(set.try_join_next().map(Result::unwrap), Some(1));
    for i in 0..5u8 {
        set.spawn(async move { i });
    }
    let mut all = set.join_all().await;
    all.sort();
    assert_eq!(all, [0, 1, 2, 3, 4]);
}
