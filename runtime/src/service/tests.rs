//! The service and the mailbox against the engine they wrap.

use super::*;

fn engine() -> Engine {
    Engine::new(&crate::engine::default_weights(), 1).expect("the built-in model")
}

fn cfg(seed: u64) -> RequestConfig {
    RequestConfig {
        steps: 8,
        warmup: 2,
        seed,
        ..RequestConfig::default()
    }
}

#[test]
fn a_service_gives_what_the_engine_gives() {
    let mut e = engine();
    let want = e.generate("a red circle", cfg(3), &mut |_| {}).unwrap();
    let s = Service::start(e).unwrap();
    let (tx, rx) = mpsc::channel();
    let (etx, erx) = mpsc::channel();
    s.submit(5, "a red circle", cfg(3), Reply::streaming(tx, etx))
        .unwrap();
    let (id, got) = rx.recv().unwrap();
    let got = got.unwrap();
    assert_eq!(id, 5);
    assert_eq!(got.sample.rgb, want.sample.rgb);
    let steps: Vec<u32> = erx.try_iter().map(|u| u.step).collect();
    assert_eq!(steps.last(), Some(&8), "{steps:?}");
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
}

#[test]
fn refusals_come_back_at_once_and_send_no_result() {
    let s = Service::start(engine()).unwrap();
    let (tx, rx) = mpsc::channel();
    let bad = RequestConfig { steps: 0, ..cfg(1) };
    assert!(s
        .submit(1, "a red circle", bad, Reply::to(tx.clone()))
        .is_err());
    assert!(s
        .submit(2, "zzz qqq", cfg(1), Reply::to(tx.clone()))
        .is_err());
    s.submit(3, "a red circle", cfg(1), Reply::to(tx.clone()))
        .unwrap();
    let e = s
        .submit(3, "a red circle", cfg(1), Reply::to(tx))
        .unwrap_err();
    assert!(e.to_string().contains("already in flight"), "{e}");
    assert_eq!(rx.recv().unwrap().0, 3);
    assert!(rx.try_recv().is_err(), "a refused request sent a result");
}

#[test]
fn a_cancelled_result_is_sent_before_the_cancel_returns() {
    let s = Service::start(engine()).unwrap();
    let (tx, rx) = mpsc::channel();
    let long = RequestConfig {
        steps: 200,
        ..cfg(1)
    };
    s.submit(9, "a red circle", long, Reply::to(tx)).unwrap();
    s.cancel(9).unwrap();
    let (id, r) = rx.try_recv().expect("the cancelled result");
    assert_eq!(id, 9);
    assert!(matches!(r, Err(EngineError::Cancelled(9))));
    assert!(s.cancel(9).is_err(), "cancelled twice");
}

#[test]
fn dropping_a_service_finishes_what_was_admitted() {
    let s = Service::start(engine()).unwrap();
    let (tx, rx) = mpsc::channel();
    for id in 0..3 {
        s.submit(id, "a blue square", cfg(id), Reply::to(tx.clone()))
            .unwrap();
    }
    drop(s);
    let mut ids: Vec<u64> = rx
        .try_iter()
        .map(|(id, r)| {
            assert!(r.is_ok());
            id
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2]);
}

#[test]
fn a_mailbox_keeps_results_by_id() {
    let m = Mailbox::start(engine()).unwrap();
    m.submit(1, "a red circle", cfg(1)).unwrap();
    assert!(matches!(
        m.submit(1, "a red circle", cfg(1)),
        Err(MailboxError::Duplicate(1))
    ));
    assert!(matches!(m.take(1), Err(MailboxError::Pending(1))));
    m.wait_all();
    assert_eq!(m.standing(1), Standing::Done);
    assert!(matches!(m.cancel(1), Err(MailboxError::Finished(1))));
    assert!(m.take(1).unwrap().is_ok());
    assert_eq!(m.standing(1), Standing::Unknown);
    assert!(matches!(m.cancel(1), Err(MailboxError::Unknown(1))));
    m.submit(
        2,
        "a red circle",
        RequestConfig {
            steps: 200,
            ..cfg(2)
        },
    )
    .unwrap();
    m.cancel(2).unwrap();
    assert_eq!(m.standing(2), Standing::Failed);
    let why = m.take(2).unwrap().unwrap_err();
    assert!(why.contains("cancelled"), "{why}");
}

