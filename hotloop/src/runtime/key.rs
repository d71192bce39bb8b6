//! A task's identity on its worker. Apart from the task slab because
//! nearly every part of the runtime names it (the inbox a waker writes to,
//! the join slot that takes a task's panic, the run queue), while the slab
//! itself sits above most of them.

/// A task's identity on its worker: `generation << 32 | slot`.
pub(crate) type TaskKey = u64;
