//! Autoscaling per label set (fleets): the assignment of waiting tasks to
//! fleets as properties of the pure function (no double count, every
//! covered task counted once, order-independent), the core's figures past
//! the snapshot's demand cap and with due reservations, and
//! `GET /v1/autoscale` plus its metrics over the embedded scheduler
//! (idle, from zero, busy, undeclared, malformed queries) and over a real
//! `cronoq server` with a worker that joins.

mod procs;

use std::future::pending;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use cronoq::core::{
    answer, fleet_figures, fleet_for, Core, Event, FixedStart, FleetConfig, Labels, Millis,
    PoolConfig, PoolName, ReqsetDemand, TaskId, TaskSpec, MAX_DEMAND_ROWS,
};
use cronoq::{Scheduler, Task, TaskContext, TaskError};
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::Value;
use tower::ServiceExt;

fn fleet(labels: &[(&str, &str)], min: u32, max: u32, slots_per_worker: u32) -> FleetConfig {
    FleetConfig {
        labels: labels.iter().copied().collect(),
        min,
        max,
        slots_per_worker,
    }
}

fn label_set() -> impl Strategy<Value = Labels> {
    (
        prop::option::of(0..2usize),
        prop::option::of(0..2usize),
        prop::option::of(0..1usize),
    )
        .prop_map(|(gpu, zone, disk)| {
            let mut labels = Labels::new();
            if let Some(i) = gpu {
                labels.insert("gpu", ["a100", "h100"][i]);
            }
            if let Some(i) = zone {
                labels.insert("zone", ["eu", "us"][i]);
            }
            if let Some(i) = disk {
                labels.insert("disk", ["ssd"][i]);
            }
            labels
        })
}

fn fleets() -> impl Strategy<Value = Vec<FleetConfig>> {
    prop::collection::vec((label_set(), 0..3u32, 0..5u32, 1..4u32), 0..6).prop_map(|raw| {
        let mut fleets: Vec<FleetConfig> = Vec::new();
        for (labels, min, extra, slots_per_worker) in raw {
            if fleets.iter().all(|f| f.labels != labels) {
                fleets.push(FleetConfig {
                    labels,
                    min,
                    max: min + extra,
                    slots_per_worker,
                });
            }
        }
        fleets
    })
}

/// Distinct required-label sets with their waiting and reserved counts.
fn demand_rows() -> impl Strategy<Value = Vec<(Labels, u64, u64)>> {
    prop::collection::vec((label_set(), 0..50u64, 0..3u64), 0..10).prop_map(|raw| {
        let mut rows: Vec<(Labels, u64, u64)> = Vec::new();
        for row in raw {
            if rows.iter().all(|r| r.0 != row.0) {
                rows.push(row);
            }
        }
        rows
    })
}

fn as_demand(rows: &[(Labels, u64, u64)]) -> Vec<ReqsetDemand<'_>> {
    rows.iter()
        .map(|(required, waiting, reserved)| ReqsetDemand {
            required,
            waiting: *waiting,
            reserved: *reserved,
        })
        .collect()
}

proptest! {
    /// Fleets never double-count: each waiting task whose requirements
    /// some fleet covers counts toward exactly one fleet, one that covers
    /// it with the fewest labels; the others count toward none.
    #[test]
    fn each_waiting_task_counts_toward_exactly_one_covering_fleet(
        fleets in fleets(),
        rows in demand_rows(),
    ) {
        let figures = fleet_figures(&fleets, as_demand(&rows), |_| (0, 0));
        prop_assert_eq!(figures.fleets.len(), fleets.len());
        let total: u64 = rows.iter().map(|r| r.1).sum();
        let counted: u64 = figures.fleets.iter().map(|f| f.waiting).sum();
        prop_assert!(counted <= total);
        let mut covered = 0;
        for (required, waiting, _) in &rows {
            let covering: Vec<usize> = (0..fleets.len())
                .filter(|&i| required.iter().all(|(k, v)| fleets[i].labels.get(k) == Some(v)))
                .collect();
            match fleet_for(&fleets, required) {
                Some(i) => {
                    prop_assert!(covering.contains(&i));
                    let fewest = covering.iter().map(|&c| fleets[c].labels.len()).min();
                    prop_assert_eq!(Some(fleets[i].labels.len()), fewest);
                    // The first declared among the least specialized.
                    prop_assert!(covering.iter().all(|&c| c >= i || fleets[c].labels.len() > fleets[i].labels.len()));
                    covered += waiting;
                }
                None => prop_assert!(covering.is_empty()),
            }
        }
        prop_assert_eq!(counted, covered);
        if !fleets.is_empty() {
            let reserved: u64 = rows.iter().map(|r| r.2).sum();
            let fleet_reserved: u64 = figures.fleets.iter().map(|f| f.reserved).sum();
            prop_assert_eq!(counted + fleet_reserved + figures.waiting_without_fleet, total + reserved);
        }
        for (f, config) in figures.fleets.iter().zip(&fleets) {
            prop_assert!(u64::from(config.min) <= f.desired && f.desired <= u64::from(config.max));
        }
    }

    /// The order in which the core lists demand does not matter.
    #[test]
    fn figures_do_not_depend_on_the_order_of_demand(
        fleets in fleets(),
        rows in demand_rows(),
    ) {
        let forward = fleet_figures(&fleets, as_demand(&rows), |_| (1, 1));
        let mut reversed = rows.clone();
        reversed.reverse();
        prop_assert_eq!(forward, fleet_figures(&fleets, as_demand(&reversed), |_| (1, 1)));
    }
}

