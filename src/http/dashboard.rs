//! The live dashboard at `GET /`: a page, its script and its style,
//! compiled into the binary (no CDN, works offline), and the one JSON view
//! it polls, `GET /v1/dashboard`.
//!
//! The view is built here from [`Api::snapshot`], [`Api::recent_tasks`],
//! [`Api::list_schedules`] and [`Api::health`], so the dashboard works over anything the router
//! serves: the embedded scheduler (`cronoq dev --embedded`) and every
//! `cronoq server`, leader or follower. It stays small however big the
//! installation: waiting tasks arrive aggregated per required label set
//! (the snapshot's demand rows), and workers are filtered, counted and
//! paged here, so a page never receives (or renders) 10,000 worker rows;
//! schedules are cut the same way ([`schedules_view`]: the next to fire
//! first).

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::openapi::{text_answer, DashboardParams, Params, Routes};
use super::HttpError;
use crate::api::{check_recent_limit, Api, Health, ScheduleEntry};
use crate::core::{LeaderInfo, Millis, PoolSnapshot, WorkerInfo};
use crate::task::TaskStatus;

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// The most worker rows one view carries.
pub const MAX_WORKER_ROWS: usize = 500;
/// The most schedule rows one view carries.
pub const MAX_SCHEDULE_ROWS: usize = 100;
/// The longest worker filter, in characters.
pub const MAX_FILTER_CHARS: usize = 200;

/// The dashboard's routes, merged into [`super::router`].
pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/", index, |op| {
            text_answer(
                op.summary("The live dashboard"),
                200,
                "text/html",
                "the page",
            )
        })
        .get("/dashboard/app.js", app_js, |op| {
            text_answer(
                op.summary("The dashboard's script"),
                200,
                "text/javascript",
                "the script",
            )
        })
        .get("/dashboard/app.css", app_css, |op| {
            text_answer(
                op.summary("The dashboard's style"),
                200,
                "text/css",
                "the style sheet",
            )
        })
        .get("/v1/dashboard", view, |op| {
            op.summary("What the dashboard shows, in one answer")
        })
}

/// The dashboard's Content Security Policy: its own script, style and
/// API only, an inline `data:` icon, and never inside a frame (with auth
/// off its submit form would otherwise be a clickjacking target; issue 34).
pub const DASHBOARD_CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, DASHBOARD_CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// The query of `GET /v1/dashboard`: which workers and how many tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewQuery {
    /// Workers whose id, pool or labels (`k=v,k=v`) contain this text.
    pub filter: String,
    /// Worker rows to skip (after filtering).
    pub offset: usize,
    /// Worker rows to show, 0..=[`MAX_WORKER_ROWS`].
    pub workers: usize,
    /// Recent tasks to show, 1..=[`crate::api::MAX_RECENT_TASKS`].
    pub tasks: usize,
}

impl Default for ViewQuery {
    fn default() -> Self {
        ViewQuery {
            filter: String::new(),
            offset: 0,
            workers: 50,
            tasks: 25,
        }
    }
}

