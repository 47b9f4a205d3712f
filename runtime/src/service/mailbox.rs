//! Results by request id, for front ends that answer by id (the C ABI, the Python package).

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use flashdiff_models::Conditioning;

use super::{Finished, Reply, Service};
use crate::engine::{Engine, EngineError, Output, RequestConfig};

/// Where a request stands in a [`Mailbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Submitted, not finished.
    Pending,
    /// Finished with an output.
    Done,
    /// Failed or cancelled.
    Failed,
    /// Never submitted, or its result was taken or released.
    Unknown,
}

/// Why a [`Mailbox`] call was refused.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// A request with this id is pending or has a result not yet taken.
    #[error("request {0} exists: release it first")]
    Duplicate(u64),
    /// The request has finished (cancel).
    #[error("request {0} already finished: read or release its result")]
    Finished(u64),
    /// The request is still pending (take, release).
    #[error("request {0} is still pending")]
    Pending(u64),
    /// No such request: never submitted, or its result was taken or released.
    #[error("request {0} was never submitted or was released")]
    Unknown(u64),
    /// The engine refused.
    #[error(transparent)]
    Engine(EngineError),
}

struct Book {
    pending: HashSet<u64>,
    results: HashMap<u64, Result<Output, String>>,
    rx: Receiver<Finished>,
}

impl Book {
    fn collect(&mut self) {
        while let Ok((id, r)) = self.rx.try_recv() {
            self.pending.remove(&id);
            self.results.insert(id, r.map_err(|e| e.to_string()));
        }
    }

    fn standing(&self, id: u64) -> Standing {
        match self.results.get(&id) {
            Some(Ok(_)) => Standing::Done,
            Some(Err(_)) => Standing::Failed,
            None if self.pending.contains(&id) => Standing::Pending,
            None => Standing::Unknown,
        }
    }
}

/// A [`Service`] for front ends that answer by request id (the C ABI, the Python package):
/// results wait, by id, until the caller takes or releases them. Safe to call from any
/// number of threads.
pub struct Mailbox {
    service: Service,
    tx: Sender<Finished>,
    book: Mutex<Book>,
}

impl Mailbox {
    /// Starts `engine`'s service.
    pub fn start(engine: Engine) -> Result<Self, EngineError> {
        let (tx, rx) = mpsc::channel();
        Ok(Self {
            service: Service::start(engine)?,
            tx,
            book: Mutex::new(Book {
                pending: HashSet::new(),
                results: HashMap::new(),
                rx,
            }),
        })
    }

    /// The service underneath.
    pub fn service(&self) -> &Service {
        &self.service
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // The book is consistent after every statement that changes it: a panic elsewhere
        // while it was held leaves nothing half-done.
        let mut b = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        b.collect();
        b
    }

    /// Submits a request; the prompt and settings are checked now.
    pub fn submit(&self, id: u64, prompt: &str, cfg: RequestConfig) -> Result<(), MailboxError> {
        self.submit_conditioned(id, prompt, None, cfg)
    }

    /// [`Mailbox::submit`] with the prompt already conditioned by the model (the engine
    /// does not encode it again).
    pub fn submit_conditioned(
        &self,
        id: u64,
        prompt: &str,
        cond: Option<Conditioning>,
        cfg: RequestConfig,
    ) -> Result<(), MailboxError> {
        let mut b = self.book();
        if b.standing(id) != Standing::Unknown {
            return Err(MailboxError::Duplicate(id));
        }
        self.service
            .submit_conditioned(id, prompt, cond, cfg, Reply::to(self.tx.clone()))
            .map_err(MailboxError::Engine)?;
        b.pending.insert(id);
        Ok(())
    }

    /// Where request `id` stands.
    pub fn standing(&self, id: u64) -> Standing {
        self.book().standing(id)
    }

    /// Requests submitted and not finished.
    pub fn pending(&self) -> usize {
        self.book().pending.len()
    }

    /// Waits until the engine completes a scheduling round or `timeout` passes; returns
    /// the requests still pending.
    pub fn wait_round(&self, timeout: Duration) -> usize {
        if self.pending() > 0 {
            self.service.wait_round(timeout);
        }
        self.pending()
    }

    /// Waits until nothing is pending (also requests other threads submit meanwhile).
    pub fn wait_all(&self) {
        while self.wait_round(Duration::from_millis(50)) > 0 {}
    }

    /// Waits up to `timeout` for request `id` to finish; returns where it stands then.
    pub fn wait_for(&self, id: u64, timeout: Duration) -> Standing {
        let end = Instant::now() + timeout;
        loop {
            let s = self.standing(id);
            let left = end.saturating_duration_since(Instant::now());
            if s != Standing::Pending || left.is_zero() {
                return s;
            }
            self.service.wait_round(left.min(Duration::from_millis(50)));
        }
    }

    /// Cancels a pending request; it then stands as failed.
    pub fn cancel(&self, id: u64) -> Result<(), MailboxError> {
        let mut b = self.book();
        match b.standing(id) {
            Standing::Pending => {}
            Standing::Unknown => return Err(MailboxError::Unknown(id)),
            _ => return Err(MailboxError::Finished(id)),
        }
        let r = self.service.cancel(id);
        b.collect();
        match (r, b.standing(id)) {
            (Ok(()), _) => Ok(()),
            // It finished between the check and the cancel.
            (Err(_), Standing::Done | Standing::Failed) => Err(MailboxError::Finished(id)),
            (Err(e), _) => Err(MailboxError::Engine(e)),
        }
    }

    /// Runs `f` on a finished request's output (or its error) without taking it.
    pub fn read<T>(
        &self,
        id: u64,
        f: impl FnOnce(Result<&Output, &str>) -> T,
    ) -> Result<T, MailboxError> {
        let b = self.book();
        match b.results.get(&id) {
            Some(r) => Ok(f(r.as_ref().map_err(String::as_str))),
            None if b.pending.contains(&id) => Err(MailboxError::Pending(id)),
            None => Err(MailboxError::Unknown(id)),
        }
    }

    /// Takes a finished request's output (or its error's text) out of the mailbox.
    pub fn take(&self, id: u64) -> Result<Result<Output, String>, MailboxError> {
        let mut b = self.book();
        match b.results.remove(&id) {
            Some(r) => Ok(r),
            None if b.pending.contains(&id) => Err(MailboxError::Pending(id)),
            None => Err(MailboxError::Unknown(id)),
        }
    }
}

impl Drop for Mailbox {
    /// Cancels what is still pending, so that dropping the mailbox (`fd_engine_free`, a
    /// Python engine collected) returns after the current round instead of after every
    /// pending request has run to its end.
    fn drop(&mut self) {
        let pending: Vec<u64> = self.book().pending.iter().copied().collect();
        for id in pending {
            let _ = self
                .service
                .sender()
                .send(super::Command::Cancel { id, done: None });
        }
    }
}
