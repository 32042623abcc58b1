//! OpenTelemetry export (issue 37, item 1): OTLP over HTTP, off unless
//! configured (`[telemetry]` in a config file, or the standard `OTEL_*`
//! env vars, which win: [`config`]).
//!
//! What is exported, and where it is made:
//!
//! - **A task's life** (`cronoq.task` → `cronoq.queued` → `cronoq.attempt`)
//!   from a [`TaskTrace`] the leader's driver or the embedded scheduler
//!   hands over when the task finishes: plain data with recorded times, so
//!   neither state machine reads a clock or creates a span ([`trace`]).
//! - **A worker's attempt** (`cronoq.worker.attempt` → `cronoq.command`):
//!   `tracing` spans of target `cronoq::otel`, made OpenTelemetry spans by
//!   the [`Telemetry::layer`] the process installs in its subscriber
//!   (`cronoq worker` does; `tracing-opentelemetry`).
//!
//! **Exporting never makes scheduling wait.** Everything goes into one
//! bounded queue with a non-blocking push (`max_queue_size`, default
//! 2048 spans); a span that finds it full is dropped and counted
//! ([`counters`]: `cronoq_trace_spans_dropped_total` on `/metrics`). One
//! tokio task takes batches from it, turns task traces into spans there
//! (off the scheduler's path) and posts them. This is the SDK's
//! `BatchSpanProcessor` made over for cronoq: the SDK's keeps its drop
//! count to itself, and exports from a thread of its own where the hyper
//! client, which needs tokio, cannot run (docs/choices.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, watch};

mod config;
mod trace;

pub use config::{ConfigError, ExportSettings, Protocol, TelemetryConfig};
pub use trace::{TaskTrace, TaskTraceIds, TraceSalt};

/// The `tracing` target of the spans [`Telemetry::layer`] exports.
pub const TARGET: &str = "cronoq::otel";

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// This process's span counts since it started (every [`Telemetry`] in it
/// together; all zero while nothing is exported).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Spans the collector took.
    pub exported: u64,
    /// Spans dropped because the queue was full.
    pub dropped: u64,
    /// Spans of export requests that failed (an error answer, a timeout,
    /// no collector).
    pub failed: u64,
}

/// The process's span counts (`/metrics`).
pub fn counters() -> Counters {
    Counters {
        exported: EXPORTED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
    }
}

enum Item {
    Span(Box<SpanData>),
    Task(Box<TaskTrace>),
}

/// A running exporter: a cloneable handle to its queue. Dropping the last
/// handle does not flush; [`Telemetry::shutdown`] does.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Telemetry({})", self.service_name())
    }
}

struct Inner {
    queue: Queue,
    provider: SdkTracerProvider,
    stop: watch::Sender<bool>,
    exporting: Mutex<Option<tokio::task::JoinHandle<()>>>,
    service_name: String,
}

/// The sending side of the queue (also inside the SDK's processor).
#[derive(Clone, Debug)]
struct Queue {
    sender: mpsc::Sender<Item>,
    closed: Arc<AtomicBool>,
}

impl Queue {
    fn push(&self, item: Item, spans: usize) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.sender.try_send(item).is_err() {
            // Full, or (should its task have died) closed: dropped either way.
            if DROPPED.fetch_add(spans as u64, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    "trace export queue full: spans are dropped (cronoq_trace_spans_dropped_total)"
                );
            }
        }
    }
}

impl std::fmt::Debug for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::Span(s) => write!(f, "Span({})", s.name),
            Item::Task(t) => write!(f, "Task({})", t.ids.task()),
        }
    }
}

/// The SDK's end of the queue: spans made through [`Telemetry::tracer`]
/// (the worker's, by way of `tracing`) join the task traces there.
#[derive(Debug)]
struct QueueProcessor(Queue);

impl opentelemetry_sdk::trace::SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        self.0.push(Item::Span(Box::new(span)), 1);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // The export task drains on `Telemetry::shutdown`, which awaits it.
        Ok(())
    }
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Not called inside a tokio runtime.
    #[error("telemetry: the exporter starts inside a tokio runtime")]
    NoRuntime,
    /// The OTLP exporter refused its settings.
    #[error("telemetry: {0}")]
    Exporter(String),
}

impl StartError {
    /// Its stable code: every start error is a setting to fix.
    pub fn code(&self) -> crate::core::ErrorCode {
        crate::core::ErrorCode::INVALID_ARGUMENT
    }
}

impl Telemetry {
    /// Starts exporting as `config` and the process's env say, or returns
    /// `None` when neither configures it (nothing is started, no thread,
    /// no task). Inside a tokio runtime.
    pub fn start(
        config: &TelemetryConfig,
        default_service: &str,
    ) -> Result<Option<Telemetry>, StartError> {
        match config.resolve(default_service, |key| std::env::var(key).ok())? {
            None => Ok(None),
            Some(settings) => Telemetry::export_to(settings).map(Some),
        }
    }