impl ViewQuery {
    /// Reads `filter`, `offset`, `workers` and `tasks`; anything else, a
    /// repeated key or a value out of range is `INVALID_ARGUMENT`.
    ///
    /// ```
    /// use cronoq::http::dashboard::ViewQuery;
    /// let q = ViewQuery::parse(&[("workers".into(), "10".into()), ("filter".into(), "gpu".into())]).unwrap();
    /// assert_eq!((q.workers, q.filter.as_str(), q.tasks), (10, "gpu", 25));
    /// assert!(ViewQuery::parse(&[("workers".into(), "lots".into())]).is_err());
    /// assert!(ViewQuery::parse(&[("colour".into(), "red".into())]).is_err());
    /// ```
    pub fn parse(pairs: &[(String, String)]) -> Result<ViewQuery, HttpError> {
        let mut query = ViewQuery::default();
        let mut seen: Vec<&str> = Vec::new();
        for (key, value) in pairs {
            if seen.contains(&key.as_str()) {
                return Err(HttpError::invalid(format!(
                    "query parameter {key} is repeated"
                )));
            }
            seen.push(key);
            let number = |max: usize| -> Result<usize, HttpError> {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n <= max)
                    .ok_or_else(|| {
                        HttpError::invalid(format!(
                            "{key} must be an integer from 0 to {max}, not {:?}",
                            super::clamp_message(value)
                        ))
                    })
            };
            match key.as_str() {
                "filter" => {
                    if value.chars().count() > MAX_FILTER_CHARS {
                        return Err(HttpError::invalid(format!(
                            "filter is longer than {MAX_FILTER_CHARS} characters"
                        )));
                    }
                    query.filter = value.trim().to_string();
                }
                "offset" => query.offset = number(usize::MAX)?,
                "workers" => query.workers = number(MAX_WORKER_ROWS)?,
                "tasks" => {
                    query.tasks = number(usize::MAX)?;
                    check_recent_limit(query.tasks)?;
                }
                other => {
                    return Err(HttpError::invalid(format!(
                        "unknown query parameter {:?}; known: filter, offset, workers, tasks",
                        super::clamp_message(other)
                    )))
                }
            }
        }
        Ok(query)
    }
}

/// The workers part of a [`View`]: counts over all of them, and one page
/// of those that match the filter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkersView {
    /// Workers registered (as far as the snapshot lists them).
    pub total: usize,
    /// Their slots (a draining worker's count as 0).
    pub slots: u64,
    /// Busy slots.
    pub busy: u64,
    /// Workers draining.
    pub draining: usize,
    /// Workers (not draining) with every slot busy.
    pub full: usize,
    /// Workers that match the filter.
    pub matching: usize,
    /// The first row's position among the matching ones.
    pub offset: usize,
    /// One page of the matching workers, by pool then id.
    pub rows: Vec<WorkerInfo>,
}

/// `GET /v1/dashboard`: what the page shows, in one answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct View {
    /// The server's clock (ms since the Unix epoch), to show heartbeat ages.
    pub now: Millis,
    /// Liveness and readiness of the server answering.
    pub health: Health,
    /// Who leads and the epoch (none when embedded).
    pub leader: Option<LeaderInfo>,
    /// Pools with their groups and waiting demand (with reasons).
    pub pools: Vec<PoolSnapshot>,
    /// Worker counts and one page of rows.
    pub workers: WorkersView,
    /// The newest tasks, highest id first (summaries).
    pub tasks: Vec<TaskStatus>,
    /// Why the task list is missing, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_error: Option<String>,
    /// Schedules: how many, and the first [`MAX_SCHEDULE_ROWS`] to fire.
    pub schedules: SchedulesView,
    /// The snapshot's lists were cut (see `Snapshot::truncated`).
    pub truncated: bool,
}

