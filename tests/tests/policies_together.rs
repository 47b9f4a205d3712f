//! The three policies together, the way an engine (or a foreign stack) drives them: warm-up,
//! saliency partition, per-step gate decisions, scheduler packing over two workers.

use flashdiff_gate::{checker::GateChecker, Gate, GateConfig};
use flashdiff_partitioner::checker::check_layout;
use flashdiff_partitioner::{partition_saliency, saliency_map, salient_mask, split_words, Grid};
use flashdiff_scheduler::checker::SchedChecker;
use flashdiff_scheduler::{Completion, Scheduler, SchedulerConfig};

#[test]
fn warmup_partition_gate_schedule() {
    let grid = Grid::image(16, 16).unwrap();
    let words = split_words("a red circle top left on a blue background");
    let salient = salient_mask(&words);
    // Fake warm-up attention: "circle" (word 2) attends to the top-left 5x5 corner.
    let mut attn = vec![0.02f32; 256 * words.len()];
    for y in 0..5 {
        for x in 0..5 {
            attn[(y * 16 + x) * words.len() + 2] = 0.8;
        }
    }
    let s = saliency_map(&attn, 256, &salient).unwrap();
    let r = 8;
    let layout = partition_saliency(grid, &s, r).unwrap();
    check_layout(&layout, r).unwrap();
    let corner = layout.patch_of()[0];
    assert_eq!(
        layout.patch_of()[4 * 16 + 4],
        corner,
        "the object sits in one patch"
    );

    let cfg = GateConfig {
        epsilon: 0.1,
        eta: 1e-6,
        max_skip: 3,
    };
    let mut gate = Gate::new(r as usize, cfg).unwrap();
    let mut gate_check = GateChecker::new(r as usize, cfg);
    let mut sched = Scheduler::new(SchedulerConfig {
        workers: 2,
        record_events: true,
        ..Default::default()
    })
    .unwrap();
    sched.submit(1, 3, 5.0).unwrap();
    let a = sched.next(0).unwrap().unwrap();
    assert_eq!(
        sched.complete(0, a.task.tag).unwrap(),
        Completion::WarmupDone(1)
    );

    let mut active = vec![false; r as usize];
    let mut computed = 0;
    let mut corner_runs = 0;
    let steps = 5..50u32;
    for step in steps.clone() {
        gate.decide(&mut active).unwrap();
        gate_check.check(&active, gate.weights()).unwrap();
        corner_runs += active[corner as usize] as usize;
        let list: Vec<(u32, f64)> = (0..r)
            .filter(|&p| active[p as usize])
            .map(|p| (p, layout.patch_tokens(p).len() as f64))
            .collect();
        computed += list.len();
        sched.submit_step(1, step, &list).unwrap();
        let mut done = false;
        while !done {
            for w in 0..2 {
                if let Some(a) = sched.next(w).unwrap() {
                    let p = a.task.tag.monotask;
                    // The object's patch keeps changing; the background settles.
                    let imp = if p == corner {
                        0.5 + 0.05 * step as f32
                    } else {
                        0.2
                    };
                    gate.observe(p as usize, imp).unwrap();
                    gate_check.observed(p as usize, imp);
                    done |= matches!(
                        sched.complete(w, a.task.tag).unwrap(),
                        Completion::StepDone(..)
                    );
                }
            }
        }
    }
    sched.finish(1).unwrap();
    let mut c = SchedChecker::new(sched.config());
    c.check_all(&sched.take_events()).unwrap();
    assert_eq!(c.finished(), 1);
    let total = steps.len() * r as usize;
    assert!(
        computed < total / 2,
        "background patches should mostly skip: {computed} of {total}"
    );
    // The gate always runs at least one patch, so count the object's patch itself.
    assert_eq!(
        corner_runs,
        steps.len(),
        "the object's patch runs every step"
    );
}