fn pool_with_fleets(fleets: Vec<FleetConfig>) -> PoolConfig {
    PoolConfig {
        fleets,
        ..PoolConfig::default()
    }
}

#[test]
fn fleets_count_every_waiting_task_past_the_snapshots_demand_cap() {
    let mut core = Core::new();
    let pool = PoolName::new("p").unwrap();
    // One fleet with 9 labels covers 2^9 distinct requirement sets.
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    let all: Vec<(&str, &str)> = names.iter().map(|n| (*n, "1")).collect();
    let config = pool_with_fleets(vec![fleet(&all, 0, 1_000, 10)]);
    core.handle(
        Millis(0),
        Event::PoolConfigured {
            pool: pool.clone(),
            config,
        },
    )
    .unwrap();
    let sets = MAX_DEMAND_ROWS as u64 + 44;
    for id in 0..sets {
        let mut spec = TaskSpec::new(TaskId(id), pool.clone());
        // A distinct non-empty subset of the fleet's labels per task.
        spec.required = (0..names.len())
            .filter(|bit| (id + 1) & (1 << bit) != 0)
            .map(|bit| all[bit])
            .collect();
        core.handle(Millis(0), Event::Submitted(spec)).unwrap();
    }
    let snap = core.snapshot();
    let p = &snap.pools[0];
    assert!(snap.truncated && p.demand.len() == MAX_DEMAND_ROWS);
    assert_eq!(p.waiting, sets);
    assert_eq!(p.fleets[0].waiting, sets, "{:?}", p.fleets);
    assert_eq!(p.fleets[0].desired, sets.div_ceil(10));
}

#[test]
fn a_due_reservation_asks_for_a_worker_before_its_start() {
    let mut core = Core::new();
    let pool = PoolName::new("p").unwrap();
    let gpu = Labels::from([("gpu", "a100")]);
    let mut config = pool_with_fleets(vec![
        fleet(&[], 0, 4, 1),
        fleet(&[("gpu", "a100")], 0, 4, 2),
    ]);
    config.reservation_lead = Millis(30_000);
    core.handle(
        Millis(0),
        Event::PoolConfigured {
            pool: pool.clone(),
            config,
        },
    )
    .unwrap();
    let mut spec = TaskSpec::new(TaskId(1), pool.clone());
    spec.required = gpu.clone();
    spec.fixed_start = Some(FixedStart {
        start_at: Millis(60_000),
        tolerance: Millis(1_000),
    });
    core.handle(Millis(0), Event::Submitted(spec)).unwrap();
    // Not due yet: nobody is wanted.
    let early = answer(&core.snapshot(), &pool, &gpu);
    assert_eq!((early.reserved, early.desired), (0, 0));
    // Due from start_at - reservation_lead: one gpu worker, before start_at.
    core.handle(Millis(35_000), Event::Tick).unwrap();
    let due = answer(&core.snapshot(), &pool, &gpu);
    assert_eq!((due.waiting, due.reserved, due.desired), (0, 1, 1));
    let cpu = answer(&core.snapshot(), &pool, &Labels::new());
    assert_eq!((cpu.reserved, cpu.desired), (0, 0));
}

// ---- GET /v1/autoscale over the embedded scheduler ----------------------------