    /// [`Telemetry::start`] from the env vars alone (the embedded
    /// scheduler's opt-in).
    pub fn from_env(default_service: &str) -> Result<Option<Telemetry>, StartError> {
        Telemetry::start(&TelemetryConfig::default(), default_service)
    }

    /// Exports over OTLP/HTTP with `settings`.
    pub fn export_to(settings: ExportSettings) -> Result<Telemetry, StartError> {
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StartError::NoRuntime);
        }
        let client: Arc<dyn opentelemetry_http::HttpClient> =
            if settings.traces_endpoint.starts_with("https:") {
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_native_roots()
                    .map_err(|e| StartError::Exporter(format!("loading the CA certificates: {e}")))?
                    .https_or_http()
                    .enable_http1()
                    .build();
                Arc::new(opentelemetry_http::hyper::HyperClient::new(
                    https,
                    settings.export_timeout,
                    None,
                ))
            } else {
                Arc::new(
                    opentelemetry_http::hyper::HyperClient::with_default_connector(
                        settings.export_timeout,
                        None,
                    ),
                )
            };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_shared_http_client(client)
            .with_endpoint(settings.traces_endpoint.clone())
            .with_protocol(match settings.protocol {
                Protocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
                Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
            })
            .with_timeout(settings.export_timeout)
            .build()
            .map_err(|e| StartError::Exporter(e.to_string()))?;
        tracing::info!(
            endpoint = %settings.traces_endpoint,
            service = %settings.service_name,
            "exporting traces over otlp"
        );
        Telemetry::with_exporter(exporter, settings)
    }

    /// Exports to `exporter` (any [`SpanExporter`]: tests hand an in-memory
    /// one); `settings` for the queue, batches and resource.
    pub fn with_exporter<E: SpanExporter + 'static>(
        mut exporter: E,
        settings: ExportSettings,
    ) -> Result<Telemetry, StartError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let resource = Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attributes(
                settings
                    .resource_attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .with_attributes([
                KeyValue::new("telemetry.sdk.name", "opentelemetry"),
                KeyValue::new("telemetry.sdk.language", "rust"),
            ])
            .build();
        exporter.set_resource(&resource);
        let (sender, receiver) = mpsc::channel(settings.max_queue_size);
        let queue = Queue {
            sender,
            closed: Arc::new(AtomicBool::new(false)),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(QueueProcessor(queue.clone()))
            .with_resource(resource)
            .build();
        let (stop, stopped) = watch::channel(false);
        let exporting = runtime.spawn(export_loop(exporter, receiver, stopped, settings.clone()));
        Ok(Telemetry {
            inner: Arc::new(Inner {
                queue,
                provider,
                stop,
                exporting: Mutex::new(Some(exporting)),
                service_name: settings.service_name,
            }),
        })
    }

    /// Queues a finished task's spans (never waits; counted if dropped).
    pub fn task(&self, trace: TaskTrace) {
        let spans = trace.span_count();
        self.inner.queue.push(Item::Task(Box::new(trace)), spans);
    }

    /// The `service.name` spans are exported under.
    pub fn service_name(&self) -> &str {
        &self.inner.service_name
    }

    /// A tracer whose spans join this exporter's queue.
    pub fn tracer(&self) -> SdkTracer {
        self.inner.provider.tracer_with_scope(
            opentelemetry::InstrumentationScope::builder("cronoq")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        )
    }

    /// The `tracing` layer that exports cronoq's own spans (target
    /// [`TARGET`]: a worker's attempts and their commands) through this
    /// exporter, with the warnings logged inside them as span events.
    /// Add it to the process's subscriber; without it those spans are
    /// only logs, and a worker's command gets the lease's traceparent.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use tracing_subscriber::layer::SubscriberExt as _;
    /// use tracing_subscriber::util::SubscriberInitExt as _;
    /// let telemetry = cronoq::telemetry::Telemetry::from_env("my-app")?;
    /// tracing_subscriber::registry()
    ///     .with(tracing_subscriber::fmt::layer())
    ///     .with(telemetry.as_ref().map(|t| t.layer()))
    ///     .init();
    /// # Ok(()) }
    /// ```
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber
            + for<'span> tracing_subscriber::registry::LookupSpan<'span>
            + Send
            + Sync,
    {
        use tracing_subscriber::Layer as _;
        let filter = tracing_subscriber::filter::Targets::new()
            .with_target("cronoq", tracing::Level::WARN)
            .with_target(TARGET, tracing::Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer())
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(filter)
    }

    /// Stops taking spans, exports what is queued (waiting at most
    /// `timeout` for the collector) and stops the export task.
    pub async fn shutdown(&self, timeout: Duration) {
        self.inner.queue.closed.store(true, Ordering::Relaxed);
        let _ = self.inner.stop.send(true);
        let task = self
            .inner
            .exporting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::warn!("trace export did not finish in time; spans still queued are lost");
            }
        }
    }
}

