//! Memory per waiting task, beyond its payload, at 1,000,000 waiting.
//!
//! A counting `#[global_allocator]` around `System` tracks live requested
//! bytes (and live allocations); each figure is live bytes after submitting
//! the tasks minus before, divided by the number of tasks. Payloads are
//! empty `Bytes::new()` (no allocation), so payload bytes are excluded.
//! Allocator overhead (malloc headers, size classes) is not counted; the
//! live allocation count per task is printed so it can be estimated.
//!
//! * core, flat: one pool, no groups, every task waits;
//! * core, placement data: the `core_placement` topology (10,000 groups,
//!   1,000 reqsets, every slot busy), tasks spread over the reqsets;
//!   and the same with every task carrying one of 10,000 fairness keys;
//! * embedded `Scheduler`, a pool with capacity 0 and an executor, handles
//!   dropped, and handles kept (their own `size_of` counted as the user's).
//!
//! The in-run baseline is the smallest record that could hold a waiting
//! task in a pure core: a 1,000,000-entry `BTreeMap<(u64, i32, u64), u32>`
//! queue plus a `FxHashMap<u64, u32>` id index, measured the same way.
//!
//! Not a timed test: it prints figures and PASS/FAIL and never fails.
//! `cargo bench --bench memory`; `CRONOQ_BENCH_WAITING` shrinks a quick run.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use bytes::Bytes;
use common::{env_count, topology, Rng};
use cronoq::core::{Core, Event, Millis, PoolName, TaskId, TaskSpec};
use cronoq::{Scheduler, Task, TaskHandle};
use rustc_hash::FxHashMap;

const TARGET_BYTES: f64 = 256.0;

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_ALLOCS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments; the
// counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Relaxed);
            LIVE_ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Relaxed);
            LIVE_ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE_BYTES.fetch_sub(layout.size() as isize, Relaxed);
        LIVE_ALLOCS.fetch_sub(1, Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Live `(bytes, allocations)` now.
fn live() -> (isize, isize) {
    (LIVE_BYTES.load(Relaxed), LIVE_ALLOCS.load(Relaxed))
}

/// Per-task growth of live memory between two readings.
struct PerTask {
    bytes: f64,
    allocs: f64,
}

fn per_task(before: (isize, isize), after: (isize, isize), n: usize, users: isize) -> PerTask {
    PerTask {
        bytes: (after.0 - before.0 - users) as f64 / n as f64,
        allocs: (after.1 - before.1) as f64 / n as f64,
    }
}

fn core_flat(n: usize) -> PerTask {
    let pool = PoolName::new("bench").unwrap();
    let mut core = Core::new();
    let mut out = Vec::new();
    // The pool exists before the reading; its first task creates it.
    let warm = TaskSpec::new(TaskId(0), pool.clone());
    core.handle_into(Millis(0), Event::Submitted(warm), &mut out)
        .unwrap();
    let before = live();
    for i in 1..=n as u64 {
        out.clear();
        let spec = TaskSpec::new(TaskId(i), pool.clone());
        core.handle_into(Millis(0), Event::Submitted(spec), &mut out)
            .unwrap();
    }
    assert!(out.is_empty(), "tasks wait: the pool has no slots");
    let after = live();
    drop(core);
    per_task(before, after, n, 0)
}

/// `keys > 0`: each task carries one of `keys` fairness keys (SPEC §9).
fn core_placement_data(n: usize, keys: u64) -> (PerTask, String) {
    let mut rng = Rng::new(0x5EED_C0DE);
    let topo = topology(&mut rng, 10_000, 1_000, 4, 3);
    let mut core = Core::new();
    topo.configure(&mut core);
    let mut next_id = 1;
    let running = topo.fill(&mut core, &mut next_id);
    let mut out = Vec::new();
    // Every reqset exists before the reading (one task each, cancelled).
    for r in 0..topo.reqsets.len() {
        let id = next_id;
        next_id += 1;
        core.handle(Millis(0), Event::Submitted(topo.spec(id, r, 0)))
            .unwrap();
        core.handle(Millis(0), Event::CancelRequested(TaskId(id)))
            .unwrap();
    }
    let specs_rng = (0..n)
        .map(|_| {
            (
                rng.below(topo.reqsets.len() as u64) as usize,
                rng.below(4) as i32,
                rng.below(keys.max(1)),
            )
        })
        .collect::<Vec<_>>();
    let before = live();
    for &(r, priority, key) in &specs_rng {
        out.clear();
        let mut spec = topo.spec(next_id, r, priority);
        if keys > 0 {
            spec.fairness_key = Some(format!("tenant-{key}"));
            spec.fairness_weight = 1 + (key % 4) as u32;
        }
        core.handle_into(Millis(0), Event::Submitted(spec), &mut out)
            .unwrap();
        next_id += 1;
        assert!(out.is_empty(), "every slot is busy");
    }
    let after = live();
    assert_eq!(core.live_tasks(), n + running.len());
    drop(core);
    (per_task(before, after, n, 0), topo.describe())
}

fn embedded(n: usize, keep_handles: bool) -> PerTask {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sched = Scheduler::new();
        sched.set_capacity("bench", 0).unwrap();
        sched
            .executor("bench", |_, _| async { Ok(Bytes::new()) })
            .unwrap();
        drop(
            sched
                .submit_now(Task::new(Bytes::new()).pool("bench"))
                .unwrap(),
        );
        let before = live();
        // The user's own storage: allocated inside the reading, then
        // subtracted below.
        let mut handles: Vec<TaskHandle> = Vec::with_capacity(if keep_handles { n } else { 0 });
        for _ in 0..n {
            let handle = sched
                .submit_now(Task::new(Bytes::new()).pool("bench"))
                .unwrap();
            if keep_handles {
                handles.push(handle);
            }
        }
        let after = live();
        let users = (handles.capacity() * std::mem::size_of::<TaskHandle>()) as isize;
        let result = per_task(before, after, n, users);
        drop(handles);
        drop(sched);
        result
    })
}

