//! `task_local!`: a value set by `scope` for one future, seen by every poll
//! of it and by nothing else, whichever tasks the worker runs between its
//! polls.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

hotloop::task_local! {
    static REQUEST: u32;
    /// A documented key with a non-`Copy` value.
    pub static NAME: String;
}

#[hotloop::test(driver = "all")]
async fn each_task_sees_its_own_value_across_awaits() {
    let mut tasks = Vec::new();
    for id in 0..8u32 {
        tasks.push(hotloop::spawn(REQUEST.scope(id, async move {
            let mut seen = Vec::new();
            for _ in 0..5 {
                // Other tasks run between these polls, each with its own value.
                hotloop::time::sleep(Duration::from_millis(1)).await;
                hotloop::task::yield_now().await;
                seen.push(REQUEST.get());
            }
            (id, seen)
        })));
    }
    for t in tasks {
        let (id, seen) = t.await.unwrap();
        assert_eq!(seen, vec![id; 5]);
    }
    assert!(REQUEST.try_with(|_| ()).is_err(), "the value leaked out of its scope");
}

#[hotloop::test(driver = "all")]
async fn nested_scopes_restore_the_outer_value() {
    let outer = REQUEST
        .scope(1, async {
            let inner = REQUEST
                .scope(2, async {
                    hotloop::task::yield_now().await;
                    REQUEST.get()
                })
                .await;
            (inner, REQUEST.get())
        })
        .await;
    assert_eq!(outer, (2, 1));
    let synced = NAME.sync_scope("a".to_string(), || {
        NAME.sync_scope("b".to_string(), || NAME.with(|n| n.clone())) + &NAME.get()
    });
    assert_eq!(synced, "ba");
    assert!(NAME.try_with(|_| ()).is_err());
}

#[hotloop::test(driver = "all")]
async fn a_scope_dropped_unfinished_drops_its_future_inside_the_scope() {
    struct ReadsOnDrop(Rc<Cell<Option<u32>>>);
    impl Drop for ReadsOnDrop {
        fn drop(&mut self) {
            self.0.set(REQUEST.try_with(|v| *v).ok());
        }
    }
    let seen = Rc::new(Cell::new(None));
    let guard = ReadsOnDrop(seen.clone());
    let mut scoped = Box::pin(REQUEST.scope(9, async move {
        let _guard = guard;
        std::future::pending::<()>().await
    }));
    let waker = std::task::Waker::noop();
    assert!(scoped.as_mut().poll(&mut std::task::Context::from_waker(waker)).is_pending());
    drop(scoped);
    assert_eq!(seen.get(), Some(9), "the future's destructor ran outside the scope");
    // Between polls the value is the scope's own, and can be taken back.
    let mut unpolled = Box::pin(REQUEST.scope(4, async {}));
    assert_eq!(unpolled.as_mut().take_value(), Some(4));
}

#[test]
fn with_outside_a_scope_panics_with_the_reason() {
    let err = std::panic::catch_unwind(|| REQUEST.with(|v| *v)).unwrap_err();
    let msg = err.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(msg.contains("outside its scope"), "{msg}");
}
