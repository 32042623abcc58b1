//! The two dispatchers the distributed bench measures cronoq against, on
//! the same NATS: the ceiling (request/reply to a worker, ack on the
//! reply, nothing stored) and the durable dispatcher (each outcome stored
//! in a file-backed stream before the submission's ack). Both share one
//! rig ([`Dispatch`]): the submit stream and its pull consumer, 4 worker
//! connections, the stamps and the run.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use cronoq::wire::{self, Subjects};
use cronoq::Task;
use futures_util::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::measure::{now_ns, Nats, Stamps};
use super::rounds::{
    connect, delete_stream, submit_all, Finish, Round, Window, POOL, SLOTS_PER_WORKER, WORKERS,
};

/// Submissions the durable dispatcher may hold unacknowledged (dispatched
/// or with their outcome being stored): cronoq's committer has up to 4,096
/// journal writes in flight.
pub const DURABLE_IN_FLIGHT_WRITES: usize = 4_096;

/// Messages the durable dispatcher's pull consumer asks for at once.
pub const DURABLE_PULL_BATCH: usize = 1_000;

/// A dispatcher's rig: the submit stream (work-queue retention, so an ack
/// deletes the message as cronoq deletes a finished submission) with a
/// pull consumer (explicit acks), 4 worker connections on
/// `<prefix>.worker.<n>` that stamp each receipt, and the round's stamps.
pub struct Dispatch {
    label: &'static str,
    prefix: String,
    stream_name: String,
    dispatcher: async_nats::Client,
    js: jetstream::Context,
    consumer: consumer::Consumer<consumer::pull::Config>,
    submitted: Arc<Stamps>,
    started: Arc<Stamps>,
    tasks: Vec<JoinHandle<()>>,
    finish: Arc<Finish>,
    /// More streams to delete after the round.
    streams: Vec<String>,
}

/// How a dispatcher's worker answers a dispatch.
#[derive(Clone)]
pub enum Answer {
    /// A reply to the request (the ceiling).
    Reply,
    /// Its payload published to this subject (the durable dispatcher).
    Done(async_nats::Subject),
}

