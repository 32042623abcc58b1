//! OpenTelemetry export with real processes (issue 37, item 1): a
//! nats-server, `cronoq server` and `cronoq worker` export OTLP over
//! HTTP/protobuf to a collector inside this test (`POST /v1/traces`,
//! decoded with `opentelemetry-proto`), and the spans of a task retried
//! once form one tree under the submitter's traceparent:
//!
//! ```text
//! submitter b7ad6b7169203331 (not exported: the test's own)
//! └─ cronoq.task                        leader
//!    ├─ cronoq.queued      attempt 1    leader
//!    ├─ cronoq.attempt     attempt 1    leader  (failed)
//!    │  └─ cronoq.worker.attempt        worker
//!    │     └─ cronoq.command            worker  (exit 3)
//!    ├─ cronoq.queued      attempt 2    leader  (backoff)
//!    └─ cronoq.attempt     attempt 2    leader  (succeeded)
//!       └─ cronoq.worker.attempt        worker
//!          └─ cronoq.command            worker  (exit 0)
//! ```
//!
//! The command's `TRACEPARENT` is its worker attempt span. A task without
//! a traceparent is a root of its own, with the same shape. Nothing here
//! depends on speed: the collector keeps what it gets, and the checks
//! poll with the cluster's deadline.

mod procs;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use procs::{eventually, Cluster, SERVER_CONFIG};
use prost::Message as _;

