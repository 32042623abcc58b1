//! Shared setup for the benchmarks: a seeded RNG, medians, and the placement
//! topology (label groups and required-label sets of one pool) that
//! `core_placement` and `memory` both build; and, in submodules, what the
//! NATS benches share: `nats` (one server or a 3-node cluster), `measure`
//! (stamps, percentiles, CPU and message counters), `rounds` (one measured
//! round), `dispatch` (the dispatchers cronoq is measured against) and
//! `tap` (the latency breakdown of `distributed`).
//!
//! Not a benchmark itself: cargo only discovers `benches/*.rs` and
//! `benches/*/main.rs`, so this module is pulled in with `mod common;`.

#![allow(dead_code)]

pub mod dispatch;
pub mod measure;
pub mod nats;
pub mod rounds;
pub mod tap;

use std::collections::{BTreeSet, HashMap};

use cronoq::core::{Action, Core, Event, Labels, Millis, PoolName, TaskId, TaskSpec};

/// splitmix64: deterministic, no dependency, good enough to spread data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// The median of `xs` (sorts in place); the mean of the two middles for an
/// even count.
pub fn median(xs: &mut [f64]) -> f64 {
    assert!(!xs.is_empty(), "median of nothing");
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// A stopwatch over both wall time and the calling thread's on-CPU time.
///
/// The benchmark machine is shared: time the scheduler gives to other
/// processes inflates wall time but not this thread's CPU time, so the
/// single-threaded benches judge CPU time and show wall time beside it.
pub struct Stopwatch {
    wall: std::time::Instant,
    cpu: Option<u64>,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch {
            cpu: thread_cpu_ns(),
            wall: std::time::Instant::now(),
        }
    }

    /// `(cpu, wall)` ns since start; cpu is wall where no thread clock exists.
    pub fn elapsed_ns(&self) -> (f64, f64) {
        let wall = self.wall.elapsed().as_nanos() as f64;
        let cpu = match (self.cpu, thread_cpu_ns()) {
            (Some(a), Some(b)) => (b - a) as f64,
            _ => wall,
        };
        (cpu, wall)
    }
}

/// CLOCK_THREAD_CPUTIME_ID through libc (always linked on Linux).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
pub fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
pub fn thread_cpu_ns() -> Option<u64> {
    None
}

/// A count read from the environment, or `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a count")),
        Err(_) => default,
    }
}

const NAMES: [&str; 8] = ["zone", "gpu", "cpu", "mem", "disk", "net", "arch", "os"];
const VALUES: u64 = 10;

/// One label as (name index, value index).
type Pair = (u8, u8);

/// Groups and required-label sets of one pool.
pub struct Topology {
    pub pool: PoolName,
    /// Each group's exact labels and its slots.
    pub groups: Vec<(Labels, u32)>,
    /// The required-label sets; index 0 is the empty set.
    pub reqsets: Vec<Labels>,
    /// How many groups each reqset matches.
    pub matches: Vec<usize>,
    /// Slots of all groups.
    pub slots: u64,
}

fn labels_of(pairs: &[Pair]) -> Labels {
    pairs
        .iter()
        .map(|&(n, v)| (NAMES[n as usize], format!("v{v}")))
        .collect()
}

