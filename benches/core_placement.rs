//! Placement decision cost of the pure core at scale, against an in-run
//! baseline.
//!
//! One pool, 10,000 label groups (1–3 labels, 1–4 slots, every slot busy),
//! 1,000 required-label sets (0–2 labels, each matching several groups) and
//! 1,000,000 waiting tasks spread over them. A *decision* is an
//! `AttemptEnded { Succeeded }` for a random running attempt: the core
//! forgets the task and hands the freed slot to the best waiter (it returns
//! `Finished` and `Start`). Between decision batches the waiters taken are
//! replaced (untimed), so the queue stays at 1,000,000.
//!
//! Batches of decisions alternate with batches of the baseline: one
//! `BTreeMap` `pop_first` and one `insert` (at a random position) on
//! 1,000,000 entries plus one `FxHashMap` lookup on 1,000,000 entries, the
//! least any scheduler does per decision. Both report the median over
//! batches of ns per operation, in the bench thread's CPU time (the machine
//! is shared; wall time is shown beside it).
//!
//! The same run is made again with fair share at work (SPEC §9): every
//! waiting task carries one of 10,000 fairness keys (weights 1–4), so a
//! decision also picks the key furthest below its share in each queue and
//! moves its virtual time. Both runs print PASS/FAIL against 1 µs.
//!
//! A last figure is the cost of a submit that finds a free slot (light
//! load: a fresh core with the same groups, nothing waiting).
//!
//! Not a timed test: it prints figures and PASS/FAIL and never fails.
//! `cargo bench --bench core_placement`; `CRONOQ_BENCH_WAITING`,
//! `CRONOQ_BENCH_BATCHES` and `CRONOQ_BENCH_BATCH` shrink a quick run.

mod common;

use common::{env_count, median, topology, Rng, Stopwatch, Topology};
use cronoq::core::{Action, AttemptOutcome, Core, Event, Millis, TaskId, TaskSpec};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::hint::black_box;

const GROUPS: usize = 10_000;
const REQSETS: usize = 1_000;
const TARGET_NS: f64 = 1_000.0;
const PRIORITIES: u64 = 4;
/// Fairness keys of the second run.
const FAIR_KEYS: u64 = 10_000;

/// The least a scheduler must do per decision over the same data size:
/// take the best of 1,000,000 queued keys, queue a new one, find a record
/// by id.
struct Baseline {
    queue: BTreeMap<(u64, i32, u64), u32>,
    index: FxHashMap<u64, u32>,
    n: u64,
    floor: u64,
    seq: u64,
}

impl Baseline {
    fn new(rng: &mut Rng, n: usize) -> Baseline {
        let n = n as u64;
        let mut queue = BTreeMap::new();
        let mut index = FxHashMap::default();
        for seq in 0..n {
            queue.insert(
                (rng.below(n), rng.below(PRIORITIES) as i32, seq),
                seq as u32,
            );
            index.insert(seq, seq as u32);
        }
        Baseline {
            queue,
            index,
            n,
            floor: 0,
            seq: n,
        }
    }

    fn op(&mut self, rng: &mut Rng) {
        let (_, task) = self.queue.pop_first().expect("baseline queue is full");
        let key = (
            self.floor + rng.below(self.n),
            rng.below(PRIORITIES) as i32,
            self.seq,
        );
        self.floor += 1;
        self.seq += 1;
        self.queue.insert(key, task);
        black_box(self.index.get(&rng.below(self.n)));
    }
}

/// One decision: end a random running attempt; record what started.
/// Returns whether the freed slot went to a waiter.
fn decision(
    core: &mut Core,
    running: &mut Vec<(TaskId, u32)>,
    rng: &mut Rng,
    out: &mut Vec<Action>,
) -> bool {
    let i = rng.below(running.len() as u64) as usize;
    let (task, attempt) = running.swap_remove(i);
    out.clear();
    core.handle_into(
        Millis(0),
        Event::AttemptEnded {
            task,
            attempt,
            outcome: AttemptOutcome::Succeeded,
        },
        out,
    )
    .expect("outcome accepted");
    let mut started = false;
    for action in out.iter() {
        if let Action::Start { task, attempt, .. } = action {
            running.push((*task, *attempt));
            started = true;
        }
    }
    started
}

