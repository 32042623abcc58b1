//! The remote [`cronoq::worker::Worker`] and the NATS / HTTP clients for
//! Python. The worker's handler is a Python function reached through a
//! [`Bridge`]; every network call is a tokio future turned into an asyncio
//! awaitable by pyo3-async-runtimes.

use std::sync::Arc;
use std::time::Duration;

use cronoq::client::{ClientOptions, HttpClient};
use cronoq::core::{PoolName, TaskId};
use cronoq::worker::WorkerOptions;
use pyo3::prelude::*;
use tokio::sync::watch;

use crate::bridge::Bridge;
use crate::convert::{self, integer, NativeSnapshot, TaskArgs, TaskStatus};
use crate::errors::{client, invalid, rejection, worker};

/// A remote worker (see `cronoq.Worker`).
#[pyclass(frozen, module = "cronoq._native")]
pub struct Worker {
    options: WorkerOptions,
    id: String,
    stop: watch::Sender<bool>,
}

#[pymethods]
impl Worker {
    /// Checks every option that can be checked without a server, so a bad
    /// one raises here rather than when the worker runs.
    #[new]
    #[pyo3(signature = (nats_url, *, pool = "default", labels = None, slots = None, token = None,
                        nkey_seed = None, id = None, grace = None, prefix = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        nats_url: &str,
        pool: &str,
        labels: Option<&Bound<'_, PyAny>>,
        slots: Option<&Bound<'_, PyAny>>,
        token: Option<String>,
        nkey_seed: Option<String>,
        id: Option<String>,
        grace: Option<&Bound<'_, PyAny>>,
        prefix: Option<String>,
    ) -> PyResult<Worker> {
        PoolName::new(pool).map_err(rejection)?;
        let mut options = WorkerOptions::new(nats_url).pool(pool);
        for (k, v) in convert::labels(labels, "labels")?.iter() {
            options = options.label(k, v);
        }
        if let Some(slots) = slots {
            let slots = integer::<u32>(slots, "slots", "a positive 32-bit integer")?;
            if slots == 0 {
                return Err(invalid("slots must be at least 1"));
            }
            options = options.slots(slots);
        }
        if token.is_some() && nkey_seed.is_some() {
            return Err(invalid("give token or nkey_seed, not both"));
        }
        if let Some(token) = token {
            if token.is_empty() {
                return Err(invalid("token is empty"));
            }
            options = options.token(token);
        }
        if let Some(seed) = nkey_seed {
            nkeys::KeyPair::from_seed(seed.trim())
                .map_err(|e| invalid(format!("nkey seed is not valid: {e}")))?;
            options = options.nkey_seed(seed);
        }
        if let Some(id) = &id {
            cronoq::wire::validate_worker_id(id).map_err(rejection)?;
            options = options.id(id.clone());
        }
        if let Some(grace) = grace {
            options = options.grace(convert::duration(grace, "grace")?);
        }
        if let Some(prefix) = prefix {
            cronoq::wire::Subjects::new(&prefix).map_err(rejection)?;
            options = options.prefix(prefix);
        }
        let id = id.unwrap_or_else(cronoq::worker::generate_worker_id);
        options = options.id(id.clone());
        Ok(Worker {
            options,
            id,
            stop: watch::channel(false).0,
        })
    }

    /// The worker's id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Runs the worker with Python function number `slot` of `bridge` as
    /// its handler until [`Worker::stop`], then drains; an awaitable.
    fn run<'py>(&self, py: Python<'py>, bridge: &Bridge, slot: u32) -> PyResult<Bound<'py, PyAny>> {
        self.stop.send_replace(false);
        let mut stopped = self.stop.subscribe();
        let worker =
            cronoq::worker::Worker::new(self.options.clone(), bridge.shared.executor(slot));
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            worker.run_until(shutdown).await.map_err(self::worker)
        })
    }

    /// Asks a running worker to drain and stop.
    fn stop(&self) {
        self.stop.send_replace(true);
    }
}

enum Kind {
    /// Both boxed: which one is larger depends on the features hyper is
    /// built with (the OTLP exporter's client adds HTTP/2 to it).
    Nats(Box<cronoq::client::Client>),
    Http(Box<HttpClient>),
}