/// Pool `p` declares an unlabeled fleet (min 1, 1 slot per worker) and a
/// `gpu=a100` fleet (0..3 workers of 2 slots); its executor never ends, so
/// a started task stays busy. Capacity: 1 unlabeled slot, no gpu slot.
fn scheduler() -> Scheduler {
    let sched = Scheduler::builder()
        .pool(
            "p",
            pool_with_fleets(vec![
                fleet(&[], 1, 5, 1),
                fleet(&[("gpu", "a100")], 0, 3, 2),
            ]),
        )
        .build()
        .unwrap();
    sched.set_capacity("p", 1).unwrap();
    sched
        .executor("p", |_ctx: TaskContext, _payload: Bytes| async move {
            pending::<Result<Bytes, TaskError>>().await
        })
        .unwrap();
    sched
}

async fn get(app: &axum::Router, uri: &str) -> (StatusCode, String) {
    let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn figures(app: &axum::Router, query: &str) -> Value {
    let (status, text) = get(app, &format!("/v1/autoscale?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{query}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// `(desired, waiting, busy, capacity, min, max)` of an answer.
fn six(v: &Value) -> [u64; 6] {
    ["desired", "waiting", "busy", "capacity", "min", "max"]
        .map(|k| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}")))
}

#[tokio::test]
async fn autoscale_scales_a_fleet_from_zero_and_counts_each_task_once() {
    let sched = std::sync::Arc::new(scheduler());
    let app = cronoq::http::router(sched.clone());
    let gpu = "pool=p&labels=gpu=a100";

    // Idle: 0 gpu workers; the unlabeled fleet keeps its min.
    assert_eq!(six(&figures(&app, gpu).await), [0, 0, 0, 0, 0, 3]);
    assert_eq!(six(&figures(&app, "pool=p").await), [1, 0, 0, 1, 1, 5]);
    assert_eq!(figures(&app, gpu).await["declared"], true);

    // Three gpu tasks and no gpu worker: ceil(3 / 2) = 2 workers.
    for i in 0..3 {
        sched
            .submit(Task::new(format!("g{i}")).pool("p").label("gpu", "a100"))
            .await
            .unwrap();
    }
    assert_eq!(six(&figures(&app, gpu).await), [2, 3, 0, 0, 0, 3]);
    // URL-encoded labels mean the same.
    assert_eq!(
        six(&figures(&app, "labels=gpu%3Da100&pool=p").await),
        [2, 3, 0, 0, 0, 3]
    );

    // Unlabeled tasks: one runs on the unlabeled slot, two wait; they count
    // toward the unlabeled fleet only (least specialized), not the gpu one.
    for i in 0..3 {
        sched
            .submit(Task::new(format!("c{i}")).pool("p"))
            .await
            .unwrap();
    }
    assert_eq!(
        six(&figures(&app, "pool=p&labels=").await),
        [3, 2, 1, 1, 1, 5]
    );
    assert_eq!(six(&figures(&app, gpu).await), [2, 3, 0, 0, 0, 3]);

    // Gpu workers arrive: two tasks run, one waits; still 2 workers wanted.
    sched
        .set_group_capacity("p", Labels::from([("gpu", "a100")]), 2)
        .unwrap();
    assert_eq!(six(&figures(&app, gpu).await), [2, 1, 2, 2, 0, 3]);

    // Past max: clamped.
    for i in 0..10 {
        sched
            .submit(Task::new(format!("more{i}")).pool("p").label("gpu", "a100"))
            .await
            .unwrap();
    }
    assert_eq!(figures(&app, gpu).await["desired"], 3);

    // The same figures in /metrics, for every declared fleet.
    let (status, metrics) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        metrics.contains("cronoq_autoscale_desired{pool=\"p\",labels=\"gpu=a100\"} 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cronoq_autoscale_desired{pool=\"p\",labels=\"\"} 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cronoq_autoscale_waiting{pool=\"p\",labels=\"gpu=a100\"} 11\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn autoscale_answers_undeclared_label_sets_and_unknown_pools_with_zero() {
    let sched = std::sync::Arc::new(scheduler());
    let app = cronoq::http::router(sched.clone());
    sched
        .set_group_capacity("p", Labels::from([("gpu", "h100")]), 4)
        .unwrap();
    // A task only an h100 group can run: no declared fleet covers it.
    sched
        .submit(
            Task::new("h")
                .pool("p")
                .label("gpu", "h100")
                .label("zone", "eu"),
        )
        .await
        .unwrap();

    // Undeclared: desired 0 (tasks count toward declared fleets only), but
    // its group's busy and capacity are shown.
    let h100 = figures(&app, "pool=p&labels=gpu=h100").await;
    assert_eq!(six(&h100), [0, 0, 0, 4, 0, 0]);
    assert_eq!(h100["declared"], false);
    // An unknown pool: all zero, still 200.
    let nobody = figures(&app, "pool=nobody&labels=gpu=a100").await;
    assert_eq!(six(&nobody), [0, 0, 0, 0, 0, 0]);
    assert_eq!(nobody["declared"], false);
    // No pool named: the default pool.
    assert_eq!(figures(&app, "").await["pool"], "default");

    let (_, metrics) = get(&app, "/metrics").await;
    assert!(
        metrics.contains("cronoq_autoscale_waiting_without_fleet{pool=\"p\"} 1\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("cronoq_autoscale_desired{pool=\"p\",labels=\"gpu=h100\"}"),
        "only declared fleets have series: {metrics}"
    );
}

#[tokio::test]
async fn malformed_autoscale_queries_are_invalid_argument_and_change_nothing() {
    let sched = std::sync::Arc::new(scheduler());
    let app = cronoq::http::router(sched.clone());
    sched.submit(Task::new("x").pool("p")).await.unwrap();
    let before = sched.snapshot();
    for query in [
        "pool=p&labels=gpu",               // not name=value
        "pool=p&labels=gpu=a100,gpu=h100", // one name, two values
        "pool=p&labels=gpu=a%20100",       // a space in a value
        "pool=p&labels=%3Dx",              // empty name
        "pool=a.b",                        // not a pool name
        "pool=",                           // empty pool name
        "pool=p&pool=q",                   // given twice
        "pool=p&labels=&labels=gpu=a100",  // given twice
        "pool=p&label=gpu=a100",           // unknown parameter (typo)
        "pool=p&labels=a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1,j=1,k=1,l=1,m=1,n=1,o=1,p=1,q=1",
        "pool=%FF", // not UTF-8
    ] {
        let (status, text) = get(&app, &format!("/v1/autoscale?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["code"], "INVALID_ARGUMENT", "{query}: {text}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("autoscale query: "),
            "{text}"
        );
    }
    assert_eq!(sched.snapshot(), before);
    // Other methods are not routes.
    let request = Request::builder()
        .method("POST")
        .uri("/v1/autoscale?pool=p")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

// ---- over a real cronoq server --------------------------------------------------

/// `procs::SERVER_CONFIG` declares, in pool `default`, an unlabeled fleet
/// (0..4, 1 slot per worker) and a `gpu=a100` fleet (0..3, 2 slots).
#[tokio::test]
async fn a_server_answers_autoscale_from_zero_and_as_workers_join() {
    let mut c = procs::Cluster::start(&[]).await;
    let url = format!(
        "{}/v1/autoscale?pool=default&labels=gpu=a100",
        c.server.http_url()
    );
    let read = |url: String| async move {
        let (status, text) = procs::http_get(&url).await;
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()
    };
    assert_eq!(six(&read(url.clone()).await), [0, 0, 0, 0, 0, 3]);

    let held = procs::hold("gpu-job", "go");
    let first = c.submit_payload(&held, "gpu=a100").await;
    let second = c.submit_payload(&held, "gpu=a100").await;
    let third = c.submit_payload(&held, "gpu=a100").await;
    procs::eventually("three gpu tasks to ask for two workers", || {
        let url = url.clone();
        async move {
            let v = read(url).await;
            if six(&v) == [2, 3, 0, 0, 0, 3] {
                Ok(())
            } else {
                Err(v.to_string())
            }
        }
    })
    .await;

    // A worker of the fleet joins (2 slots): two run, one waits.
    c.add_worker("gpu-1", "gpu=a100", 2).await;
    c.running(first).await;
    c.running(second).await;
    procs::eventually("two busy slots and one waiting task", || {
        let url = url.clone();
        async move {
            let v = read(url).await;
            if six(&v) == [2, 1, 2, 2, 0, 3] {
                Ok(())
            } else {
                Err(v.to_string())
            }
        }
    })
    .await;
    let (_, metrics) = procs::http_get(&format!("{}/metrics", c.server.http_url())).await;
    assert!(
        metrics.contains("cronoq_autoscale_desired{pool=\"default\",labels=\"gpu=a100\"} 2\n"),
        "{metrics}"
    );

    c.release("go");
    for id in [first, second, third] {
        c.succeeded(id).await;
    }
    procs::eventually(
        "the fleet to be idle again: back to one worker's worth",
        || {
            let url = url.clone();
            async move {
                let v = read(url).await;
                if six(&v) == [0, 0, 0, 2, 0, 3] {
                    Ok(())
                } else {
                    Err(v.to_string())
                }
            }
        },
    )
    .await;
}