/// A span as received, with the `service.name` of its resource.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<String> {
        let value = self
            .span
            .attributes
            .iter()
            .find(|kv| kv.key == key)?
            .value
            .as_ref()?
            .value
            .as_ref()?;
        Some(match value {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            Value::BoolValue(b) => b.to_string(),
            Value::DoubleValue(d) => d.to_string(),
            other => format!("{other:?}"),
        })
    }

    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    fn id(&self) -> String {
        hex(&self.span.span_id)
    }

    fn parent(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    fn attempt(&self) -> u32 {
        self.attr("cronoq.attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver on a free loopback port.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    server: tokio::task::JoinHandle<()>,
}

type Spans = Arc<Mutex<Vec<Received>>>;

async fn receive(
    State(spans): State<Spans>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert_eq!(content_type, "application/x-protobuf", "OTLP/HTTP protobuf");
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut got = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                got.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    let mut answer = HeaderMap::new();
    answer.insert(
        header::CONTENT_TYPE,
        "application/x-protobuf".parse().unwrap(),
    );
    (
        StatusCode::OK,
        answer,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl Collector {
    async fn start() -> Collector {
        let spans: Spans = Arc::default();
        let router = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Collector { url, spans, server }
    }

    /// The spans of trace `trace_id` received so far.
    fn trace(&self, trace_id: &str) -> Vec<Received> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| s.trace_id() == trace_id)
            .cloned()
            .collect()
    }

    /// Waits until trace `trace_id` has `n` spans; returns them.
    async fn await_trace(&self, trace_id: &str, n: usize) -> Vec<Received> {
        eventually(&format!("{n} spans of trace {trace_id}"), || async {
            let spans = self.trace(trace_id);
            if spans.len() >= n {
                Ok(spans)
            } else {
                let names: Vec<_> = spans
                    .iter()
                    .map(|s| format!("{}#{}", s.span.name, s.attempt()))
                    .collect();
                Err(format!("{} spans: {names:?}", spans.len()))
            }
        })
        .await
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `GET <url>/metrics`: the body.
async fn metrics(http_url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = http_url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_string()
}

fn sample(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// The checks a retried task's tree must pass, whatever its root; returns
/// the worker attempt spans by attempt.
fn check_tree(spans: &[Received], task: u64, submitter: Option<&str>) -> BTreeMap<u32, Received> {
    let named =
        |name: &str| -> Vec<&Received> { spans.iter().filter(|s| s.span.name == name).collect() };
    let by_attempt = |name: &str| -> BTreeMap<u32, Received> {
        named(name)
            .into_iter()
            .map(|s| (s.attempt(), s.clone()))
            .collect()
    };
    let summary: Vec<String> = spans
        .iter()
        .map(|s| {
            format!(
                "{} {}#{} {}<-{}",
                s.service,
                s.span.name,
                s.attempt(),
                s.id(),
                s.parent()
            )
        })
        .collect();
    assert_eq!(spans.len(), 9, "one tree of nine spans: {summary:#?}");

    let tasks = named("cronoq.task");
    assert_eq!(tasks.len(), 1, "{summary:#?}");
    let root = tasks[0];
    assert_eq!(
        root.service, "cronoq-leader",
        "the [telemetry] service_name"
    );
    match submitter {
        Some(parent) => assert_eq!(root.parent(), parent, "under the submitter's span"),
        None => assert!(
            root.span.parent_span_id.is_empty(),
            "a root: {}",
            root.parent()
        ),
    }
    assert_eq!(
        root.attr("cronoq.task_id").as_deref(),
        Some(&*task.to_string())
    );
    assert_eq!(root.attr("cronoq.pool").as_deref(), Some("default"));
    assert_eq!(root.attr("cronoq.outcome").as_deref(), Some("succeeded"));
    assert_eq!(root.attr("cronoq.attempts").as_deref(), Some("2"));

    let queued = by_attempt("cronoq.queued");
    assert_eq!(
        queued.keys().copied().collect::<Vec<_>>(),
        [1, 2],
        "{summary:#?}"
    );
    assert_eq!(
        queued[&2].attr("cronoq.wait_reason").as_deref(),
        Some("backoff")
    );

    let leased = by_attempt("cronoq.attempt");
    assert_eq!(
        leased.keys().copied().collect::<Vec<_>>(),
        [1, 2],
        "{summary:#?}"
    );
    assert_eq!(leased[&1].attr("cronoq.outcome").as_deref(), Some("failed"));
    assert_eq!(
        leased[&2].attr("cronoq.outcome").as_deref(),
        Some("succeeded")
    );
    for span in queued.values().chain(leased.values()) {
        assert_eq!(span.service, "cronoq-leader");
        assert_eq!(
            span.parent(),
            root.id(),
            "{} under the task",
            span.span.name
        );
        assert_eq!(
            span.attr("cronoq.task_id").as_deref(),
            Some(&*task.to_string())
        );
        assert!(span.span.start_time_unix_nano >= root.span.start_time_unix_nano);
        assert!(span.span.end_time_unix_nano <= root.span.end_time_unix_nano);
    }
    for span in leased.values() {
        assert_eq!(span.attr("cronoq.worker_id").as_deref(), Some("w1"));
        assert_eq!(span.attr("cronoq.group").as_deref(), Some(""));
    }
    // The waits and attempts follow one another.
    assert!(queued[&1].span.end_time_unix_nano <= leased[&1].span.start_time_unix_nano);
    assert!(leased[&1].span.end_time_unix_nano <= queued[&2].span.start_time_unix_nano);
    assert!(queued[&2].span.end_time_unix_nano <= leased[&2].span.start_time_unix_nano);

    let worked = by_attempt("cronoq.worker.attempt");
    assert_eq!(
        worked.keys().copied().collect::<Vec<_>>(),
        [1, 2],
        "{summary:#?}"
    );
    for (attempt, span) in &worked {
        assert_eq!(span.service, "cronoq-worker-test", "OTEL_SERVICE_NAME");
        assert_eq!(
            span.parent(),
            leased[attempt].id(),
            "the worker's attempt under its lease"
        );
        assert_eq!(span.attr("cronoq.worker_id").as_deref(), Some("w1"));
        assert_eq!(
            span.attr("cronoq.task_id").as_deref(),
            Some(&*task.to_string())
        );
        assert_eq!(span.attr("cronoq.pool").as_deref(), Some("default"));
        assert_eq!(span.attr("cronoq.group").as_deref(), Some(""));
    }
    assert_eq!(worked[&1].attr("cronoq.outcome").as_deref(), Some("failed"));
    assert_eq!(
        worked[&2].attr("cronoq.outcome").as_deref(),
        Some("succeeded")
    );

    let commands: Vec<&Received> = named("cronoq.command");
    assert_eq!(commands.len(), 2, "{summary:#?}");
    let mut exits = Vec::new();
    for command in commands {
        let parent = worked
            .iter()
            .find(|(_, w)| w.id() == command.parent())
            .unwrap_or_else(|| panic!("a command span under a worker attempt: {summary:#?}"));
        exits.push((*parent.0, command.attr("process.exit.code")));
    }
    exits.sort();
    assert_eq!(
        exits,
        [(1, Some("3".to_string())), (2, Some("0".to_string()))]
    );
    worked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_tasks_spans_form_one_tree_under_the_submitters_traceparent() {
    let collector = Collector::start().await;
    let batch_fast = ("OTEL_BSP_SCHEDULE_DELAY", "50");
    // The server: endpoint from the env, service name from [telemetry]
    // (the env would win; it has none).
    let config = format!("{SERVER_CONFIG}\n[telemetry]\nservice_name = \"cronoq-leader\"\n");
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.as_str());
    let mut cluster = Cluster::start_with_env(&config, &[endpoint, batch_fast], &[]).await;
    cluster
        .add_worker_with_env(
            "w1",
            "",
            1,
            &[
                endpoint,
                batch_fast,
                ("OTEL_SERVICE_NAME", "cronoq-worker-test"),
            ],
        )
        .await;

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let submitter = "b7ad6b7169203331";
    let traced = cluster
        .submit(
            cronoq::Task::new("traced failfirst")
                .traceparent(format!("00-{trace_id}-{submitter}-01")),
        )
        .await;
    cluster.succeeded(traced).await;
    let spans = collector.await_trace(trace_id, 9).await;
    let worked = check_tree(&spans, traced.0, Some(submitter));

    // Each command saw its worker attempt span as TRACEPARENT.
    let seen = std::fs::read_to_string(cluster.dir.path().join("traceparents.log")).unwrap();
    for (attempt, span) in &worked {
        let line = format!("{} {attempt} 00-{trace_id}-{}-01", traced.0, span.id());
        assert!(seen.lines().any(|l| l == line), "{line} in:\n{seen}");
    }

    // Without a traceparent: a root trace of the same shape.
    let untraced = cluster.submit(cronoq::Task::new("plain failfirst")).await;
    cluster.succeeded(untraced).await;
    let root_trace = eventually("the untraced task's spans", || async {
        let spans = collector.spans.lock().unwrap();
        spans
            .iter()
            .find(|s| {
                s.span.name == "cronoq.task"
                    && s.attr("cronoq.task_id") == Some(untraced.0.to_string())
            })
            .map(Received::trace_id)
            .ok_or_else(|| format!("{} spans so far", spans.len()))
    })
    .await;
    assert_ne!(root_trace, trace_id);
    let spans = collector.await_trace(&root_trace, 9).await;
    check_tree(&spans, untraced.0, None);

    // The leader counts what it exported (once the collector answered),
    // and dropped nothing.
    let url = cluster.server.http_url();
    let text = eventually("the leader to count 10 exported spans", || async {
        let text = metrics(&url).await;
        match sample(&text, "cronoq_trace_spans_exported_total") {
            n if n >= 10 => Ok(text),
            n => Err(format!("{n} exported")),
        }
    })
    .await;
    assert_eq!(sample(&text, "cronoq_trace_spans_dropped_total"), 0);
    assert_eq!(sample(&text, "cronoq_trace_spans_failed_total"), 0);
}
