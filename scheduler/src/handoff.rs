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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

use crossbeam_queue::SegQueue;

/// A lock-free single-consumer hand-off queue with park/unpark wake-ups (any number of
/// producers may push; one thread takes).
#[derive(Debug)]
pub struct HandOff<T> {
    queue: SegQueue<T>,
    /// The thread that takes: unparked after every push.
    consumer: OnceLock<Thread>,
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
            queue: SegQueue::new(),
            consumer: OnceLock::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Names the thread that takes (the first call wins). Call it before the first `push`
    /// (right after spawning the worker): a push before it wakes nobody, and a consumer
    /// already parked would sleep through it.
    pub fn set_consumer(&self, t: Thread) {
        let _ = self.consumer.set(t);
    }

    /// Appends `item` and wakes the consumer. Never blocks.
    pub fn push(&self, item: T) {
        self.queue.push(item);
        if let Some(t) = self.consumer.get() {
            t.unpark();
        }
    }

    /// Ends the hand-off: the consumer's `take` returns what is still queued, then `None`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(t) = self.consumer.get() {
            t.unpark();
        }
    }

    /// Whether [`HandOff::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The next item without waiting.
    pub fn try_take(&self) -> Option<T> {
        self.queue.pop()
    }

    /// The next item, parking the calling thread (the consumer) while the queue is empty;
    /// `None` once the hand-off is closed and drained.
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
            std::thread::park();
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
