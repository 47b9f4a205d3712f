//! Workers: threads of this process sharing the model, or `flashdiff worker` child
//! processes. The coordinator sends both the same orders and reads the same reports. Orders
//! go through each worker's lock-free [`HandOff`] queue (a thread takes from it directly; a
//! process's writer thread takes from it and writes to the process's stdin), so a worker
//! holding an order dispatched ahead starts it without waiting for the coordinator; reports
//! come back over one channel. Processes speak over their stdin/stdout as framed rkyv
//! records (header: magic "FDRC", format version, payload length; payload validated by
//! bytecheck on read). Both open
//! a request's state file by path and follow the ownership protocol of [`crate::state`]. A
//! worker that exits, panics or breaks its pipe is reported lost, so the scheduler can re-run
//! its monotasks.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use crate::exec::{self, Task};
use crate::state::{SharedState, StateLayout};
use flashdiff_models::pipelines::registry::ModelSpec;
use flashdiff_models::{Denoiser, Device};
use flashdiff_scheduler::HandOff;
use rkyv::rancor::Error as RkyvError;

const MAGIC: [u8; 4] = *b"FDRC";
const VERSION: u16 = 2;
/// Largest record accepted: far above any real one (a path and a few integers).
const MAX_RECORD: u32 = 1 << 16;

pub use records::{ArchivedOrder, ArchivedReport, Order, Report};

// rkyv's derives generate `Archived*` types without docs; the records are documented here.
#[allow(missing_docs)]
mod records {
    use rkyv::{Archive, Deserialize, Serialize};

    /// Coordinator -> worker.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub enum Order {
        /// Run one monotask of a request whose state lives at `state`.
        Run {
            /// Request id.
            request: u64,
            /// Step (0 for the warm-up).
            step: u32,
            /// Monotask of the step ([`crate::state::Region::Monotask`]), or `u32::MAX` for
            /// the warm-up.
            monotask: u32,
            /// Total steps.
            steps: u32,
            /// Warm-up steps.
            warmup: u32,
            /// NaivePatch: attend only inside the patch.
            isolated: bool,
            /// Path of the request's state file.
            state: String,
        },
        /// The request is finished: unmap its state.
        Forget {
            /// Request id.
            request: u64,
        },
    }

    /// Worker -> coordinator.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub enum Report {
        /// The worker loaded its model and reads orders (its first record).
        Ready,
        /// The monotask's outputs are in the state.
        Done {
            /// Request.
            request: u64,
            /// Step.
            step: u32,
            /// Monotask of the step.
            monotask: u32,
        },
        /// The monotask could not run.
        Failed {
            /// Request.
            request: u64,
            /// Step.
            step: u32,
            /// Monotask of the step.
            monotask: u32,
            /// Why.
            error: String,
        },
    }
}

/// Writes one framed record.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&MAGIC);
    head[4..6].copy_from_slice(&VERSION.to_le_bytes());
    head[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one framed record's payload; `Ok(None)` on a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> Result<Option<rkyv::util::AlignedVec>, String> {
    let mut head = [0u8; 12];
    match r.read_exact(&mut head[..1]) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("reading record header: {e}")),
    }
    r.read_exact(&mut head[1..])
        .map_err(|e| format!("truncated record header: {e}"))?;
    if head[..4] != MAGIC {
        return Err(format!("bad record magic {:?}", &head[..4]));
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    if version != VERSION {
        return Err(format!(
            "record format version {version}, this build speaks {VERSION}"
        ));
    }
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if len > MAX_RECORD {
        return Err(format!(
            "record of {len} bytes exceeds the limit of {MAX_RECORD}"
        ));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)
        .map_err(|e| format!("truncated record ({len} bytes announced): {e}"))?;
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(buf.len());
    aligned.extend_from_slice(&buf);
    Ok(Some(aligned))
}

/// Encodes an order.
pub fn encode_order(o: &Order) -> Vec<u8> {
    rkyv::to_bytes::<RkyvError>(o)
        .expect("orders always serialise")
        .to_vec()
}

/// Decodes and validates an order.
pub fn decode_order(bytes: &[u8]) -> Result<Order, String> {
    rkyv::from_bytes::<Order, RkyvError>(bytes).map_err(|e| format!("invalid order record: {e}"))
}

/// Encodes a report.
pub fn encode_report(r: &Report) -> Vec<u8> {
    rkyv::to_bytes::<RkyvError>(r)
        .expect("reports always serialise")
        .to_vec()
}

