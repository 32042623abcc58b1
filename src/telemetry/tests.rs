//! The exporter's queue: batches reach the exporter, a full queue drops
//! and counts instead of waiting, and nothing runs when nothing is
//! configured.

use super::*;
use crate::core::{Millis, PoolName, TaskId, TaskState};
use std::sync::atomic::AtomicUsize;

/// An exporter that keeps what it is given, or never answers (the
/// embedded scheduler's tests use it too).
#[derive(Clone, Debug, Default)]
pub(crate) struct Capture {
    pub(crate) spans: Arc<Mutex<Vec<SpanData>>>,
    calls: Arc<AtomicUsize>,
    stuck: bool,
}

impl SpanExporter for Capture {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.stuck {
            std::future::pending::<()>().await;
        }
        self.spans.lock().unwrap().extend(batch);
        Ok(())
    }
}

pub(crate) fn settings(max_queue_size: usize) -> ExportSettings {
    ExportSettings {
        traces_endpoint: "http://127.0.0.1:1/v1/traces".into(),
        protocol: Protocol::HttpProtobuf,
        service_name: "test".into(),
        resource_attributes: Default::default(),
        max_queue_size,
        max_export_batch_size: 4,
        schedule_delay: Duration::from_millis(20),
        export_timeout: Duration::from_secs(60),
    }
}

fn trace(task: u64) -> TaskTrace {
    TaskTrace {
        ids: TaskTraceIds::of(None, TraceSalt(1), TaskId(task)).unwrap(),
        pool: PoolName::default(),
        submitted_at: Millis(1),
        finished_at: Millis(2),
        state: TaskState::Cancelled,
        error: None,
        waits: Vec::new(),
        attempts: Vec::new(),
        schedule: None,
    }
}

#[test]
fn nothing_configured_starts_nothing() {
    if std::env::vars().any(|(k, _)| k.starts_with("OTEL_EXPORTER_OTLP_")) {
        return; // this process's own env configures it
    }
    // Outside any runtime: off needs none, so nothing was started.
    let off = Telemetry::start(&TelemetryConfig::default(), "cronoq").unwrap();
    assert!(off.is_none());
    assert!(Telemetry::from_env("cronoq").unwrap().is_none());
}

#[tokio::test]
async fn task_traces_and_sdk_spans_reach_the_exporter_in_batches() {
    let capture = Capture::default();
    let telemetry = Telemetry::with_exporter(capture.clone(), settings(64)).unwrap();
    for task in 1..=3 {
        telemetry.task(trace(task));
    }
    {
        use opentelemetry::trace::{Span as _, Tracer as _};
        let mut span = telemetry.tracer().start("worker-side");
        span.end();
    }
    telemetry.shutdown(Duration::from_secs(5)).await;
    let spans = capture.spans.lock().unwrap();
    assert_eq!(spans.len(), 3 * 2 + 1);
    assert!(spans.iter().any(|s| s.name == "worker-side"));
    assert!(
        capture.calls.load(Ordering::SeqCst) >= 2,
        "at most 4 spans a request"
    );
    // Taken after shutdown: ignored, never counted as dropped.
    let dropped = counters().dropped;
    telemetry.task(trace(9));
    assert_eq!(counters().dropped, dropped);
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_waiting() {
    let capture = Capture {
        stuck: true,
        ..Default::default()
    };
    let telemetry = Telemetry::with_exporter(capture.clone(), settings(2)).unwrap();
    let before = counters().dropped;
    // The export task takes one batch and hangs in the exporter; the queue
    // then holds two; everything after is dropped at once.
    let started = std::time::Instant::now();
    for task in 1..=200 {
        telemetry.task(trace(task));
        tokio::task::yield_now().await;
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let dropped = counters().dropped - before;
    assert!(dropped >= 2 * (200 - 2 - 4), "dropped {dropped} spans");
    assert_eq!(dropped % 2, 0, "a task's spans are dropped together");
    telemetry.shutdown(Duration::from_millis(100)).await;
}
