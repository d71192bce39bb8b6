//! Task-local values: [`task_local!`](macro@crate::task_local) declares a key,
//! [`LocalKey::scope`] sets a value for one future, and code that future
//! runs reads it with [`LocalKey::with`] or [`LocalKey::get`], as with
//! tokio's `task_local!`.
//!
//! # Implementation notes
//! A key is a thread-local slot. A scope's future keeps its value while it
//! is not running, moves it into the slot for each poll of the inner
//! future and takes it back afterwards (also when the poll panics), so the
//! value is there exactly while that future runs, whichever other tasks the
//! worker runs between its polls. A task never leaves its worker, so a
//! thread-local is the task's for the length of a poll. A scope inside a
//! scope of the same key holds the outer value while the inner runs and
//! gives it back. The inner future is dropped inside the scope too, so its
//! destructors see the value. Tasks spawned from inside a scope do not
//! inherit it (as in tokio): scope their futures again.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Declares task-local keys: `static NAME: TYPE;`, each a [`LocalKey`].
///
/// ```
/// hotloop::task_local! {
///     static REQUEST_ID: u64;
/// }
///
/// # hotloop::Runtime::new()?.block_on(async {
/// let id = REQUEST_ID
///     .scope(7, async {
///         hotloop::task::yield_now().await;
///         REQUEST_ID.get()
///     })
///     .await;
/// assert_eq!(id, 7);
/// assert!(REQUEST_ID.try_with(|_| ()).is_err(), "no value outside the scope");
/// # });
/// # Ok::<(), std::io::Error>(())
/// ```
#[macro_export]
macro_rules! task_local {
    () => {};
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty; $($rest:tt)*) => {
        $crate::__task_local_inner!($(#[$attr])* $vis $name, $t);
        $crate::task_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty) => {
        $crate::__task_local_inner!($(#[$attr])* $vis $name, $t);
    };
}

/// The expansion of one key of [`task_local!`]; not a public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __task_local_inner {
    ($(#[$attr:meta])* $vis:vis $name:ident, $t:ty) => {
        $(#[$attr])*
        $vis static $name: $crate::task::LocalKey<$t> = {
            ::std::thread_local! {
                static __KEY: ::std::cell::RefCell<::std::option::Option<$t>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
            }
            $crate::task::LocalKey { inner: __KEY }
        };
    };
}

/// A key declared by [`task_local!`](macro@crate::task_local): a value each
/// [`scope`](LocalKey::scope) sets for the future it runs.
pub struct LocalKey<T: 'static> {
    /// The thread-local slot; built by the macro, not a public API.
    #[doc(hidden)]
    pub inner: std::thread::LocalKey<RefCell<Option<T>>>,
}

impl<T: 'static> LocalKey<T> {
    /// Runs `future` with the key set to `value`: each poll of `future`
    /// sees it, and so does its drop.
    pub fn scope<F: Future>(&'static self, value: T, future: F) -> TaskLocalFuture<T, F> {
        TaskLocalFuture { local: self, slot: Some(value), future: Some(future) }
    }

    /// Runs `f` with the key set to `value`, synchronously.
    ///
    /// # Panics
    /// If called inside [`with`](Self::with) of the same key.
    pub fn sync_scope<F, R>(&'static self, value: T, f: F) -> R
    where
        F: FnOnce() -> R,
    {
        let mut slot = Some(value);
        self.scope_inner(&mut slot, f).unwrap_or_else(|e| e.panic())
    }

    /// Calls `f` with the value of the current scope.
    ///
    /// # Panics
    /// Outside a scope of this key.
    pub fn with<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&T) -> R,
    {
        match self.try_with(f) {
            Ok(r) => r,
            Err(_) => panic!(
                "cannot access a task-local value outside its scope (LocalKey::scope or sync_scope)"
            ),
        }
    }

    /// Calls `f` with the value of the current scope; an error outside one.
    pub fn try_with<F, R>(&'static self, f: F) -> Result<R, AccessError>
    where
        F: FnOnce(&T) -> R,
    {
        let r = self.inner.try_with(|slot| match slot.try_borrow() {
            Ok(value) => value.as_ref().map(f),
            Err(_) => None,
        });
        match r {
            Ok(Some(r)) => Ok(r),
            _ => Err(AccessError { _private: () }),
        }
    }

    /// Moves `slot`'s value into the key for the call of `f`, and back
    /// after it (also if `f` panics).
    fn scope_inner<F, R>(&'static self, slot: &mut Option<T>, f: F) -> Result<R, ScopeError>
    where
        F: FnOnce() -> R,
    {
        /// Swaps the value back when the call ends, however it ends.
        struct Restore<'a, T: 'static> {
            key: &'static LocalKey<T>,
            slot: &'a mut Option<T>,
        }

        impl<T: 'static> Drop for Restore<'_, T> {
            fn drop(&mut self) {
                // The slot was borrowed for the swap in, and every borrow
                // taken since ended with the call: this one succeeds.
                let _ = self.key.inner.try_with(|cell| {
                    if let Ok(mut current) = cell.try_borrow_mut() {
                        std::mem::swap(self.slot, &mut *current);
                    }
                });
            }
        }

        self.inner
            .try_with(|cell| {
                cell.try_borrow_mut().map(|mut current| std::mem::swap(slot, &mut *current))
            })
            .map_err(|_| ScopeError::Gone)?
            .map_err(|_| ScopeError::Borrowed)?;
        let restore = Restore { key: self, slot };
        let r = f();
        drop(restore);
        Ok(r)
    }
}

impl<T: Clone + 'static> LocalKey<T> {
    /// A clone of the value of the current scope.
    ///
    /// # Panics
    /// Outside a scope of this key.
    pub fn get(&'static self) -> T {
        self.with(T::clone)
    }
}

impl<T: 'static> fmt::Debug for LocalKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("LocalKey { .. }")
    }
}

/// Why a scope could not be entered.
enum ScopeError {
    /// Inside [`LocalKey::with`] of the same key.
    Borrowed,
    /// The thread is ending and its thread-locals are gone.
    Gone,
}

impl ScopeError {
    #[track_caller]
    fn panic(self) -> ! {
        match self {
            ScopeError::Borrowed => panic!(
                "cannot enter a task-local scope while the task-local value is borrowed (inside `with`)"
            ),
            ScopeError::Gone => {
                panic!("cannot enter a task-local scope while the thread's locals are destroyed")
            }
        }
    }
}

/// The error of [`LocalKey::try_with`] outside a scope of the key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AccessError {
    _private: (),
}