/// `n_groups` distinct groups of 1–3 labels (8 names × 10 values) with
/// 1–`max_slots` slots each, and `n_reqsets` required-label sets: the empty
/// set, then every single label and then random label pairs, each carried
/// by at least `min_matches` groups.
pub fn topology(
    rng: &mut Rng,
    n_groups: usize,
    n_reqsets: usize,
    max_slots: u32,
    min_matches: usize,
) -> Topology {
    let mut seen = BTreeSet::new();
    let mut group_pairs: Vec<Vec<Pair>> = Vec::with_capacity(n_groups);
    while group_pairs.len() < n_groups {
        let n = 1 + rng.below(3) as usize;
        let mut names: Vec<u8> = Vec::new();
        while names.len() < n {
            let x = rng.below(NAMES.len() as u64) as u8;
            if !names.contains(&x) {
                names.push(x);
            }
        }
        names.sort_unstable();
        let pairs: Vec<Pair> = names
            .iter()
            .map(|&k| (k, rng.below(VALUES) as u8))
            .collect();
        if seen.insert(pairs.clone()) {
            group_pairs.push(pairs);
        }
    }

    let mut count: HashMap<Vec<Pair>, usize> = HashMap::new();
    for g in &group_pairs {
        for i in 0..g.len() {
            *count.entry(vec![g[i]]).or_default() += 1;
            for j in i + 1..g.len() {
                *count.entry(vec![g[i], g[j]]).or_default() += 1;
            }
        }
    }
    let candidates = |len: usize| {
        let mut v: Vec<Vec<Pair>> = count
            .iter()
            .filter(|(k, &c)| k.len() == len && c >= min_matches)
            .map(|(k, _)| k.clone())
            .collect();
        v.sort_unstable(); // HashMap order is random; the run must not be
        v
    };
    let singles = candidates(1);
    let mut doubles = candidates(2);
    for i in (1..doubles.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        doubles.swap(i, j);
    }
    let mut req: Vec<Vec<Pair>> = vec![Vec::new()];
    req.extend(singles);
    let missing = n_reqsets.saturating_sub(req.len());
    assert!(
        doubles.len() >= missing,
        "only {} label pairs match {min_matches}+ groups",
        doubles.len()
    );
    req.extend(doubles.into_iter().take(missing));
    req.truncate(n_reqsets);

    let matches = req
        .iter()
        .map(|r| if r.is_empty() { n_groups } else { count[r] })
        .collect();
    let groups: Vec<(Labels, u32)> = group_pairs
        .iter()
        .map(|g| (labels_of(g), 1 + rng.below(u64::from(max_slots)) as u32))
        .collect();
    let slots = groups.iter().map(|(_, s)| u64::from(*s)).sum();
    Topology {
        pool: PoolName::new("bench").unwrap(),
        groups,
        reqsets: req.iter().map(|r| labels_of(r)).collect(),
        matches,
        slots,
    }
}

impl Topology {
    /// Creates every group with its slots.
    pub fn configure(&self, core: &mut Core) {
        for (labels, slots) in &self.groups {
            core.handle(
                Millis(0),
                Event::CapacitySet {
                    pool: self.pool.clone(),
                    labels: labels.clone(),
                    slots: *slots,
                },
            )
            .expect("capacity accepted");
        }
    }

    /// A plain task of this pool requiring reqset `r`.
    pub fn spec(&self, id: u64, r: usize, priority: i32) -> TaskSpec {
        let mut spec = TaskSpec::new(TaskId(id), self.pool.clone());
        spec.required = self.reqsets[r].clone();
        spec.priority = priority;
        spec
    }

    /// Fills every slot with tasks that require nothing (ids from
    /// `*next_id`); returns the running `(task, attempt)` pairs.
    pub fn fill(&self, core: &mut Core, next_id: &mut u64) -> Vec<(TaskId, u32)> {
        let mut running = Vec::with_capacity(self.slots as usize);
        let mut out = Vec::new();
        for _ in 0..self.slots {
            let spec = self.spec(*next_id, 0, 0);
            *next_id += 1;
            out.clear();
            core.handle_into(Millis(0), Event::Submitted(spec), &mut out)
                .expect("submit accepted");
            match out.as_slice() {
                [Action::Start { task, attempt, .. }] => running.push((*task, *attempt)),
                other => panic!("fill task did not start: {other:?}"),
            }
        }
        running
    }

    /// A summary line of the shape of the data.
    pub fn describe(&self) -> String {
        let mut m: Vec<f64> = self.matches.iter().map(|&x| x as f64).collect();
        let (lo, hi) = (
            *self.matches.iter().min().unwrap(),
            *self.matches.iter().max().unwrap(),
        );
        let by_len = |n: usize| self.groups.iter().filter(|(l, _)| l.len() == n).count();
        format!(
            "{} groups ({}/{}/{} with 1/2/3 labels, {} slots), {} reqsets (0–2 labels, \
             each matching {}–{} groups, median {})",
            self.groups.len(),
            by_len(1),
            by_len(2),
            by_len(3),
            self.slots,
            self.reqsets.len(),
            lo,
            hi,
            median(&mut m)
        )
    }
}