/// The workers part of the view: counts over `workers`, and the page of
/// `query` among those matching its filter (case-insensitive substring of
/// id, pool or labels), by pool then id.
///
/// ```
/// use cronoq::core::{Labels, Millis, PoolName, WorkerInfo};
/// use cronoq::http::dashboard::{workers_view, ViewQuery};
/// let workers: Vec<WorkerInfo> = (0..10_000).map(|i| WorkerInfo {
///     id: format!("w{i:05}"), pool: PoolName::default(),
///     labels: if i % 2 == 0 { Labels::from([("gpu", "a100")]) } else { Labels::new() },
///     slots: 2, busy: 1, last_seen: Millis(0), draining: false,
/// }).collect();
/// let query = ViewQuery { filter: "GPU=A100".into(), workers: 20, ..ViewQuery::default() };
/// let view = workers_view(workers, &query);
/// assert_eq!((view.total, view.matching, view.rows.len()), (10_000, 5_000, 20));
/// assert_eq!(view.rows[0].id, "w00000");
/// ```
pub fn workers_view(mut workers: Vec<WorkerInfo>, query: &ViewQuery) -> WorkersView {
    let mut view = WorkersView {
        total: workers.len(),
        offset: query.offset,
        ..WorkersView::default()
    };
    for w in &workers {
        view.slots += u64::from(w.slots);
        view.busy += u64::from(w.busy);
        view.draining += usize::from(w.draining);
        view.full += usize::from(!w.draining && w.slots > 0 && w.busy >= w.slots);
    }
    let needle = query.filter.to_lowercase();
    if !needle.is_empty() {
        workers.retain(|w| {
            w.id.to_lowercase().contains(&needle)
                || w.pool.as_str().to_lowercase().contains(&needle)
                || w.labels.to_string().to_lowercase().contains(&needle)
        });
    }
    view.matching = workers.len();
    let end = query
        .offset
        .saturating_add(query.workers)
        .min(workers.len());
    if query.offset < end {
        // Only the page is sorted: select it first, O(n) not O(n log n).
        let order = |a: &WorkerInfo, b: &WorkerInfo| (&a.pool, &a.id).cmp(&(&b.pool, &b.id));
        if end < workers.len() {
            workers.select_nth_unstable_by(end, order);
            workers.truncate(end);
        }
        workers.sort_unstable_by(order);
        view.rows = workers.split_off(query.offset);
    }
    view
}

/// The schedules part of a [`View`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SchedulesView {
    /// Schedules in all.
    pub total: usize,
    /// Of them, paused.
    pub paused: usize,
    /// The next to fire first (paused ones last), then by name; at most
    /// [`MAX_SCHEDULE_ROWS`].
    pub rows: Vec<ScheduleEntry>,
    /// Why the list is missing, if it is (a server that serves no
    /// schedules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The schedules part of the view: counts over `entries`, and the
/// [`MAX_SCHEDULE_ROWS`] that fire next (paused ones, which fire never,
/// after the rest), ties by name.
pub fn schedules_view(mut entries: Vec<ScheduleEntry>) -> SchedulesView {
    let total = entries.len();
    let paused = entries.iter().filter(|e| e.paused).count();
    let key = |e: &ScheduleEntry| (e.next_fire.is_none(), e.next_fire, e.name.clone());
    let order = |a: &ScheduleEntry, b: &ScheduleEntry| key(a).cmp(&key(b));
    if entries.len() > MAX_SCHEDULE_ROWS {
        entries.select_nth_unstable_by(MAX_SCHEDULE_ROWS, order);
        entries.truncate(MAX_SCHEDULE_ROWS);
    }
    entries.sort_unstable_by(order);
    SchedulesView {
        total,
        paused,
        rows: entries,
        error: None,
    }
}

async fn view(
    State(node): State<Arc<dyn Api>>,
    super::Caller(api): super::Caller,
    query: Params<DashboardParams>,
) -> Result<Json<View>, HttpError> {
    let pairs = query.pairs()?;
    let query = ViewQuery::parse(&pairs)?;
    let snapshot = api.snapshot().await?;
    let (tasks, tasks_error) = match api.recent_tasks(query.tasks).await {
        Ok(tasks) => (tasks, None),
        // An older leader may not list tasks: show the rest anyway.
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let schedules = match api.list_schedules().await {
        Ok(entries) => schedules_view(entries),
        // An older leader, or a client that serves none: the rest anyway.
        Err(e) => SchedulesView {
            error: Some(e.to_string()),
            ..SchedulesView::default()
        },
    };
    let now = Millis::since_epoch(SystemTime::now());
    Ok(Json(View {
        now,
        // This server's own health, whoever the caller is.
        health: node.health(),
        leader: snapshot.leader,
        pools: snapshot.pools,
        workers: workers_view(snapshot.workers, &query),
        tasks,
        tasks_error,
        schedules,
        truncated: snapshot.truncated,
    }))
}