/// A connected client (see `cronoq.Client`).
#[pyclass(frozen, module = "cronoq._native")]
pub struct Client {
    kind: Arc<Kind>,
}

/// Runs `f` on the client in tokio; an awaitable of its result.
fn call<'py, T, F, Fut>(py: Python<'py>, kind: &Arc<Kind>, f: F) -> PyResult<Bound<'py, PyAny>>
where
    F: FnOnce(Arc<Kind>) -> Fut,
    Fut: std::future::Future<Output = Result<T, cronoq::client::Error>> + Send + 'static,
    T: for<'p> IntoPyObject<'p> + Send + 'static,
{
    let fut = f(kind.clone());
    pyo3_async_runtimes::tokio::future_into_py(py, async move { fut.await.map_err(client) })
}

/// The options of a client of `url`, every one checked (a bad one raises
/// `InvalidArgument` before anything connects): `token` and `nkey_seed`
/// are the cronoq credential (at most one; an nkey only over NATS, as the
/// HTTP API takes Bearer tokens), `nats_token` the NATS connection token.
fn client_options(
    url: &str,
    token: Option<String>,
    nkey_seed: Option<String>,
    nats_token: Option<String>,
    prefix: Option<String>,
    request_timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<ClientOptions> {
    let mut options = ClientOptions::new();
    match (token, nkey_seed) {
        (Some(_), Some(_)) => return Err(invalid("give token or nkey_seed, not both")),
        (Some(token), None) => {
            if token.is_empty() {
                return Err(invalid("token is empty"));
            }
            options = options.token(token);
        }
        (None, Some(seed)) => {
            if is_http(url) {
                return Err(invalid(
                    "nkey_seed cannot be used over HTTP: the HTTP API takes a token (Bearer); connect over NATS for an nkey",
                ));
            }
            options = options
                .nkey_seed(&seed)
                .map_err(|e| invalid(format!("nkey seed is not valid: {e}")))?;
        }
        (None, None) => {}
    }
    if let Some(token) = nats_token {
        options = options.nats_token(token);
    }
    if let Some(prefix) = prefix {
        options = options.prefix(prefix);
    }
    if let Some(t) = request_timeout {
        let t: Duration = convert::duration(t, "request_timeout")?;
        if t.is_zero() {
            return Err(invalid("request_timeout must be above zero"));
        }
        options = options.request_timeout(t);
    }
    Ok(options)
}

fn is_http(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

#[pymethods]
impl Client {
    /// Checks the options of [`Client::connect`] without connecting
    /// (what `cronoq.Client(...)` does at once).
    #[staticmethod]
    #[pyo3(signature = (url, *, token = None, nkey_seed = None, nats_token = None, prefix = None,
                        request_timeout = None))]
    fn check(
        url: String,
        token: Option<String>,
        nkey_seed: Option<String>,
        nats_token: Option<String>,
        prefix: Option<String>,
        request_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        client_options(&url, token, nkey_seed, nats_token, prefix, request_timeout).map(|_| ())
    }

    /// Connects to `url`: `nats://…` (or `tls://…`) over NATS,
    /// `http://…`/`https://…` to the HTTP API; an awaitable. `token` or
    /// `nkey_seed` is the cronoq credential to act as; `nats_token` the
    /// NATS connection token.
    #[staticmethod]
    #[pyo3(signature = (url, *, token = None, nkey_seed = None, nats_token = None, prefix = None,
                        request_timeout = None))]
    fn connect<'py>(
        py: Python<'py>,
        url: String,
        token: Option<String>,
        nkey_seed: Option<String>,
        nats_token: Option<String>,
        prefix: Option<String>,
        request_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = client_options(&url, token, nkey_seed, nats_token, prefix, request_timeout)?;
        let http = is_http(&url);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let kind = if http {
                Kind::Http(Box::new(options.http(&url).map_err(client)?))
            } else {
                Kind::Nats(Box::new(options.connect(&url).await.map_err(client)?))
            };
            Ok(Client {
                kind: Arc::new(kind),
            })
        })
    }

    #[pyo3(signature = (payload, *, pool = "default", labels = None, priority = None,
                        deadline = None, start_at = None, tolerance = None, max_attempts = None,
                        idempotency_key = None, attempt_timeout = None, est_runtime = None,
                        backoff = None, fairness_key = None, fairness_weight = None,
                        concurrency_key = None, concurrency_limit = None,
                        concurrency_policy = None, preemptible = None))]
    #[allow(clippy::too_many_arguments)]
    fn submit<'py>(
        &self,
        py: Python<'py>,
        payload: &Bound<'py, PyAny>,
        pool: &str,
        labels: Option<&Bound<'py, PyAny>>,
        priority: Option<&Bound<'py, PyAny>>,
        deadline: Option<&Bound<'py, PyAny>>,
        start_at: Option<&Bound<'py, PyAny>>,
        tolerance: Option<&Bound<'py, PyAny>>,
        max_attempts: Option<&Bound<'py, PyAny>>,
        idempotency_key: Option<&Bound<'py, PyAny>>,
        attempt_timeout: Option<&Bound<'py, PyAny>>,
        est_runtime: Option<&Bound<'py, PyAny>>,
        backoff: Option<&Bound<'py, PyAny>>,
        fairness_key: Option<&Bound<'py, PyAny>>,
        fairness_weight: Option<&Bound<'py, PyAny>>,
        concurrency_key: Option<&Bound<'py, PyAny>>,
        concurrency_limit: Option<&Bound<'py, PyAny>>,
        concurrency_policy: Option<&Bound<'py, PyAny>>,
        preemptible: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let task = TaskArgs {
            payload,
            pool,
            labels,
            priority,
            deadline,
            start_at,
            tolerance,
            max_attempts,
            idempotency_key,
            attempt_timeout,
            est_runtime,
            backoff,
            fairness_key,
            fairness_weight,
            concurrency_key,
            concurrency_limit,
            concurrency_policy,
            preemptible,
        }
        .to_task()?;
        // Checked here too, so bad input raises at the call, not at the await.
        task.to_spec(TaskId(1), usize::MAX).map_err(rejection)?;
        call(py, &self.kind, |kind| async move {
            let id = match &*kind {
                Kind::Nats(c) => c.submit(task).await?,
                Kind::Http(c) => c.submit(task).await?,
            };
            Ok(id.0)
        })
    }

    /// A task's status; an awaitable.
    fn get<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        call(py, &self.kind, |kind| async move {
            let inner = match &*kind {
                Kind::Nats(c) => c.get(TaskId(id)).await?,
                Kind::Http(c) => c.get(TaskId(id)).await?,
            };
            Ok(TaskStatus { inner })
        })
    }

    /// Cancels a task; an awaitable.
    fn cancel<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        call(py, &self.kind, |kind| async move {
            match &*kind {
                Kind::Nats(c) => c.cancel(TaskId(id)).await,
                Kind::Http(c) => c.cancel(TaskId(id)).await,
            }
        })
    }

    /// Waits until a task is finished; its final status; an awaitable.
    fn wait<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        call(py, &self.kind, |kind| async move {
            let inner = match &*kind {
                Kind::Nats(c) => c.wait(TaskId(id)).await?,
                Kind::Http(c) => c.wait(TaskId(id)).await?,
            };
            Ok(TaskStatus { inner })
        })
    }

    /// The schedule calls over this client.
    fn schedules(&self) -> crate::schedules::Schedules {
        let api: Arc<dyn cronoq::api::Api> = match &*self.kind {
            Kind::Nats(c) => Arc::new((**c).clone()),
            Kind::Http(c) => Arc::new((**c).clone()),
        };
        crate::schedules::Schedules::new(api)
    }

    /// Pools, groups, demand and workers; an awaitable.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        call(py, &self.kind, |kind| async move {
            let inner = match &*kind {
                Kind::Nats(c) => c.snapshot().await?,
                Kind::Http(c) => c.snapshot().await?,
            };
            Ok(NativeSnapshot { inner })
        })
    }
}