impl Dispatch {
    async fn rig(
        nats: &Nats,
        label: &'static str,
        prefix: String,
        n: usize,
        max_ack_pending: Option<usize>,
        answer: Answer,
    ) -> Dispatch {
        nats.wait_quiet().await;
        let stream_name = format!("{}_SUBMIT", prefix.to_uppercase());
        let dispatcher = connect(&nats.url(), &format!("bench-{label}")).await;
        let js = jetstream::new(dispatcher.clone());
        let submit_stream = js
            .create_stream(stream::Config {
                name: stream_name.clone(),
                subjects: vec![format!("{prefix}.submit")],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                num_replicas: nats.replicas,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{label} submit stream: {e}"));
        let consumer = submit_stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("dispatcher".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                max_ack_pending: max_ack_pending.map_or(0, |m| m as i64),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{label} consumer: {e}"));

        let started = Stamps::new(n);
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let worker = connect(&nats.url_for(w + 1), &format!("bench-{label}-worker-{w}")).await;
            let mut requests = worker
                .subscribe(format!("{prefix}.worker.{w}"))
                .await
                .expect("worker subscription");
            worker.flush().await.expect("flush");
            let (started, answer) = (started.clone(), answer.clone());
            tasks.push(tokio::spawn(async move {
                while let Some(m) = requests.next().await {
                    let seq = u64::from_le_bytes(m.payload[..8].try_into().expect("8 bytes"));
                    started.set_first(seq, now_ns());
                    let sent = match (&answer, m.reply) {
                        (Answer::Done(done), _) => worker.publish(done.clone(), m.payload).await,
                        (Answer::Reply, Some(reply)) => worker.publish(reply, Bytes::new()).await,
                        (Answer::Reply, None) => Ok(()),
                    };
                    sent.expect("worker answer");
                }
            }));
        }
        Dispatch {
            label,
            prefix,
            stream_name,
            dispatcher,
            js,
            consumer,
            submitted: Stamps::new(n),
            started,
            tasks,
            finish: Finish::new(n),
            streams: Vec::new(),
        }
    }

    /// Submits the round's tasks, waits for the last, measures, and
    /// removes the rig.
    async fn run(self, nats: &Nats, tag: &str, pace: Option<f64>) -> Round {
        let submitter = connect(&nats.url(), "bench-submitter").await;
        let n = self.finish.n;
        let window = Window::open(nats);
        submit_to_stream(&submitter, &self.prefix, n, pace, &self.submitted).await;
        let end = self.finish.wait(self.label).await;
        let round = window
            .close(
                nats,
                &self.stream_name,
                end,
                &format!("{}-{tag}", self.label),
                &self.submitted,
                &self.started,
            )
            .await;
        for t in self.tasks {
            t.abort();
        }
        delete_stream(&self.js, &self.stream_name).await;
        for s in &self.streams {
            delete_stream(&self.js, s).await;
        }
        round
    }
}

/// Publishes `n` copies of cronoq's own submission (its headers and body,
/// so the stream stores the same bytes as cronoq's) to `<prefix>.submit`
/// through JetStream, stamping each submit call's start by the sequence
/// its acknowledgement names.
pub async fn submit_to_stream(
    submitter: &async_nats::Client,
    prefix: &str,
    n: usize,
    pace: Option<f64>,
    submitted: &Arc<Stamps>,
) {
    let submit_js = jetstream::new(submitter.clone());
    let (_, headers, body) = wire::submission(
        &Subjects::new(prefix).expect("prefix"),
        &Task::new(Bytes::new()).pool(POOL),
    )
    .expect("submission");
    let (subject, submitted) = (format!("{prefix}.submit"), submitted.clone());
    submit_all(n, pace, move |_| {
        let (js, subject, headers, body, submitted) = (
            submit_js.clone(),
            subject.clone(),
            headers.clone(),
            body.clone(),
            submitted.clone(),
        );
        async move {
            let t0 = now_ns();
            let ack = js
                .publish_with_headers(subject, headers, body)
                .await
                .expect("publish")
                .await
                .expect("publish acknowledged");
            submitted.set(ack.sequence, t0);
        }
    })
    .await;
}

/// The ceiling: each submission is sent as a request to its worker and
/// acked on the reply; 64 dispatches in flight (cronoq's 4 × 16 slots).
pub async fn ceiling_round(nats: &Nats, tag: &str, n: usize, pace: Option<f64>) -> Round {
    let mut rig = Dispatch::rig(nats, "ceiling", format!("dp{tag}"), n, None, Answer::Reply).await;
    let messages = rig.consumer.messages().await.expect("dispatch messages");
    let (dispatcher, finish) = (rig.dispatcher.clone(), rig.finish.clone());
    let subject_of = {
        let prefix = rig.prefix.clone();
        move |seq: u64| format!("{prefix}.worker.{}", seq % WORKERS as u64)
    };
    rig.tasks.push(tokio::spawn(async move {
        messages
            .for_each_concurrent(WORKERS * SLOTS_PER_WORKER as usize, |m| {
                let (dispatcher, finish, subject_of) = (&dispatcher, &finish, &subject_of);
                async move {
                    let m = m.expect("dispatch message");
                    let seq = m.info().expect("message info").stream_sequence;
                    dispatcher
                        .request(subject_of(seq), Bytes::copy_from_slice(&seq.to_le_bytes()))
                        .await
                        .expect("worker replied");
                    m.ack().await.expect("ack");
                    finish.one();
                }
            })
            .await;
    }));
    rig.run(nats, tag, pace).await
}

// ---- the durable dispatcher: results stored before the submission's ack -----

/// The outcome the durable dispatcher stores per task: the task's sequence,
/// a state byte and an empty output (cronoq's result record is larger: it
/// carries the attempt, its worker and times).
pub fn outcome_record(seq: u64) -> Bytes {
    let mut b = Vec::with_capacity(9);
    b.extend_from_slice(&seq.to_le_bytes());
    b.push(b'S');
    Bytes::from(b)
}

/// The durable dispatcher, as a simple design of this shape does it best:
/// a submission goes (core NATS) to its worker while one of 64 slots is
/// free, carrying its own ack subject, so the dispatcher keeps no table of
/// dispatched messages; on the worker's done (which echoes the dispatch)
/// the slot is freed and the outcome published to a file-backed results
/// stream without waiting (writes pipelined, up to 4,096 submissions
/// unacked); once that write is acknowledged, the submission is acked.
/// Pulling, dispatching and dones, and storing with the acks that follow
/// each use their own connection, so neither client nor nats-server
/// serializes the three streams of messages on one socket.
pub async fn durable_round(nats: &Nats, tag: &str, n: usize, pace: Option<f64>) -> Round {
    let prefix = format!("dd{tag}");
    let done_subject = format!("{prefix}.done");
    let mut rig = Dispatch::rig(
        nats,
        "durable",
        prefix.clone(),
        n,
        Some(DURABLE_IN_FLIGHT_WRITES),
        Answer::Done(done_subject.as_str().into()),
    )
    .await;
    let results_name = format!("{}_RESULTS", prefix.to_uppercase());
    rig.js
        .create_stream(stream::Config {
            name: results_name.clone(),
            subjects: vec![format!("{prefix}.result.>")],
            storage: stream::StorageType::File,
            num_replicas: nats.replicas,
            ..Default::default()
        })
        .await
        .expect("durable results stream");
    rig.streams.push(results_name);

    let leases = connect(&nats.url(), "bench-durable-leases").await;
    let store = connect(&nats.url(), "bench-durable-store").await;
    let mut dones = leases
        .subscribe(done_subject)
        .await
        .expect("done subscription");
    leases.flush().await.expect("flush");
    let slots = Arc::new(Semaphore::new(WORKERS * SLOTS_PER_WORKER as usize));
    {
        // Dispatch: take a submission once one of the 64 slots is free and
        // send it to a worker (core NATS): its sequence, then its ack
        // subject.
        let (leases, slots) = (leases.clone(), slots.clone());
        let mut messages = rig
            .consumer
            .stream()
            .max_messages_per_batch(DURABLE_PULL_BATCH)
            .messages()
            .await
            .expect("durable messages");
        let workers: Vec<async_nats::Subject> = (0..WORKERS)
            .map(|w| format!("{prefix}.worker.{w}").into())
            .collect();
        rig.tasks.push(tokio::spawn(async move {
            loop {
                slots.acquire().await.expect("slots").forget();
                let Some(m) = messages.next().await else {
                    return;
                };
                let m = m.expect("durable message");
                let seq = m.info().expect("message info").stream_sequence;
                let ack = m.reply.as_ref().expect("an ack subject");
                let mut lease = Vec::with_capacity(8 + ack.len());
                lease.extend_from_slice(&seq.to_le_bytes());
                lease.extend_from_slice(ack.as_bytes());
                leases
                    .publish(workers[seq as usize % WORKERS].clone(), lease.into())
                    .await
                    .expect("lease");
            }
        }));
    }
    {
        // Outcomes: on a worker's done, free its slot and store the outcome;
        // once the write is acknowledged, ack the submission. Many writes
        // in flight, polled together in this task.
        let js = jetstream::new(store.clone());
        let finish = rig.finish.clone();
        rig.tasks.push(tokio::spawn(async move {
            let mut storing = futures_util::stream::FuturesUnordered::new();
            loop {
                tokio::select! {
                    Some(d) = dones.next() => {
                        slots.add_permits(1);
                        let seq = u64::from_le_bytes(d.payload[..8].try_into().expect("8 bytes"));
                        let ack_subject = std::str::from_utf8(&d.payload[8..])
                            .expect("an ack subject")
                            .to_owned();
                        let stored = js
                            .publish(format!("{prefix}.result.{seq}"), outcome_record(seq))
                            .await
                            .expect("store outcome");
                        let store = &store;
                        storing.push(async move {
                            stored.await.expect("outcome stored");
                            store.publish(ack_subject, Bytes::new()).await.expect("ack");
                        });
                    }
                    Some(()) = storing.next(), if !storing.is_empty() => finish.one(),
                    else => break,
                }
            }
        }));
    }
    rig.run(nats, tag, pace).await
}
