//! The HTTP API with credentials (`router_with_auth`, issue 9): every
//! `/v1/*` call goes to the `Api` of the caller's Bearer token (or of no
//! credential), never to the router's own; a malformed `Authorization`
//! is 401 and calls nothing; the caller's refusals keep their status (401
//! with `WWW-Authenticate`, 403); health, metrics and the dashboard's
//! assets stay open. Then `HttpClient` end to end on a loopback port: a
//! token travels as Bearer, an nkey credential is refused before sending.
//!
//! The callers' `Api`s here are stubs that record who called: what the
//! leader decides is tested against a real server in `tests/auth_clients.rs`.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use cronoq::api::{Api, ApiFuture, Health};
use cronoq::auth::{token_id, Credential};
use cronoq::client::{ClientOptions, HttpClient};
use cronoq::core::{ErrorCode, Snapshot, TaskId};
use cronoq::http::{router_with_auth, HttpAuth};
use cronoq::wire::WireError;
use cronoq::{Task, TaskStatus};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

const TOKEN: &str = "submitter-token-0123456789";

/// An `Api` that answers everything (or refuses everything with `refuse`)
/// and records each call as `who verb`.
#[derive(Clone)]
struct Stub {
    who: String,
    refuse: Option<ErrorCode>,
    calls: Arc<Mutex<Vec<String>>>,
}

impl Stub {
    fn answer<T: Send + 'static>(&self, verb: &str, ok: T) -> ApiFuture<'static, T> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} {verb}", self.who));
        let result = match &self.refuse {
            Some(code) => Err(WireError::new(code.clone(), format!("{verb} refused"))),
            None => Ok(ok),
        };
        Box::pin(async move { result })
    }
}

impl Api for Stub {
    fn submit(&self, _task: Task) -> ApiFuture<'_, TaskId> {
        self.answer("submit", TaskId(7))
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} task", self.who));
        let code = self.refuse.clone().unwrap_or(ErrorCode::NOT_FOUND);
        Box::pin(async move { Err(WireError::new(code, format!("task {id}"))) })
    }
    fn cancel(&self, _id: TaskId) -> ApiFuture<'_, ()> {
        self.answer("cancel", ())
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        self.answer("snapshot", Snapshot::default())
    }
    fn recent_tasks(&self, _limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        self.answer("tasks", Vec::new())
    }
    fn health(&self) -> Health {
        Health {
            live: true,
            ready: true,
            detail: self.who.clone(),
        }
    }
}

/// The router with auth: the node's own `Api` records as `node`; each
/// caller's as `token:<id>` or `anonymous`, refusing with `refuse`.
struct App {
    router: axum::Router,
    calls: Arc<Mutex<Vec<String>>>,
}

fn app(refuse: Option<ErrorCode>) -> App {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let node = Stub {
        who: "node".into(),
        refuse: None,
        calls: calls.clone(),
    };
    let caller_calls = calls.clone();
    let auth = HttpAuth::with(move |credential: Option<Credential>| {
        let who = match &credential {
            Some(c) => format!("token:{}", c.id()),
            None => "anonymous".into(),
        };
        Arc::new(Stub {
            who,
            refuse: refuse.clone(),
            calls: caller_calls.clone(),
        }) as Arc<dyn Api>
    });
    App {
        router: router_with_auth(Arc::new(node), Some(auth)),
        calls,
    }
}

