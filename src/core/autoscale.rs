//! Autoscaling per label set: the fleets a pool declares, which fleet each
//! waiting task counts toward, and how many workers each fleet should have.
//!
//! A **fleet** is the workers of a pool that carry one exact label set and
//! are scaled together (one Kubernetes Deployment, one autoscaling group).
//! A pool declares its fleets in its [`super::PoolConfig`], so the demand
//! of a fleet is known while it has no worker at all (scaling from zero).
//!
//! Each waiting task counts toward exactly one fleet: among the declared
//! fleets whose labels include its required labels, the **least
//! specialized** (fewest labels), and among those the one declared first
//! (SPEC §2 rule 2 applied to fleets, with declaration order as the stable
//! tie-break, so the operator decides). A task no fleet covers counts
//! toward none ([`FleetFigures::waiting_without_fleet`]). So fleets never
//! double-count: the waiting figures of a pool's fleets plus
//! `waiting_without_fleet` add up to the pool's waiting tasks.
//!
//! Pure functions over plain data; the core calls [`fleet_figures`] from
//! its complete per-reqset counts (never from the capped demand rows of
//! the snapshot), and [`answer`](super::answer) (beside the snapshot, so
//! that this module stays below it) reads the result back from a
//! [`Snapshot`](super::Snapshot) for `GET /v1/autoscale`.

use serde::{Deserialize, Serialize};

use super::model::{Labels, PoolName};
use super::spec::FleetConfig;

/// The fleet (index into `fleets`) that a task requiring `required` counts
/// toward: the fleets whose labels include `required`, fewest labels
/// first, then the one declared first. `None` when no fleet covers it.
///
/// ```
/// use cronoq::core::{fleet_for, FleetConfig, Labels};
/// let fleet = |labels: &[(&str, &str)]| FleetConfig {
///     labels: labels.iter().copied().collect(), min: 0, max: 4, slots_per_worker: 1 };
/// let fleets = [fleet(&[("gpu", "a100"), ("zone", "eu")]), fleet(&[("gpu", "a100")]), fleet(&[])];
/// assert_eq!(fleet_for(&fleets, &Labels::new()), Some(2));
/// assert_eq!(fleet_for(&fleets, &Labels::from([("gpu", "a100")])), Some(1));
/// assert_eq!(fleet_for(&fleets, &Labels::from([("zone", "eu")])), Some(0));
/// assert_eq!(fleet_for(&fleets, &Labels::from([("gpu", "h100")])), None);
/// ```
pub fn fleet_for(fleets: &[FleetConfig], required: &Labels) -> Option<usize> {
    fleets
        .iter()
        .enumerate()
        .filter(|(_, f)| f.labels.satisfies(required))
        .min_by_key(|(i, f)| (f.labels.len(), *i))
        .map(|(i, _)| i)
}

/// Workers a fleet should have: `ceil((busy + waiting + reserved) /
/// slots_per_worker)`, clamped to `[min, max]`.
///
/// ```
/// assert_eq!(cronoq::core::desired_workers(1, 4, 0, 2, 0, 8), 3);
/// assert_eq!(cronoq::core::desired_workers(0, 0, 0, 2, 0, 8), 0);
/// assert_eq!(cronoq::core::desired_workers(0, 0, 0, 2, 1, 8), 1);
/// assert_eq!(cronoq::core::desired_workers(0, 100, 0, 2, 0, 8), 8);
/// ```
pub fn desired_workers(
    busy: u64,
    waiting: u64,
    reserved: u64,
    slots_per_worker: u32,
    min: u32,
    max: u32,
) -> u64 {
    let slots = busy.saturating_add(waiting).saturating_add(reserved);
    slots
        .div_ceil(u64::from(slots_per_worker.max(1)))
        .clamp(u64::from(min), u64::from(max))
}

/// The autoscaling figures of one declared fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetAutoscale {
    /// The fleet's label set.
    pub labels: Labels,
    /// Workers the fleet should have (see [`desired_workers`]).
    pub desired: u64,
    /// Waiting tasks that count toward this fleet.
    pub waiting: u64,
    /// Due fixed-start reservations (not yet started) that count toward
    /// this fleet: their slot is wanted before `start_at`.
    pub reserved: u64,
    /// Busy slots of the group whose labels equal the fleet's.
    pub busy: u64,
    /// Slots of that group.
    pub capacity: u64,
    /// Configured fewest workers.
    pub min: u64,
    /// Configured most workers.
    pub max: u64,
    /// Configured slots per worker.
    pub slots_per_worker: u32,
}

/// The figures of all fleets of a pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetFigures {
    /// One per declared fleet, in declaration order.
    pub fleets: Vec<FleetAutoscale>,
    /// Waiting tasks (and due reservations) that no declared fleet covers.
    pub waiting_without_fleet: u64,
}

/// Waiting demand of one required-label set, as the core counts it (every
/// set, never capped).
#[derive(Clone, Copy, Debug)]
pub struct ReqsetDemand<'a> {
    /// The required labels.
    pub required: &'a Labels,
    /// Tasks waiting with exactly these requirements.
    pub waiting: u64,
    /// Due reservations of fixed-start tasks with these requirements that
    /// have not reached `start_at` yet.
    pub reserved: u64,
}