impl fmt::Debug for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("AccessError")
    }
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("task-local value not set: outside its scope")
    }
}

impl std::error::Error for AccessError {}

pin_project_lite::pin_project! {
    /// The future of [`LocalKey::scope`]: `future` with the key's value
    /// set while it runs.
    pub struct TaskLocalFuture<T: 'static, F> {
        local: &'static LocalKey<T>,
        slot: Option<T>,
        #[pin]
        future: Option<F>,
    }

    impl<T: 'static, F> PinnedDrop for TaskLocalFuture<T, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let mut future = this.future;
            if future.is_some() {
                // Dropped inside the scope, so its destructors see the value;
                // dropped plainly if the scope cannot be entered.
                if this.local.scope_inner(this.slot, || future.set(None)).is_err() {
                    future.set(None);
                }
            }
        }
    }
}

impl<T: 'static, F> TaskLocalFuture<T, F> {
    /// The value, taken out of the scope (`None` if taken already or while
    /// the future runs).
    pub fn take_value(self: Pin<&mut Self>) -> Option<T> {
        self.project().slot.take()
    }
}

impl<T: 'static, F: Future> Future for TaskLocalFuture<T, F> {
    type Output = F::Output;

    #[track_caller]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let mut future = this.future;
        let polled = this.local.scope_inner(this.slot, || {
            let inner = future.as_mut().as_pin_mut()?;
            let res = inner.poll(cx);
            if res.is_ready() {
                // Dropped inside the scope, as a cancelled one would be.
                future.set(None);
            }
            Some(res)
        });
        match polled {
            Ok(Some(res)) => res,
            Ok(None) => panic!("a `TaskLocalFuture` was polled after it completed"),
            Err(e) => e.panic(),
        }
    }
}

impl<T: 'static + fmt::Debug, F> fmt::Debug for TaskLocalFuture<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskLocalFuture").field("value", &self.slot).finish_non_exhaustive()
    }
}