/// Submits `n` tasks spread over every reqset (while groups are full, they
/// wait), each with one of `keys` fairness keys if `keys > 0`; any that
/// start join `running`.
fn submit_spread(
    core: &mut Core,
    topo: &Topology,
    rng: &mut Rng,
    next_id: &mut u64,
    n: usize,
    running: &mut Vec<(TaskId, u32)>,
    keys: u64,
) {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = rng.below(topo.reqsets.len() as u64) as usize;
        let mut spec = topo.spec(*next_id, r, rng.below(PRIORITIES) as i32);
        if keys > 0 {
            let key = rng.below(keys);
            spec.fairness_key = Some(format!("tenant-{key}"));
            spec.fairness_weight = 1 + (key % 4) as u32;
        }
        *next_id += 1;
        out.clear();
        core.handle_into(Millis(0), Event::Submitted(spec), &mut out)
            .expect("submit accepted");
        for action in &out {
            if let Action::Start { task, attempt, .. } = action {
                running.push((*task, *attempt));
            }
        }
    }
}

/// Median ns per submit that finds a free slot: a fresh core with the same
/// groups, batches of `batch` submits over random reqsets, all ended
/// (untimed) after each batch.
fn light_submit(
    topo: &Topology,
    rng: &mut Rng,
    next_id: &mut u64,
    batches: usize,
    batch: usize,
) -> (Samples, usize) {
    let mut core = Core::new();
    topo.configure(&mut core);
    let mut out = Vec::new();
    let mut samples = Samples::default();
    let mut waited_total = 0;
    for _ in 0..batches + 1 {
        let specs: Vec<TaskSpec> = (0..batch)
            .map(|_| {
                let r = rng.below(topo.reqsets.len() as u64) as usize;
                *next_id += 1;
                topo.spec(*next_id, r, 0)
            })
            .collect();
        let mut started = Vec::with_capacity(batch);
        let mut waited = Vec::new();
        let t = Stopwatch::start();
        for spec in specs {
            let id = spec.id;
            out.clear();
            core.handle_into(Millis(0), Event::Submitted(spec), &mut out)
                .expect("submit accepted");
            match out.first() {
                Some(Action::Start { task, attempt, .. }) => started.push((*task, *attempt)),
                _ => waited.push(id),
            }
        }
        samples.push(t, batch);
        waited_total += waited.len();
        for id in waited {
            core.handle(Millis(0), Event::CancelRequested(id))
                .expect("cancel accepted");
        }
        for (task, attempt) in started {
            core.handle(
                Millis(0),
                Event::AttemptEnded {
                    task,
                    attempt,
                    outcome: AttemptOutcome::Succeeded,
                },
            )
            .expect("outcome accepted");
        }
    }
    samples.drop_first(); // warm-up batch
    (samples, waited_total)
}

/// Per-batch ns per operation, on-CPU and wall.
#[derive(Default)]
struct Samples {
    cpu: Vec<f64>,
    wall: Vec<f64>,
}

impl Samples {
    fn push(&mut self, t: Stopwatch, ops: usize) {
        let (cpu, wall) = t.elapsed_ns();
        self.cpu.push(cpu / ops as f64);
        self.wall.push(wall / ops as f64);
    }

    fn drop_first(&mut self) {
        self.cpu.remove(0);
        self.wall.remove(0);
    }

    /// Medians `(cpu, wall)`.
    fn medians(&self) -> (f64, f64) {
        (
            median(&mut self.cpu.clone()),
            median(&mut self.wall.clone()),
        )
    }
}

/// What one run measured.
struct Run {
    decisions: Samples,
    base: Samples,
    idle: usize,
    full_submit_ns: f64,
}

