//! A submission over HTTP with a credential answers what the leader
//! decided (issue 20, finding 3), against a real `cronoq server` with
//! `[auth] required = true` over a real nats-server. Before, the HTTP API
//! answered 200 with an id when the leader refused the submission for a
//! reason other than the credential: a payload one byte over the server's
//! limit, a pool beyond `max_pools`.
//!
//! Now the payload is checked against the limit in force before anything
//! is published (400 `INVALID_ARGUMENT`, nothing in the stream), and a
//! refusal only the leader can make is the answer with its code (429
//! `RESOURCE_EXHAUSTED`). Without credentials too: the HTTP API answers a
//! submission once the leader has decided.

mod procs;

use procs::{eventually, NatsServer, Proc};
use serde_json::{json, Value};

const SUBMITTER: (&str, &str) = ("REFUSALTEST_SUBMITTER", "submitter-token-0123456789");
const ADMIN: (&str, &str) = ("REFUSALTEST_ADMIN", "admin-token-0123456789abcd");
const MAX_PAYLOAD: usize = 1000;
const MAX_POOLS: usize = 2;

fn config() -> String {
    format!(
        r#"{LIMITS}
[auth]
required = true

[[auth.tokens]]
token_env = "{}"
role = "submitter"

[[auth.tokens]]
token_env = "{}"
role = "admin"
"#,
        SUBMITTER.0, ADMIN.0
    )
}

const LIMITS: &str = r#"
[server]
worker_timeout = "2s"
lease_ttl = "3s"
election_timeout = "3s"
max_payload_bytes = 1000
max_pools = 2
"#;

/// An HTTP request with a Bearer token: status and JSON body.
async fn call(http: &str, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = http.strip_prefix("http://").unwrap();
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(procs::DEADLINE, stream.read_to_end(&mut reply))
        .await
        .expect("an answer")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let json = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, json)
}

/// The ids of the tasks the server lists (as admin).
async fn task_ids(http: &str) -> Vec<u64> {
    let (status, body) = call(http, "GET", "/v1/tasks?limit=500", ADMIN.1, "").await;
    assert_eq!(status, 200, "{body}");
    body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_submission_the_leader_refuses_is_not_answered_200() {
    refusals_are_answered(&config()).await;
}

#[tokio::test]
async fn without_credentials_too() {
    // The Bearer token is ignored with auth off.
    refusals_are_answered(LIMITS).await;
}

async fn refusals_are_answered(config: &str) {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let config_file = dir.path().join("cronoq.toml");
    std::fs::write(&config_file, config).unwrap();
    let http_addr = format!("127.0.0.1:{}", procs::free_port());
    let mut cmd = procs::command(procs::cronoq_binary());
    cmd.arg("server")
        .arg("--config")
        .arg(&config_file)
        .args(["--nats", &nats.url(), "--http", &http_addr, "--id", "s1"])
        .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
    for (var, token) in [SUBMITTER, ADMIN] {
        cmd.env(var, token);
    }
    let _server = Proc::spawn("cronoq server", cmd, &dir.path().join("server.log"));
    let http = format!("http://{http_addr}");
    eventually("the server to lead", || {
        let http = http.clone();
        let addr = http_addr.parse().unwrap();
        async move {
            // Nothing listens before the server has started.
            procs::readyz(addr).await.ok_or("not listening yet")?;
            let (status, body) = call(&http, "GET", "/v1/snapshot", ADMIN.1, "").await;
            match body["leader"]["id"].as_str() {
                Some("s1") if status == 200 => Ok(()),
                _ => Err(format!("{status} {body}")),
            }
        }
    })
    .await;

    // A payload at the limit is accepted; one byte over is refused before
    // anything is published.
    let at_limit = json!({"pool": "p1", "payload": "x".repeat(MAX_PAYLOAD)}).to_string();
    let (status, body) = call(&http, "POST", "/v1/tasks", SUBMITTER.1, &at_limit).await;
    assert_eq!(status, 200, "{body}");
    let before = task_ids(&http).await;
    let over = json!({"pool": "p1", "payload": "x".repeat(MAX_PAYLOAD + 1)}).to_string();
    let (status, body) = call(&http, "POST", "/v1/tasks", SUBMITTER.1, &over).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");
    assert!(body.get("id").is_none(), "{body}");
    assert_eq!(
        task_ids(&http).await,
        before,
        "the refused payload was published"
    );

    // Pools up to max_pools are created; the next one is the leader's
    // refusal, RESOURCE_EXHAUSTED with its status.
    let mut refused = None;
    for n in 2..=MAX_POOLS + 2 {
        let task = json!({"pool": format!("p{n}"), "payload": "x"}).to_string();
        let (status, body) = call(&http, "POST", "/v1/tasks", SUBMITTER.1, &task).await;
        if status != 200 {
            refused = Some((n, status, body));
            break;
        }
    }
    let (n, status, body) = refused.expect("a pool beyond max_pools is refused");
    assert!(n <= MAX_POOLS + 1, "pool p{n} was the first refused");
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "RESOURCE_EXHAUSTED", "{body}");
    assert!(body["message"].as_str().unwrap().contains("pool"), "{body}");
}