/// Each fleet's figures: every demand row counts toward the one fleet of
/// [`fleet_for`] (or toward `waiting_without_fleet`); `group(labels)` gives
/// the `(capacity, busy)` of the group with exactly those labels.
///
/// ```
/// use cronoq::core::{fleet_figures, FleetConfig, Labels, ReqsetDemand};
/// let gpu = Labels::from([("gpu", "a100")]);
/// let fleets = [FleetConfig { labels: gpu.clone(), min: 0, max: 8, slots_per_worker: 2 }];
/// let (none, h100) = (Labels::new(), Labels::from([("gpu", "h100")]));
/// let demand = [
///     ReqsetDemand { required: &none, waiting: 3, reserved: 0 },
///     ReqsetDemand { required: &h100, waiting: 5, reserved: 0 },
/// ];
/// let figures = fleet_figures(&fleets, demand, |_| (0, 0));
/// assert_eq!((figures.fleets[0].waiting, figures.fleets[0].desired), (3, 2));
/// assert_eq!(figures.waiting_without_fleet, 5);
/// ```
pub fn fleet_figures<'a>(
    fleets: &[FleetConfig],
    demand: impl IntoIterator<Item = ReqsetDemand<'a>>,
    group: impl Fn(&Labels) -> (u64, u64),
) -> FleetFigures {
    let mut figures = FleetFigures {
        fleets: fleets
            .iter()
            .map(|f| {
                let (capacity, busy) = group(&f.labels);
                FleetAutoscale {
                    labels: f.labels.clone(),
                    desired: 0,
                    waiting: 0,
                    reserved: 0,
                    busy,
                    capacity,
                    min: u64::from(f.min),
                    max: u64::from(f.max),
                    slots_per_worker: f.slots_per_worker,
                }
            })
            .collect(),
        waiting_without_fleet: 0,
    };
    if fleets.is_empty() {
        return figures;
    }
    for row in demand {
        match fleet_for(fleets, row.required) {
            Some(i) => {
                let fleet = &mut figures.fleets[i];
                fleet.waiting += row.waiting;
                fleet.reserved += row.reserved;
            }
            None => figures.waiting_without_fleet += row.waiting + row.reserved,
        }
    }
    for (fleet, config) in figures.fleets.iter_mut().zip(fleets) {
        fleet.desired = desired_workers(
            fleet.busy,
            fleet.waiting,
            fleet.reserved,
            config.slots_per_worker,
            config.min,
            config.max,
        );
    }
    figures
}

/// The answer of `GET /v1/autoscale?pool=P&labels=…`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoscaleAnswer {
    /// The pool asked about.
    pub pool: PoolName,
    /// The label set asked about.
    pub labels: Labels,
    /// The pool declares a fleet with exactly these labels. When false,
    /// `desired`, `waiting`, `reserved`, `min` and `max` are 0: waiting
    /// tasks count toward declared fleets only.
    pub declared: bool,
    /// Workers the fleet should have.
    pub desired: u64,
    /// Waiting tasks that count toward the fleet.
    pub waiting: u64,
    /// Due reservations that count toward the fleet.
    pub reserved: u64,
    /// Busy slots of the group with exactly these labels.
    pub busy: u64,
    /// Slots of that group.
    pub capacity: u64,
    /// Configured fewest workers.
    pub min: u64,
    /// Configured most workers.
    pub max: u64,
    /// Configured slots per worker (0 when not declared).
    pub slots_per_worker: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(labels: &[(&str, &str)], spw: u32) -> FleetConfig {
        FleetConfig {
            labels: labels.iter().copied().collect(),
            min: 0,
            max: 10,
            slots_per_worker: spw,
        }
    }

    #[test]
    fn ties_among_equally_specialized_fleets_go_to_the_first_declared() {
        let fleets = [fleet(&[("gpu", "a100")], 1), fleet(&[("zone", "eu")], 1)];
        let needs_nothing = Labels::new();
        assert_eq!(fleet_for(&fleets, &needs_nothing), Some(0));
        let swapped = [fleets[1].clone(), fleets[0].clone()];
        assert_eq!(fleet_for(&swapped, &needs_nothing), Some(0));
        assert_eq!(swapped[0].labels, Labels::from([("zone", "eu")]));
    }

    #[test]
    fn busy_and_capacity_come_from_the_group_with_the_fleets_exact_labels() {
        let gpu = Labels::from([("gpu", "a100")]);
        let fleets = [fleet(&[("gpu", "a100")], 2)];
        let figures = fleet_figures(&fleets, [], |l| if l == &gpu { (4, 3) } else { (9, 9) });
        let f = &figures.fleets[0];
        assert_eq!((f.capacity, f.busy, f.waiting, f.desired), (4, 3, 0, 2));
    }

    #[test]
    fn reservations_count_toward_desired_but_not_waiting() {
        let none = Labels::new();
        let fleets = [fleet(&[], 1)];
        let demand = [ReqsetDemand {
            required: &none,
            waiting: 0,
            reserved: 2,
        }];
        let f = &fleet_figures(&fleets, demand, |_| (0, 0)).fleets[0];
        assert_eq!((f.waiting, f.reserved, f.desired), (0, 2, 2));
    }

    #[test]
    fn desired_saturates_instead_of_overflowing() {
        assert_eq!(
            desired_workers(u64::MAX, u64::MAX, 1, 1, 0, u32::MAX),
            u64::from(u32::MAX)
        );
    }
}
