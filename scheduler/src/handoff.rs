//! The hand-off from the coordinator to one worker: a lock-free queue of what the scheduler
//! dispatched to that worker ([`crate::Scheduler::next`], up to
//! [`crate::SchedulerConfig::depth`] at once), and the wake-up that goes with it.
//!
//! The coordinator pushes; the worker takes, in push order. Neither ever takes a lock: the
//! queue is crossbeam's `SegQueue`, the wake-up is the worker thread's park token (a
//! `push` after the worker found the queue empty unparks it, and a token left by an unpark
//! that came before its `park` makes that `park` return at once, so no wake-up is lost). A
//! worker that holds a monotask ahead starts it the moment it finishes the one before,
//! without a round trip through the coordinator.
//!
//! ```
//! use std::sync::Arc;
//! use flashdiff_scheduler::HandOff;
//!
//! let h = Arc::new(HandOff::new());
//! let worker = {
//!     let h = h.clone();
//!     std::thread::spawn(move || {
//!         let mut got = Vec::new();
//!         while let Some(x) = h.take() {
//!             got.push(x);
//!         }
//!         got
//!     })
//! };
//! h.set_consumer(worker.thread().clone());
//! for x in 0..100 {
//!     h.push(x);
//! }
//! h.close();
//! assert_eq!(worker.join().unwrap(), (0..100).collect::<Vec<_>>());
//! ```

use sync::{park, AtomicBool, Once, Ordering, Queue, Thread};

/// What the hand-off is built of. Under `--cfg loom` (the model check in
/// `tests/loom.rs`) loom's atomics, threads and park tokens stand in for std's, and a loom
/// mutex for crossbeam's queue (whose own linearisability is crossbeam's to test), so that
/// loom explores every interleaving of the wake-up protocol.
#[cfg(not(loom))]
mod sync {
    pub use std::sync::atomic::{AtomicBool, Ordering};
    pub use std::thread::{park, Thread};

    pub type Queue<T> = crossbeam_queue::SegQueue<T>;

    /// A value set once; reading it is one atomic load.
    #[derive(Debug)]
    pub struct Once<T>(std::sync::OnceLock<T>);

    impl<T> Once<T> {
        pub fn new() -> Self {
            Self(std::sync::OnceLock::new())
        }
        pub fn set(&self, v: T) {
            let _ = self.0.set(v);
        }
        pub fn with(&self, f: impl FnOnce(&T)) {
            if let Some(v) = self.0.get() {
                f(v)
            }
        }
    }
}

#[cfg(loom)]
mod sync {
    pub use loom::sync::atomic::{AtomicBool, Ordering};
    pub use loom::thread::{park, Thread};
    use std::collections::VecDeque;

    /// SegQueue's interface over a loom mutex.
    #[derive(Debug)]
    pub struct Queue<T>(loom::sync::Mutex<VecDeque<T>>);

    impl<T> Queue<T> {
        pub fn new() -> Self {
            Self(loom::sync::Mutex::new(VecDeque::new()))
        }
        pub fn push(&self, v: T) {
            self.0.lock().unwrap().push_back(v)
        }
        pub fn pop(&self) -> Option<T> {
            self.0.lock().unwrap().pop_front()
        }
        pub fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub fn is_empty(&self) -> bool {
            self.0.lock().unwrap().is_empty()
        }
    }

    #[derive(Debug)]
    pub struct Once<T>(loom::sync::Mutex<Option<T>>);

    impl<T> Once<T> {
        pub fn new() -> Self {
            Self(loom::sync::Mutex::new(None))
        }
        pub fn set(&self, v: T) {
            let mut g = self.0.lock().unwrap();
            if g.is_none() {
                *g = Some(v);
            }
        }
        pub fn with(&self, f: impl FnOnce(&T)) {
            if let Some(v) = self.0.lock().unwrap().as_ref() {
                f(v)
            }
        }
    }
}

/// A lock-free hand-off queue with park/unpark wake-ups: any number of threads may push
/// or `try_take`; one thread, the consumer, `take`s (parks while it is empty).
#[derive(Debug)]
pub struct HandOff<T> {
    queue: Queue<T>,
    /// The thread that takes: unparked after every push.
    consumer: Once<Thread>,
    closed: AtomicBool,
}

impl<T> Default for HandOff<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> HandOff<T> {
    /// An empty, open hand-off with no consumer yet.
    pub fn new() -> Self {
        Self {
            queue: Queue::new(),
            consumer: Once::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Names the thread that takes (the first call wins). Call it before the first `push`
    /// (right after spawning the worker): a push before it wakes nobody, and a consumer
    /// already parked would sleep through it.
    pub fn set_consumer(&self, t: Thread) {
        self.consumer.set(t);
    }

    /// Appends `item` and wakes the consumer. Never blocks.
    pub fn push(&self, item: T) {
        self.queue.push(item);
        self.consumer.with(Thread::unpark);
    }

    /// Ends the hand-off: the consumer's `take` returns what is still queued, then `None`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.consumer.with(Thread::unpark);
    }

    /// Whether [`HandOff::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The next item without waiting.
    pub fn try_take(&self) -> Option<T> {
        self.queue.pop()
    }

    /// The next item, parking the calling thread while the queue is empty; `None` once the
    /// hand-off is closed and drained. Only the consumer ([`HandOff::set_consumer`]) may
    /// call it: pushes and close wake that thread alone, so another could sleep for ever
    /// (other threads use [`HandOff::try_take`]).
    pub fn take(&self) -> Option<T> {
        loop {
            if let Some(x) = self.queue.pop() {
                return Some(x);
            }
            if self.is_closed() {
                // Pushed before the close, seen after it.
                return self.queue.pop();
            }
            // A push or close since the pop above left an unpark token: this returns at
            // once. Spurious returns go round the loop.
            park();
        }
    }

    /// Items queued (a snapshot).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