/// The built-in model, counting its forwards, and with `panics` its decoder panics: a bug
/// in the engine's path.
#[derive(Debug)]
struct Panics(
    std::sync::Arc<dyn flashdiff_models::Denoiser>,
    bool,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
);

impl Panics {
    fn counted(&self) {
        self.2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl flashdiff_models::Denoiser for Panics {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn dims(&self) -> &flashdiff_models::Dims {
        self.0.dims()
    }
    fn device(&self) -> &flashdiff_models::Device {
        self.0.device()
    }
    fn condition(
        &self,
        prompt: &str,
    ) -> Result<flashdiff_models::Conditioning, flashdiff_models::ModelError> {
        self.0.condition(prompt)
    }
    fn step_cond(
        &self,
        context: &flashdiff_models::Tensor,
        t: f32,
    ) -> Result<flashdiff_models::Tensor, flashdiff_models::ModelError> {
        self.0.step_cond(context, t)
    }
    fn full_forward(
        &self,
        x: &flashdiff_models::Tensor,
        step: flashdiff_models::StepInput<'_>,
        saliency: bool,
    ) -> Result<flashdiff_models::FullOutput, flashdiff_models::ModelError> {
        self.counted();
        self.0.full_forward(x, step, saliency)
    }
    fn subset_forward(
        &self,
        x_active: &flashdiff_models::Tensor,
        active: &[u32],
        step: flashdiff_models::StepInput<'_>,
        cache: Option<flashdiff_models::KvCache<'_>>,
        patches: flashdiff_models::Patches<'_>,
    ) -> Result<flashdiff_models::SubsetOutput, flashdiff_models::ModelError> {
        self.counted();
        self.0
            .subset_forward(x_active, active, step, cache, patches)
    }
    fn first_block_input(
        &self,
        x: &flashdiff_models::Tensor,
        step: flashdiff_models::StepInput<'_>,
    ) -> Result<flashdiff_models::Tensor, flashdiff_models::ModelError> {
        self.0.first_block_input(x, step)
    }
    fn decode(
        &self,
        latent: &[f32],
    ) -> Result<flashdiff_models::Sample, flashdiff_models::ModelError> {
        if self.1 {
            panic!("decoding went wrong")
        }
        self.0.decode(latent)
    }
}

#[test]
fn a_panicking_engine_answers_every_request_and_stops() {
    let model = Panics(engine().shared_model(), true, Default::default());
    let e = Engine::builder_with(std::sync::Arc::new(model))
        .workers(1)
        .build()
        .unwrap();
    let m = Mailbox::start(e).unwrap();
    m.submit(1, "a red circle", cfg(1)).unwrap();
    m.submit(2, "a blue square", cfg(2)).unwrap();
    m.wait_all();
    for id in [1, 2] {
        assert_eq!(m.standing(id), Standing::Failed);
        let why = m.take(id).unwrap().unwrap_err();
        assert!(why.contains("panicked"), "{why}");
    }
    let e = m.submit(3, "a red circle", cfg(3)).unwrap_err();
    assert!(e.to_string().contains("stopped"), "{e}");
}

#[test]
fn dropping_a_mailbox_cancels_what_is_pending() {
    let forwards = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let model = Panics(engine().shared_model(), false, forwards.clone());
    let e = Engine::builder_with(std::sync::Arc::new(model))
        .workers(1)
        .build()
        .unwrap();
    let m = Mailbox::start(e).unwrap();
    let long = RequestConfig {
        steps: 1000,
        mode: crate::engine::Mode::Full,
        ..cfg(1)
    };
    m.submit(1, "a red circle", long).unwrap();
    drop(m);
    // Run to its end, the request would have made a forward for every one of its steps.
    let n = forwards.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n < 100, "{n} forwards ran after the mailbox was dropped");
}