static GLOBAL: OnceLock<Telemetry> = OnceLock::new();

/// Makes `telemetry` the process's exporter, which `cronoq server` reads
/// ([`global`]); once per process (`false` if one was set before).
pub fn set_global(telemetry: Telemetry) -> bool {
    GLOBAL.set(telemetry).is_ok()
}

/// The process's exporter, if [`set_global`] was called.
pub fn global() -> Option<&'static Telemetry> {
    GLOBAL.get()
}

/// Makes the W3C `traceparent` the parent of `span`, a `tracing` span of
/// target [`TARGET`] not entered yet (a worker's attempt under its lease's
/// span). Nothing happens when it is malformed or no [`Telemetry::layer`]
/// records the span.
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let Some((trace_id, parent, flags)) = trace::parse_traceparent(traceparent) else {
        return;
    };
    let remote = SpanContext::new(
        TraceId::from_bytes(trace_id),
        SpanId::from_bytes(parent),
        TraceFlags::new(flags),
        true,
        Default::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

/// `span`'s W3C traceparent as exported (its trace, its own id), or
/// `None` when no [`Telemetry::layer`] records it.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

/// Records an attempt's outcome on `span`: `cronoq.outcome`, and an error
/// status with `error` when it did not succeed.
pub fn set_outcome(span: &tracing::Span, outcome: &'static str, error: Option<&str>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    span.set_attribute("cronoq.outcome", outcome);
    if let Some(error) = error {
        span.set_status(opentelemetry::trace::Status::error(error.to_string()));
    }
}

/// Takes items off the queue, a batch at a time, until stopped; then
/// exports what is left.
async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut queue: mpsc::Receiver<Item>,
    mut stop: watch::Receiver<bool>,
    settings: ExportSettings,
) {
    let max_batch = settings.max_export_batch_size;
    let mut batch: Vec<SpanData> = Vec::with_capacity(max_batch);
    let mut failing = false;
    let add = |item: Item, batch: &mut Vec<SpanData>| match item {
        Item::Span(span) => batch.push(*span),
        Item::Task(trace) => batch.extend(trace.spans()),
    };
    let mut stopping = false;
    while !stopping {
        let first = tokio::select! {
            item = queue.recv() => item,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(first) = first else {
            break;
        };
        add(first, &mut batch);
        let due = tokio::time::Instant::now() + settings.schedule_delay;
        while batch.len() < max_batch {
            tokio::select! {
                item = queue.recv() => match item {
                    Some(item) => add(item, &mut batch),
                    None => { stopping = true; break }
                },
                _ = tokio::time::sleep_until(due) => break,
                _ = stop.wait_for(|s| *s) => { stopping = true; break }
            }
        }
        send(&exporter, &mut batch, max_batch, &settings, &mut failing).await;
    }
    queue.close();
    while let Ok(item) = queue.try_recv() {
        add(item, &mut batch);
    }
    send(&exporter, &mut batch, max_batch, &settings, &mut failing).await;
    let _ = exporter.shutdown();
}

/// Exports `batch` in requests of at most `max_batch` spans.
async fn send<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    max_batch: usize,
    settings: &ExportSettings,
    failing: &mut bool,
) {
    while !batch.is_empty() {
        let rest = batch.split_off(batch.len().min(max_batch));
        let request = std::mem::replace(batch, rest);
        let n = request.len() as u64;
        let result = tokio::time::timeout(
            settings.export_timeout + Duration::from_secs(1),
            exporter.export(request),
        )
        .await;
        match result {
            Ok(Ok(())) => {
                EXPORTED.fetch_add(n, Ordering::Relaxed);
                if std::mem::take(failing) {
                    tracing::info!("trace export works again");
                }
            }
            Ok(Err(e)) => {
                FAILED.fetch_add(n, Ordering::Relaxed);
                if !std::mem::replace(failing, true) {
                    tracing::warn!(error = %e, spans = n, endpoint = %settings.traces_endpoint, "trace export failed");
                }
            }
            Err(_) => {
                FAILED.fetch_add(n, Ordering::Relaxed);
                if !std::mem::replace(failing, true) {
                    tracing::warn!(spans = n, endpoint = %settings.traces_endpoint, "trace export timed out");
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