/// Decodes and validates a report.
pub fn decode_report(bytes: &[u8]) -> Result<Report, String> {
    rkyv::from_bytes::<Report, RkyvError>(bytes).map_err(|e| format!("invalid report record: {e}"))
}

/// Runs one order against a worker's open states; a report for `Run`, nothing for `Forget`.
fn handle(
    model: &dyn Denoiser,
    layout: &StateLayout,
    states: &mut HashMap<u64, SharedState>,
    order: Order,
) -> Option<Report> {
    match order {
        Order::Forget { request } => {
            states.remove(&request);
            None
        }
        Order::Run {
            request,
            step,
            monotask,
            steps,
            warmup,
            isolated,
            state,
        } => {
            let res = (|| -> Result<(), String> {
                let st = match states.entry(request) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(SharedState::open(Path::new(&state), layout.clone())?)
                    }
                };
                let task = if monotask == u32::MAX {
                    Task::Warmup { steps, warmup }
                } else {
                    Task::Patches { monotask, isolated }
                };
                exec::run(model, st, task)
            })();
            Some(match res {
                Ok(()) => Report::Done {
                    request,
                    step,
                    monotask,
                },
                Err(error) => Report::Failed {
                    request,
                    step,
                    monotask,
                    error,
                },
            })
        }
    }
}

/// Fault injection for the fault-tolerance tests, from `FLASHDIFF_WORKER_FAULT`:
/// `abort:REQUEST:STEP` makes the worker abort (as a crash would) whenever it is given a
/// monotask of that request's step; unset (always, outside tests) it does nothing.
fn injected_abort() -> Option<(u64, u32)> {
    let v = std::env::var("FLASHDIFF_WORKER_FAULT").ok()?;
    let mut it = v.strip_prefix("abort:")?.split(':');
    let request = it.next()?.parse().ok()?;
    let step = it.next()?.parse().ok()?;
    Some((request, step))
}

/// The worker process's main loop (`flashdiff worker`, with the model's description as
/// [`ModelSpec::worker_args`] writes it).
pub fn worker_main(spec: &ModelSpec) -> Result<(), String> {
    let abort_on = injected_abort();
    flashdiff_kernels::flush_denormals_to_zero();
    let model = spec.load(&Device::Cpu).map_err(|e| e.to_string())?;
    let layout = StateLayout::new(model.dims());
    let stdin = std::io::stdin();
    let mut input = BufReader::new(stdin.lock());
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut states: HashMap<u64, SharedState> = HashMap::new();
    write_frame(&mut out, &encode_report(&Report::Ready))
        .map_err(|e| format!("writing the ready report: {e}"))?;
    while let Some(frame) = read_frame(&mut input)? {
        let order = decode_order(&frame)?;
        if let (Some(at), Order::Run { request, step, .. }) = (abort_on, &order) {
            if at == (*request, *step) {
                std::process::abort();
            }
        }
        if let Some(report) = handle(&*model, &layout, &mut states, order) {
            write_frame(&mut out, &encode_report(&report))
                .map_err(|e| format!("writing report: {e}"))?;
        }
    }
    Ok(())
}

/// A worker thread's loop: orders from `orders` until the pool closes it. A panic in
/// a monotask is reported as the worker's loss (the scheduler re-runs the monotask on a
/// replacement), never taken across the thread.
fn thread_main(
    id: u32,
    model: Arc<dyn Denoiser>,
    layout: StateLayout,
    orders: Arc<HandOff<Order>>,
    events: Sender<(u32, WorkerEvent)>,
) {
    flashdiff_kernels::flush_denormals_to_zero();
    let mut states: HashMap<u64, SharedState> = HashMap::new();
    if events
        .send((id, WorkerEvent::Report(Report::Ready)))
        .is_err()
    {
        return;
    }
    while let Some(order) = orders.take() {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handle(&*model, &layout, &mut states, order)
        }));
        let ev = match res {
            Ok(None) => continue,
            Ok(Some(report)) => WorkerEvent::Report(report),
            Err(p) => {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                let _ = events.send((
                    id,
                    WorkerEvent::Lost(format!("worker thread panicked: {why}")),
                ));
                return;
            }
        };
        if events.send((id, ev)).is_err() {
            return;
        }
    }
}

/// What the pool observed.
#[derive(Debug)]
pub enum WorkerEvent {
    /// A worker's report.
    Report(Report),
    /// The worker is gone (exited, killed, or sent garbage), with why.
    Lost(String),
}

enum Slot {
    Process {
        child: Child,
        /// Orders for the worker's writer thread, which owns its stdin.
        orders: Arc<HandOff<Order>>,
    },
    Thread {
        orders: Arc<HandOff<Order>>,
    },
}

