//! The OpenAPI document (`GET /v1/openapi.json`, `proto-schemas/openapi.yaml`)
//! against the real router, in process (`tower::ServiceExt::oneshot`):
//!
//! * the routes the router serves ([`cronoq::http::served_routes`], the one
//!   list that adds every route) are exactly the document's operations;
//! * every documented operation answers through the router, with and
//!   without credentials (not the "no route" fallback, not 405), and its
//!   JSON answer validates against the schema the document gives for its
//!   status; each documents a success answer and gives one at least once
//!   (task 1 and schedule `nightly` exist; bodies are valid examples), so
//!   success bodies are checked as well as errors; a method the document
//!   does not give for a path is the fallback, as is a path it does not
//!   have;
//! * every router serves the document, open to callers without a token;
//! * errors are one schema whose code is the enum of the stable codes.
//!
//! That the checked-in `proto-schemas/openapi.yaml` is not stale is
//! `tests/proto_schemas.rs`'s job (the same generator writes it).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use cronoq::api::Api;
use cronoq::core::ErrorCode;
use cronoq::http::HttpAuth;
use cronoq::{Scheduler, TaskContext, TaskError};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// `(method, path)` of every operation in the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// A concrete path for a templated one.
fn concrete(path: &str) -> String {
    // Task 1 is live (its cancel succeeds); task 2 finished with an
    // output (`GET /v1/tasks/{id}/output`).
    let id = if path.ends_with("/output") { "2" } else { "1" };
    path.replace("{id}", id).replace("{name}", "nightly")
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

/// A valid body for each documented request body (a route that takes a
/// new body needs one here).
fn example_body(path: &str, round: usize) -> Value {
    match path {
        "/v1/tasks" => json!({"pool": "default", "payload": "hi"}),
        "/v1/schedules" => json!({
            "name": format!("made-{round}"), "cron": "0 * * * *",
            "task": {"pool": "default", "payload": "go"}
        }),
        "/v1/schedules/{name}/backfill" => {
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T02:00:00Z"})
        }
        other => panic!("no example body for {other}: add one"),
    }
}

async fn call(app: &axum::Router, method: &str, path: &str) -> Answer {
    call_with(app, method, path, None).await
}

async fn call_with(app: &axum::Router, method: &str, path: &str, body: Option<Value>) -> Answer {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = Request::builder().method(method.clone()).uri(path);
    let body = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            Body::from(body.to_string())
        }
        None => Body::empty(),
    };
    let response = app
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        content_type,
        body,
    }
}