/// Fills a core with `waiting` tasks (with `keys` fairness keys, or none)
/// and times batches of decisions against batches of the baseline.
fn measure(
    topo: &Topology,
    rng: &mut Rng,
    next_id: &mut u64,
    waiting: usize,
    (batches, batch): (usize, usize),
    keys: u64,
) -> Run {
    let mut core = Core::new();
    topo.configure(&mut core);
    let mut running = topo.fill(&mut core, next_id);
    let t = Stopwatch::start();
    submit_spread(&mut core, topo, rng, next_id, waiting, &mut running, keys);
    let (full_submit_ns, _) = t.elapsed_ns();
    let full_submit_ns = full_submit_ns / waiting as f64;
    assert_eq!(running.len() as u64, topo.slots, "every slot busy");
    assert_eq!(core.live_tasks(), waiting + topo.slots as usize);

    let mut baseline = Baseline::new(rng, waiting);
    let mut out = Vec::with_capacity(8);
    let mut decisions = Samples::default();
    let mut base = Samples::default();
    let mut idle = 0usize;
    // One extra leading round warms both up and is dropped.
    for _ in 0..batches + 1 {
        let t = Stopwatch::start();
        for _ in 0..batch {
            if !decision(&mut core, &mut running, rng, &mut out) {
                idle += 1;
            }
        }
        decisions.push(t, batch);
        // Put the queue back at `waiting` (untimed).
        let missing = waiting + topo.slots as usize - core.live_tasks();
        submit_spread(&mut core, topo, rng, next_id, missing, &mut running, keys);
        let t = Stopwatch::start();
        for _ in 0..batch {
            baseline.op(rng);
        }
        base.push(t, batch);
    }
    decisions.drop_first();
    base.drop_first();
    Run {
        decisions,
        base,
        idle,
        full_submit_ns,
    }
}

/// Prints one run's decision figures and verdict; returns the baseline's
/// median CPU ns.
fn report(run: &Run, title: &str, (batches, batch): (usize, usize), waiting: usize) -> f64 {
    let (core_cpu, core_wall) = run.decisions.medians();
    let (base_cpu, base_wall) = run.base.medians();
    let mut ratios: Vec<f64> = run
        .decisions
        .cpu
        .iter()
        .zip(&run.base.cpu)
        .map(|(c, b)| c / b)
        .collect();
    let ratio_med = median(&mut ratios);
    let verdict = if core_cpu <= TARGET_NS {
        "PASS"
    } else {
        "FAIL"
    };
    println!("  {title}");
    println!(
        "  decision  AttemptEnded{{Succeeded}} -> Finished + Start, {batches} x {batch}: \
         {core_cpu:.0} ns ({core_wall:.0})"
    );
    println!(
        "            {} of {} decisions found no waiter for the freed slot",
        run.idle,
        (batches + 1) * batch
    );
    println!(
        "  baseline  BTreeMap pop_first+insert ({waiting} keys) + FxHashMap get ({waiting}), \
         {batches} x {batch}: {base_cpu:.0} ns ({base_wall:.0})"
    );
    println!(
        "  ratio     core / baseline = {:.2} (median of per-batch ratios {ratio_med:.2})",
        core_cpu / base_cpu
    );
    println!("  target    decision <= 1 us: {verdict}");
    println!(
        "            while every slot is busy (the setup, mean of {waiting}): {:.0} ns per submit",
        run.full_submit_ns
    );
    base_cpu
}

fn main() {
    let waiting = env_count("CRONOQ_BENCH_WAITING", 1_000_000);
    let batches = env_count("CRONOQ_BENCH_BATCHES", 50);
    let batch = env_count("CRONOQ_BENCH_BATCH", 10_000);
    let light_batch = 2_000;

    let mut rng = Rng::new(0x5EED_C0DE);
    let topo = topology(&mut rng, GROUPS, REQSETS, 4, 3);
    let mut next_id = 1;
    let plain = measure(&topo, &mut rng, &mut next_id, waiting, (batches, batch), 0);
    let fair = measure(
        &topo,
        &mut rng,
        &mut next_id,
        waiting,
        (batches, batch),
        FAIR_KEYS,
    );
    let (light, light_waited) = light_submit(&topo, &mut rng, &mut next_id, batches, light_batch);
    let (light_cpu, light_wall) = light.medians();

    println!();
    println!("core_placement: placement decision cost of cronoq::core::Core");
    println!("  data      {}", topo.describe());
    println!("            {waiting} waiting tasks (4 priorities, spread over every reqset)");
    println!("  figures   median over batches of ns per operation, thread CPU time (wall time)");
    report(
        &plain,
        "-- without fairness keys",
        (batches, batch),
        waiting,
    );
    let base_cpu = report(
        &fair,
        &format!("-- with {FAIR_KEYS} fairness keys (weights 1-4, SPEC §9 fair share)"),
        (batches, batch),
        waiting,
    );
    println!(
        "  submit    finding a free slot (light load), {batches} x {light_batch}: \
         {light_cpu:.0} ns ({light_wall:.0}); ratio to baseline {:.2}; \
         {light_waited} found none",
        light_cpu / base_cpu
    );
    println!("  reproduce cargo bench --bench core_placement");
    println!();
}