/// What the pool's workers are.
enum Kind {
    /// Child processes running `exe worker` with the model's description.
    Processes { exe: PathBuf, spec: ModelSpec },
    /// Threads of this process sharing one model.
    Threads {
        model: Arc<dyn Denoiser>,
        layout: StateLayout,
    },
}

/// Workers, indexed like the scheduler's workers.
pub struct Pool {
    slots: Vec<Option<Slot>>,
    tx: Sender<(u32, WorkerEvent)>,
    rx: Receiver<(u32, WorkerEvent)>,
    kind: Kind,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("workers", &self.slots.len())
            .field(
                "kind",
                &match self.kind {
                    Kind::Processes { .. } => "processes",
                    Kind::Threads { .. } => "threads",
                },
            )
            .finish()
    }
}

/// Blocks SIGPIPE in the calling thread, for good: a write to a dead worker's pipe then
/// fails with EPIPE instead of killing the host process (a C host need not ignore SIGPIPE).
/// The signal such a write raises stays pending on this thread alone and is discarded when
/// the thread ends.
fn block_sigpipe_in_this_thread() {
    // SAFETY: sigemptyset/sigaddset initialise the local set before pthread_sigmask reads it;
    // pthread_sigmask changes only the calling thread's mask (a writer thread of ours).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl Pool {
    /// Starts `n` workers running `exe worker`, each loading the model `spec` describes.
    pub fn new(exe: &Path, spec: &ModelSpec, n: u32) -> Result<Self, String> {
        Self::start(
            Kind::Processes {
                exe: exe.into(),
                spec: spec.clone(),
            },
            n,
        )
    }

    /// Starts `n` worker threads sharing `model`.
    pub fn threads(model: Arc<dyn Denoiser>, n: u32) -> Result<Self, String> {
        let layout = StateLayout::new(model.dims());
        Self::start(Kind::Threads { model, layout }, n)
    }

    fn start(kind: Kind, n: u32) -> Result<Self, String> {
        let (tx, rx) = channel();
        let mut p = Self {
            slots: Vec::new(),
            tx,
            rx,
            kind,
        };
        for id in 0..n {
            p.spawn(id)?;
        }
        Ok(p)
    }

    /// Starts worker `id` (a new one, or a replacement in a lost one's place). Its first
    /// event is `Report::Ready` once its model is loaded, or `Lost` if it dies before.
    pub fn spawn(&mut self, id: u32) -> Result<(), String> {
        let slot = match &self.kind {
            Kind::Threads { model, layout } => {
                let orders = Arc::new(HandOff::new());
                let (model, layout, events) = (model.clone(), layout.clone(), self.tx.clone());
                let mine = orders.clone();
                let t = std::thread::Builder::new()
                    .name(format!("flashdiff-worker-{id}"))
                    .spawn(move || thread_main(id, model, layout, mine, events))
                    .map_err(|e| format!("cannot start worker thread {id}: {e}"))?;
                orders.set_consumer(t.thread().clone());
                Slot::Thread { orders }
            }
            Kind::Processes { exe, spec } => {
                let mut child = Command::new(exe)
                    .arg("worker")
                    .args(spec.worker_args())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("cannot start worker process {}: {e}", exe.display()))?;
                let stdout = child.stdout.take().expect("piped");
                let stderr = child.stderr.take().expect("piped");
                let mut stdin = child.stdin.take().expect("piped");
                let tx = self.tx.clone();
                let reader = std::thread::Builder::new()
                    .name(format!("flashdiff-reader-{id}"))
                    .spawn(move || {
                        let mut r = BufReader::new(stdout);
                        loop {
                            let ev = match read_frame(&mut r) {
                                Ok(Some(f)) => match decode_report(&f) {
                                    Ok(rep) => WorkerEvent::Report(rep),
                                    Err(e) => WorkerEvent::Lost(e),
                                },
                                Ok(None) => WorkerEvent::Lost(
                                    "worker closed its output (exited or killed)".into(),
                                ),
                                Err(e) => WorkerEvent::Lost(e),
                            };
                            let lost = matches!(ev, WorkerEvent::Lost(_));
                            if tx.send((id, ev)).is_err() || lost {
                                break;
                            }
                        }
                    });
                // The worker's own messages (a load error, a panic) go to the host's log,
                // never straight to its stderr.
                let errs = std::thread::Builder::new()
                    .name(format!("flashdiff-stderr-{id}"))
                    .spawn(move || {
                        use std::io::BufRead;
                        for line in BufReader::new(stderr).lines() {
                            match line {
                                Ok(l) => log::warn!("worker {id}: {l}"),
                                Err(_) => break,
                            }
                        }
                    });
                let orders = Arc::new(HandOff::<Order>::new());
                let tx = self.tx.clone();
                let mine = orders.clone();
                let writer = std::thread::Builder::new()
                    .name(format!("flashdiff-writer-{id}"))
                    .spawn(move || {
                        block_sigpipe_in_this_thread();
                        while let Some(o) = mine.take() {
                            if let Err(e) = write_frame(&mut stdin, &encode_order(&o)) {
                                let _ = tx.send((
                                    id,
                                    WorkerEvent::Lost(format!("cannot write to the worker: {e}")),
                                ));
                                break;
                            }
                        }
                    });
                match reader.and(errs).and(writer) {
                    Ok(w) => orders.set_consumer(w.thread().clone()),
                    Err(e) => {
                        orders.close();
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(format!("cannot start the threads of worker {id}: {e}"));
                    }
                }
                Slot::Process { child, orders }
            }
        };
        let idx = id as usize;
        if self.slots.len() <= idx {
            self.slots.resize_with(idx + 1, || None);
        }
        self.slots[idx] = Some(slot);
        Ok(())
    }

    /// Whether worker `id` is started and not reaped.
    pub fn is_live(&self, id: u32) -> bool {
        matches!(self.slots.get(id as usize), Some(Some(_)))
    }

    /// Queues an order on the worker's hand-off; `false` when the worker was reaped. Never
    /// blocks, takes no lock and never writes to a pipe on the caller's thread; a worker that
    /// died meanwhile is reported lost by its own thread.
    pub fn send(&mut self, id: u32, o: &Order) -> bool {
        match self.slots.get_mut(id as usize) {
            Some(Some(Slot::Process { orders, .. })) | Some(Some(Slot::Thread { orders })) => {
                orders.push(o.clone());
                true
            }
            _ => false,
        }
    }

    /// Sends an order to every live worker (best effort).
    pub fn broadcast(&mut self, o: &Order) {
        for id in 0..self.slots.len() as u32 {
            self.send(id, o);
        }
    }

    /// Waits for the next event.
    pub fn recv(&self) -> Option<(u32, WorkerEvent)> {
        self.rx.recv().ok()
    }

    /// Waits at most `timeout` for the next event.
    pub fn recv_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> Result<(u32, WorkerEvent), std::sync::mpsc::RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// Reaps a lost (or hung) worker: a process is killed and waited for; a thread is
    /// abandoned (its hand-off is closed and emptied, so it ends once its monotask returns;
    /// a report it sends after that is ignored).
    pub fn reap(&mut self, id: u32) {
        match self.slots.get_mut(id as usize).and_then(Option::take) {
            Some(Slot::Process { mut child, orders }) => {
                orders.close();
                let _ = child.kill();
                let _ = child.wait();
            }
            Some(Slot::Thread { orders }) => {
                orders.close();
                while orders.try_take().is_some() {}
            }
            None => {}
        }
    }

    /// Process ids of the workers (None for lost ones and for threads).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.slots
            .iter()
            .map(|s| match s {
                Some(Slot::Process { child, .. }) => Some(child.id()),
                _ => None,
            })
            .collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for id in 0..self.slots.len() as u32 {
            self.reap(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_bytes_are_refused() {
        let o = Order::Run {
            request: 7,
            step: 9,
            monotask: 2,
            steps: 50,
            warmup: 5,
            isolated: false,
            state: "/dev/shm/x".into(),
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &encode_order(&o)).unwrap();
        let frame = read_frame(&mut buf.as_slice()).unwrap().unwrap();
        assert_eq!(decode_order(&frame).unwrap(), o);
        // Truncated, wrong magic, wrong version, oversized, garbage payload.
        assert!(read_frame(&mut &buf[..buf.len() - 1])
            .unwrap_err()
            .contains("truncated"));
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(read_frame(&mut bad.as_slice())
            .unwrap_err()
            .contains("magic"));
        let mut bad = buf.clone();
        bad[4] = 9;
        assert!(read_frame(&mut bad.as_slice())
            .unwrap_err()
            .contains("version"));
        let mut bad = buf.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_frame(&mut bad.as_slice())
            .unwrap_err()
            .contains("exceeds"));
        let garbage = [0xFFu8; 40];
        assert!(decode_order(&garbage).is_err());
        assert!(decode_report(&garbage).is_err());
        assert!(read_frame(&mut [].as_slice()).unwrap().is_none());
    }
}