impl App {
    fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

struct Answer {
    status: StatusCode,
    www_authenticate: Option<String>,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    authorization: &[&[u8]],
    body: Option<&str>,
) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    for value in authorization {
        request = request.header(
            "authorization",
            axum::http::HeaderValue::from_bytes(value).unwrap(),
        );
    }
    let request = request
        .body(Body::from(body.unwrap_or("").to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let www_authenticate = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        www_authenticate,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// Every `/v1/*` route, with a body where it takes one.
const V1_ROUTES: [(&str, &str, Option<&str>); 7] = [
    ("GET", "/v1/snapshot", None),
    (
        "POST",
        "/v1/tasks",
        Some(r#"{"pool":"inference","payload":"x"}"#),
    ),
    ("GET", "/v1/tasks?limit=5", None),
    ("GET", "/v1/tasks/3", None),
    ("POST", "/v1/tasks/3/cancel", None),
    ("GET", "/v1/autoscale?pool=inference", None),
    ("GET", "/v1/dashboard", None),
];

fn method(m: &str) -> Method {
    m.parse().unwrap()
}

#[tokio::test]
async fn every_v1_route_calls_as_the_bearer_and_never_as_the_node() {
    let app = app(None);
    let bearer = format!("Bearer {TOKEN}");
    let caller = format!("token:{}", token_id(TOKEN));
    for (m, uri, body) in V1_ROUTES {
        let answer = call(&app.router, method(m), uri, &[bearer.as_bytes()], body).await;
        let calls = app.take_calls();
        assert!(!calls.is_empty(), "{m} {uri}: nothing called");
        assert!(
            calls.iter().all(|c| c.starts_with(&caller)),
            "{m} {uri} called {calls:?}"
        );
        // The stub knows no task: that lookup is 404; the rest answer.
        let want = if uri == "/v1/tasks/3" {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        assert_eq!(answer.status, want, "{m} {uri}: {}", answer.text);
    }
    // The scheme is case-insensitive.
    let answer = call(
        &app.router,
        Method::GET,
        "/v1/snapshot",
        &[format!("bearer {TOKEN}").as_bytes()],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(app.take_calls(), [format!("{caller} snapshot")]);
}

#[tokio::test]
async fn no_header_calls_anonymously_and_the_refusal_is_401_with_a_challenge() {
    let app = app(Some(ErrorCode::UNAUTHENTICATED));
    for (m, uri, body) in V1_ROUTES {
        let answer = call(&app.router, method(m), uri, &[], body).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{m} {uri}");
        assert_eq!(answer.json()["code"], "UNAUTHENTICATED", "{m} {uri}");
        assert_eq!(
            answer.www_authenticate.as_deref(),
            Some(r#"Bearer realm="cronoq""#),
            "{m} {uri}"
        );
        let calls = app.take_calls();
        assert!(
            !calls.is_empty() && calls.iter().all(|c| c.starts_with("anonymous ")),
            "{m} {uri} called {calls:?}"
        );
    }
}

#[tokio::test]
async fn a_permission_refusal_is_403() {
    let app = app(Some(ErrorCode::PERMISSION_DENIED));
    let bearer = format!("Bearer {TOKEN}");
    for (m, uri, body) in V1_ROUTES {
        let answer = call(&app.router, method(m), uri, &[bearer.as_bytes()], body).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{m} {uri}");
        assert_eq!(answer.json()["code"], "PERMISSION_DENIED", "{m} {uri}");
        assert_eq!(answer.www_authenticate, None);
    }
}

#[tokio::test]
async fn a_malformed_authorization_is_401_and_calls_nothing() {
    let app = app(None);
    let secret = "s3cret-s3cret-s3cret";
    let bad: [&[&[u8]]; 7] = [
        &[b"Basic dXNlcjpzM2NyZXQ="],
        &[b"Bearer"],
        &[b"Bearer "],
        &[b"s3cret-s3cret-s3cret"],
        &[b"Bearer s3cret-s3cret-s3cret extra"],
        &[
            b"Bearer s3cret-s3cret-s3cret",
            b"Bearer s3cret-s3cret-s3cret",
        ],
        &[b"Bearer s3cr\xe9t-s3cret-s3cret"],
    ];
    for headers in bad {
        for (m, uri, body) in V1_ROUTES {
            let answer = call(&app.router, method(m), uri, headers, body).await;
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{headers:?} {uri}");
            let json = answer.json();
            assert_eq!(json["code"], "UNAUTHENTICATED", "{headers:?} {uri}");
            let message = json["message"].as_str().unwrap();
            assert!(
                message.contains("malformed Authorization header"),
                "{message}"
            );
            assert!(!message.contains(secret), "the secret came back: {message}");
            assert!(answer.www_authenticate.is_some());
        }
    }
    assert_eq!(app.take_calls(), Vec::<String>::new());
}

#[tokio::test]
async fn health_metrics_and_the_dashboard_page_stay_open() {
    let app = app(Some(ErrorCode::UNAUTHENTICATED));
    for uri in [
        "/healthz",
        "/readyz",
        "/",
        "/dashboard/app.js",
        "/dashboard/app.css",
    ] {
        let answer = call(&app.router, Method::GET, uri, &[], None).await;
        assert_eq!(answer.status, StatusCode::OK, "{uri}: {}", answer.text);
    }
    // Nothing of the above asked a caller's Api.
    assert_eq!(app.take_calls(), Vec::<String>::new());
    // /metrics reads the node's own snapshot, with or without a header.
    let answer = call(&app.router, Method::GET, "/metrics", &[b"Basic bad"], None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(app.take_calls(), ["node snapshot"]);
    // The page asks for a token and keeps it in sessionStorage.
    let page = call(&app.router, Method::GET, "/", &[], None).await.text;
    assert!(page.contains(r#"id="token-form""#), "{page}");
    let script = call(&app.router, Method::GET, "/dashboard/app.js", &[], None)
        .await
        .text;
    assert!(script.contains("sessionStorage") && script.contains("Bearer "));
}

#[tokio::test]
async fn without_auth_the_router_calls_its_own_api_and_ignores_the_header() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let node = Stub {
        who: "node".into(),
        refuse: None,
        calls: calls.clone(),
    };
    let router = cronoq::http::router(Arc::new(node));
    let answer = call(&router, Method::GET, "/v1/snapshot", &[b"Basic x"], None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(*calls.lock().unwrap(), ["node snapshot"]);
}

/// Serves `router` on a loopback port; its `http://` URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn the_http_client_sends_its_token_as_bearer() {
    let app = app(None);
    let url = serve(app.router.clone()).await;
    let client = ClientOptions::new().token(TOKEN).http(&url).unwrap();
    assert!(!format!("{client:?}").contains(TOKEN));
    client.snapshot().await.unwrap();
    assert_eq!(client.submit(Task::new("x")).await.unwrap(), TaskId(7));
    client.cancel(TaskId(3)).await.unwrap();
    let caller = format!("token:{}", token_id(TOKEN));
    assert_eq!(
        app.take_calls(),
        [
            format!("{caller} snapshot"),
            format!("{caller} submit"),
            format!("{caller} cancel")
        ]
    );
    // Without a credential: anonymous, and the refusal keeps its code.
    let refusing = app_refusing_anonymous();
    let url = serve(refusing.router.clone()).await;
    let e = HttpClient::new(&url).unwrap().snapshot().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED, "{e}");
    assert_eq!(refusing.take_calls(), ["anonymous snapshot"]);
}

/// Like [`app`], refusing callers without a credential `UNAUTHENTICATED`.
fn app_refusing_anonymous() -> App {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let node = Stub {
        who: "node".into(),
        refuse: None,
        calls: calls.clone(),
    };
    let caller_calls = calls.clone();
    let auth = HttpAuth::with(move |credential: Option<Credential>| {
        Arc::new(Stub {
            who: credential.map_or("anonymous".into(), |c| format!("token:{}", c.id())),
            refuse: Some(ErrorCode::UNAUTHENTICATED),
            calls: caller_calls.clone(),
        }) as Arc<dyn Api>
    });
    App {
        router: router_with_auth(Arc::new(node), Some(auth)),
        calls,
    }
}

#[tokio::test]
async fn an_nkey_credential_is_refused_over_http_before_sending() {
    let seed = nkeys::KeyPair::new_user().seed().unwrap();
    let e = ClientOptions::new()
        .nkey_seed(&seed)
        .unwrap()
        .http("http://127.0.0.1:1")
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    assert!(
        e.to_string()
            .contains("nkey credential cannot be used over HTTP"),
        "{e}"
    );
    assert!(!e.to_string().contains(&seed));
    // A bad seed, an unset token variable: INVALID_ARGUMENT, nothing sent.
    let e = ClientOptions::new().nkey_seed("SUnot-a-seed").unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    let e = ClientOptions::new()
        .token_env("CRONOQ_TEST_SURELY_UNSET_TOKEN")
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    assert!(
        e.to_string().contains("CRONOQ_TEST_SURELY_UNSET_TOKEN"),
        "{e}"
    );
    let e = ClientOptions::new()
        .nkey_seed_file("/nonexistent/seed")
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
}