/// The router's own "no such route / method" answer.
fn is_fallback(answer: &Answer) -> bool {
    if answer.status == StatusCode::METHOD_NOT_ALLOWED {
        return true;
    }
    let Ok(body) = serde_json::from_slice::<Value>(&answer.body) else {
        return false;
    };
    answer.status == StatusCode::NOT_FOUND
        && body["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("no route "))
}

/// Pool `default`, whose tasks run until cancelled.
fn scheduler() -> Arc<dyn Api> {
    let sched = Scheduler::new();
    sched.set_capacity("default", 3).unwrap();
    sched
        .executor("default", |_ctx: TaskContext, payload: Bytes| async move {
            // `done` finishes at once (its output is itself); the rest
            // run until cancelled.
            if payload.as_ref() == b"done" {
                return Ok(payload);
            }
            std::future::pending::<Result<Bytes, TaskError>>().await
        })
        .unwrap();
    Arc::new(sched)
}

/// The routers `cronoq dev`, a leader and a follower serve: the same
/// router, without and with credentials.
fn routers() -> Vec<(&'static str, axum::Router)> {
    let api = scheduler();
    let through = api.clone();
    vec![
        ("no auth", cronoq::http::router(api.clone())),
        (
            "auth",
            cronoq::http::router_with_auth(api, Some(HttpAuth::with(move |_| through.clone()))),
        ),
    ]
}

/// The schema the document gives for `status` of `method path`, as a
/// schema that resolves the document's references.
fn answer_schema(doc: &Value, method: &str, path: &str, status: StatusCode) -> Option<Value> {
    let responses = &doc["paths"][path][method.to_lowercase()]["responses"];
    let response = responses
        .get(status.as_str())
        .or_else(|| responses.get("default"))
        .unwrap_or_else(|| panic!("{method} {path}: status {status} is not documented"));
    let schema = response["content"]["application/json"].get("schema")?;
    let mut schema = schema.clone();
    if let Some(map) = schema.as_object_mut() {
        map.insert("components".into(), doc["components"].clone());
    }
    Some(schema)
}

#[test]
fn the_router_serves_exactly_the_documented_routes() {
    let doc = cronoq::http::openapi_document();
    let served = cronoq::http::served_routes();
    let served_set: BTreeSet<(String, String)> = served
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        served_set.len(),
        served.len(),
        "a route added twice: {served:?}"
    );
    assert_eq!(served_set, documented(&doc));
    // The routes the README and the module docs promise, by name.
    for route in [
        ("POST", "/v1/tasks"),
        ("GET", "/v1/tasks/{id}"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/metrics"),
        ("POST", "/v1/schedules/{name}/backfill"),
    ] {
        assert!(
            served_set.contains(&(route.0.to_string(), route.1.to_string())),
            "{route:?}"
        );
    }
    assert_eq!(doc["openapi"], "3.1.0");
}

#[tokio::test]
async fn every_documented_route_answers_as_documented() {
    let doc = cronoq::http::openapi_document();
    let operations = documented(&doc);
    // Deletions last, so the rest find what they ask about.
    let mut order: Vec<&(String, String)> = operations.iter().collect();
    order.sort_by_key(|(method, path)| (method == "DELETE", path.clone(), method.clone()));
    let mut succeeded = BTreeSet::new();
    for (round, (name, app)) in routers().into_iter().enumerate() {
        // Task 1 and schedule `nightly` exist for the routes that name them.
        let submitted = call_with(
            &app,
            "POST",
            "/v1/tasks",
            Some(example_body("/v1/tasks", 0)),
        )
        .await;
        assert!(
            submitted.status.is_success(),
            "{name}: {}",
            String::from_utf8_lossy(&submitted.body)
        );
        if round == 0 {
            // Task 2: finished, with an output.
            let done = json!({"pool": "default", "payload": "done"});
            let submitted = call_with(&app, "POST", "/v1/tasks", Some(done)).await;
            assert!(submitted.status.is_success());
            for _ in 0..1_000 {
                let answer = call(&app, "GET", "/v1/tasks/2").await;
                let status: Value = serde_json::from_slice(&answer.body).unwrap();
                if status["state"] == "succeeded" {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        let nightly = json!({"name": "nightly", "cron": "0 * * * *", "task": {"pool": "default"}});
        let created = call_with(&app, "POST", "/v1/schedules", Some(nightly)).await;
        assert!(
            created.status.is_success(),
            "{name}: {}",
            String::from_utf8_lossy(&created.body)
        );
        for (method, path) in order.iter().copied() {
            let operation = &doc["paths"][path][method.to_lowercase()];
            let documented_2xx = operation["responses"]
                .as_object()
                .unwrap()
                .keys()
                .any(|status| status.starts_with('2'));
            assert!(
                documented_2xx,
                "{method} {path}: no success answer documented"
            );
            let body = operation
                .get("requestBody")
                .map(|_| example_body(path, round));
            let answer = call_with(&app, method, &concrete(path), body).await;
            if answer.status.is_success() {
                succeeded.insert((method.clone(), path.clone()));
            }
            assert!(
                !is_fallback(&answer),
                "{name}: {method} {path} is documented but not served ({})",
                answer.status
            );
            if answer.content_type.starts_with("application/json") {
                let body: Value = serde_json::from_slice(&answer.body).unwrap();
                let Some(schema) = answer_schema(&doc, method, path, answer.status) else {
                    panic!(
                        "{name}: {method} {path}: JSON answer {} without a schema",
                        answer.status
                    );
                };
                let validator = jsonschema::validator_for(&schema).unwrap();
                if let Err(e) = validator.validate(&body) {
                    panic!(
                        "{name}: {method} {path} {}: {body} does not fit the document: {e}",
                        answer.status
                    );
                }
            }
        }
        // What the document does not have, the router does not serve.
        let paths: BTreeSet<&String> = operations.iter().map(|(_, p)| p).collect();
        for path in paths {
            for method in METHODS {
                let method = method.to_uppercase();
                if operations.contains(&(method.clone(), path.clone())) {
                    continue;
                }
                let answer = call(&app, &method, &concrete(path)).await;
                assert!(
                    is_fallback(&answer),
                    "{name}: {method} {path} is served but not documented ({})",
                    answer.status
                );
            }
        }
        for path in ["/v1/nope", "/v1/tasks/1/nope", "/openapi.json"] {
            assert!(
                is_fallback(&call(&app, "GET", path).await),
                "{name}: {path}"
            );
        }
    }
    // Not only errors: every route's success answer was checked too.
    let failed: Vec<_> = operations.difference(&succeeded).collect();
    assert!(failed.is_empty(), "never answered with success: {failed:?}");
}

#[tokio::test]
async fn every_router_serves_the_document_without_credentials() {
    let doc = cronoq::http::openapi_document();
    for (name, app) in routers() {
        let answer = call(&app, "GET", "/v1/openapi.json").await;
        assert_eq!(answer.status, StatusCode::OK, "{name}");
        assert_eq!(answer.content_type, "application/json", "{name}");
        let served: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(served, doc, "{name}");
    }
}

#[test]
fn errors_are_one_schema_with_the_stable_codes() {
    let doc = cronoq::http::openapi_document();
    let schemas = &doc["components"]["schemas"];
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
    assert_eq!(schemas["ErrorCode"]["enum"], json!(codes));
    // draft-07 style: a described reference is wrapped in `allOf`.
    let code = &schemas["ErrorBody"]["properties"]["code"];
    let reference = code.get("$ref").unwrap_or(&code["allOf"][0]["$ref"]);
    assert_eq!(reference, "#/components/schemas/ErrorCode");
    let required: BTreeSet<&str> = schemas["ErrorBody"]["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, BTreeSet::from(["code", "message"]));
    // Every /v1 operation but the document itself answers errors so, and
    // takes a Bearer token where auth is required (the auth layer reads
    // one on /v1 alone); the others take none.
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (method, path) in documented(&doc) {
        let operation = &doc["paths"][&path][method.to_lowercase()];
        if !path.starts_with("/v1/") || path == "/v1/openapi.json" {
            assert_eq!(operation.get("security"), None, "{method} {path}");
            continue;
        }
        assert_eq!(
            operation["security"],
            json!([{}, {"bearer": []}]),
            "{method} {path}"
        );
        let default = &operation["responses"]["default"];
        assert_eq!(
            default["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody",
            "{method} {path}"
        );
    }
}