fn baseline(n: usize) -> PerTask {
    let before = live();
    let mut queue: BTreeMap<(u64, i32, u64), u32> = BTreeMap::new();
    let mut index: FxHashMap<u64, u32> = FxHashMap::default();
    for i in 0..n as u64 {
        queue.insert((u64::MAX, 0, i), i as u32);
        index.insert(i, i as u32);
    }
    let after = live();
    drop((queue, index));
    per_task(before, after, n, 0)
}

fn main() {
    let n = env_count("CRONOQ_BENCH_WAITING", 1_000_000);
    let base = baseline(n);
    let flat = core_flat(n);
    let (placed, data) = core_placement_data(n, 0);
    let (keyed, _) = core_placement_data(n, 10_000);
    let dropped = embedded(n, false);
    let kept = embedded(n, true);
    let verdict = |p: &PerTask| {
        if p.bytes <= TARGET_BYTES {
            "PASS"
        } else {
            "FAIL"
        }
    };
    let line = |name: &str, p: &PerTask| {
        println!(
            "  {name:<40} {:>6.1} B/task ({:.2} allocs/task), ratio to baseline {:.2}  target <= 256 B: {}",
            p.bytes,
            p.allocs,
            p.bytes / base.bytes,
            verdict(p)
        );
    };
    println!();
    println!("memory: live bytes per waiting task beyond its payload, at {n} waiting");
    println!(
        "  (requested bytes through a counting global allocator; malloc overhead not counted)"
    );
    println!(
        "  {:<40} {:>6.1} B/task ({:.2} allocs/task)  [BTreeMap<(u64,i32,u64),u32> + FxHashMap<u64,u32>]",
        "baseline",
        base.bytes,
        base.allocs
    );
    line("(a) core, one pool, no slots", &flat);
    line("(a) core, placement data", &placed);
    println!("      data: {data}, every slot busy");
    line("(a) the same, 10,000 fairness keys", &keyed);
    line("(b) embedded Scheduler, handles dropped", &dropped);
    line("(c) embedded Scheduler, handles kept", &kept);
    println!(
        "      (c) excludes the handles themselves: {} B each, counted as the user's",
        std::mem::size_of::<TaskHandle>()
    );
    println!("  reproduce cargo bench --bench memory");
    println!();
}
