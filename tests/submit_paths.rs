//! One way in for submissions (issue 21 item 3), held as a table: every row
//! of `tests/data/submit_refusals.json` (a bad submission) is sent over
//! HTTP (`POST /v1/tasks` to the leader), over NATS (a plain publish with
//! `Cronoq-*` headers) and through the CLI (`cronoq submit`), against a
//! real nats-server and `cronoq server`, and must be refused with the
//! row's code and message on each. `python/tests/test_submit_paths.py`
//! reads the same table for Python's `submit(...)`.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use async_nats::jetstream;
use async_nats::HeaderMap;
use cronoq::core::{TaskId, TaskState};
use procs::{describe, http_post, Cluster};
use serde_json::Value;

/// The table both languages read.
fn table() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/submit_refusals.json"
    );
    let text = std::fs::read_to_string(path).expect("reading the table");
    let table: Value = serde_json::from_str(&text).expect("the table is JSON");
    table["rows"].as_array().expect("rows").clone()
}

fn carries(row: &Value, path: &str) -> bool {
    !row["not_over"]
        .as_array()
        .is_some_and(|paths| paths.iter().any(|p| p == path))
}

/// An option's text form: spans and times are text already; numbers and
/// the backoff pair (as `INITIAL,MAX`) become text.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(b) => format!(
            "{},{}",
            b["initial"].as_str().expect("initial"),
            b["max"].as_str().expect("max")
        ),
        other => other.to_string(),
    }
}

/// The CLI's flag and the plain publish's header of a JSON option.
fn flag_and_header(option: &str) -> (&'static str, &'static str) {
    match option {
        "pool" => ("--pool", ""),
        "tolerance" => ("--tolerance", "Cronoq-Tolerance"),
        "idempotency_key" => ("--idempotency-key", "Cronoq-Idempotency-Key"),
        "max_attempts" => ("--max-attempts", "Cronoq-Max-Attempts"),
        "attempt_timeout" => ("--attempt-timeout", "Cronoq-Attempt-Timeout"),
        "backoff" => ("--backoff", "Cronoq-Backoff"),
        "fairness_key" => ("--fairness-key", "Cronoq-Fairness-Key"),
        "fairness_weight" => ("--fairness-weight", "Cronoq-Fairness-Weight"),
        "concurrency_key" => ("--concurrency-key", "Cronoq-Concurrency-Key"),
        "concurrency_limit" => ("--concurrency-limit", "Cronoq-Concurrency-Limit"),
        "concurrency_policy" => ("--concurrency-policy", "Cronoq-Concurrency-Policy"),
        other => panic!("the table uses option {other}: give it a flag and a header here"),
    }
}

#[tokio::test]
async fn the_same_bad_submission_is_refused_alike_over_http_nats_and_the_cli() {
    let c = Cluster::start(&[]).await;
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let js = jetstream::new(nats);
    let url = c.nats_url();
    let rows = table();
    assert!(rows.len() >= 7, "the table has {} rows", rows.len());
    let mut failures = Vec::new();
    for row in &rows {
        let name = row["name"].as_str().expect("name");
        let code = row["code"].as_str().expect("code");
        let message = row["message"].as_str().expect("message");
        let options = row["options"].as_object().expect("options");

        // HTTP: the options are the body.
        let (status, body) = http_post(
            &format!("{}/v1/tasks", c.server.http_url()),
            &row["options"].to_string(),
        )
        .await;
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if status < 400 || answer["code"] != code || answer["message"] != message {
            failures.push(format!("{name}: HTTP answered {status} {body}"));
        }

        // The CLI: one flag per option.
        let mut args = vec!["submit".to_string(), "--nats".into(), url.clone()];
        for (option, value) in options {
            args.push(flag_and_header(option).0.into());
            args.push(text_of(value));
        }
        args.push("payload".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = c.cli(&argv).await;
        let want = format!("error: {message} [{code}]");
        if out.code != Some(2) || out.stderr.trim() != want {
            failures.push(format!(
                "{name}: the CLI exited {:?} with stderr {:?}, not {want:?}",
                out.code, out.stderr
            ));
        }

        // NATS: a plain publish, options in headers (the pool in the
        // subject); the leader records the refusal as the task's error.
        if !carries(row, "nats") {
            continue;
        }
        let mut headers = HeaderMap::new();
        let mut pool = "default".to_string();
        for (option, value) in options {
            match flag_and_header(option).1 {
                "" => pool = text_of(value),
                header => headers.insert(header, text_of(value).as_str()),
            }
        }
        let ack = js
            .publish_with_headers(format!("cronoq.submit.{pool}"), headers, "x".into())
            .await
            .expect("publish")
            .await
            .expect("puback");
        let status = c.finished(TaskId(ack.sequence)).await;
        let want = format!("submission refused: {message} [{code}]");
        if status.state != TaskState::Failed || status.error.as_deref() != Some(want.as_str()) {
            failures.push(format!(
                "{name}: over NATS {}, not {want:?}",
                describe(&status)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
