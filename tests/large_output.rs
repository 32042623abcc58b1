//! A task output too large for one NATS message (issue 34, finding 7),
//! against real processes: a `nats-server`, a leader and a follower
//! `cronoq server`, and a `cronoq worker` whose command prints 1,000,000
//! bytes (under the worker's output limit).
//!
//! Reproduction on 53e0b1f: `GET /v1/tasks/{id}` on the follower (and
//! `cronoq get`, and `Client::get`) answered `UNAVAILABLE` for ever: the
//! leader's reply carrying the output (as text and as base64) did not
//! fit one NATS message, its publish failed, the asker timed out. Now the
//! reply leaves the output out and says its size (`output_size`), the
//! Rust client fetches it in pages (`P.api.task_output`), and the HTTP
//! API answers it whole, and raw at `GET /v1/tasks/{id}/output`.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use cronoq::client::Client;
use cronoq::core::TaskState;
use cronoq::task::TaskStatus;
use cronoq::wire::{self, Subjects};
use cronoq::Task;
use procs::{command, cronoq_binary, http_get, CronoqServer, NatsServer, Proc};

const SIZE: usize = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_output_is_answered_whole_over_http_and_in_pages_over_nats() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _leader = CronoqServer::start(&nats, dir.path()).await;
    let follower = CronoqServer::start_follower(&nats, dir.path()).await;
    let mut cmd = command(cronoq_binary());
    cmd.arg("worker")
        .args(["--nats", &nats.url(), "--id", "big", "--pool", "default"])
        .args([
            "--",
            "sh",
            "-c",
            &format!("head -c {SIZE} /dev/zero | tr '\\0' x"),
        ]);
    let _worker = Proc::spawn("cronoq worker big", cmd, &dir.path().join("worker.log"));
    let client = Client::connect(&nats.url()).await.unwrap();
    let id = client.submit(Task::new("big")).await.unwrap();
    let done = client.wait(id).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{:?}", done.error);

    // The client: whole, fetched in pages.
    let got = client.get(id).await.unwrap();
    assert_eq!(got.output_bytes().unwrap().len(), SIZE);
    assert!(got.output_size.is_none());
    assert_eq!(client.output(id).await.unwrap(), vec![b'x'; SIZE]);

    // The reply itself fits: the output left out, its size given.
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let reply = raw
        .request(
            Subjects::default().api("task"),
            wire::encode(&wire::GetTask {
                v: wire::PROTOCOL_VERSION,
                task_id: id,
            })
            .into(),
        )
        .await
        .unwrap();
    let bare: TaskStatus = wire::decode_reply(&reply.payload).unwrap();
    assert_eq!(bare.output_size, Some(SIZE as u64));
    assert!(bare.output.is_none() && bare.output_base64.is_none());

    // The follower's HTTP API: whole as JSON, and raw.
    let (status, body) = http_get(&format!("{}/v1/tasks/{}", follower.http_url(), id.0)).await;
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["output"].as_str().unwrap().len(), SIZE);
    assert!(json.get("output_size").is_none());
    let (status, body) =
        http_get(&format!("{}/v1/tasks/{}/output", follower.http_url(), id.0)).await;
    assert_eq!(status, 200);
    assert_eq!(body.len(), SIZE);
    // A task with no output yet: NOT_FOUND.
    let (status, body) = http_get(&format!("{}/v1/tasks/999/output", follower.http_url())).await;
    assert_eq!(status, 404, "{body}");
}
