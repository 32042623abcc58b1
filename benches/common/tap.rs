//! A tap on a cronoq server's NATS traffic, for the distributed bench's
//! latency breakdown (issue 22 item 3): one extra connection subscribes to
//! what passes between the client, the leader, JetStream and the workers,
//! stamps each message on receipt and names the tasks in it, so each
//! task's submit→start splits into stages without touching the server:
//!
//! submitted → **delivered** (the submit consumer's delivery to the leader,
//! `_INBOX.…` with a `$JS.ACK.<submit stream>.…` reply) → **start sent**
//! (the first journal write naming the task: a start-record slot
//! `$KV.<results>.s.<n>`, or the task's own key in atomic batches) →
//! **start stored** (its JetStream acknowledgement on the write's reply
//! inbox; for a batch, the commit's) → **lease** (`P.worker.<id>.lease` or
//! `.leases`) → handler called; and after it: **outcome**
//! (`P.w.<id>.outcome(s)`) → **end sent** (the task's record after its
//! lease, or the result batch naming it) → **end stored** → terminal
//! event.
//!
//! Every stamp is the tap's receipt, so each carries the tap's own delivery
//! delay; the stages compare with each other, and the tap costs nats-server
//! a copy of each message (compare the run's p99 with an untapped one).

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cronoq::wire::{self, AttemptReport, AttemptReports, Lease, Leases, StartRecords, Subjects};
use futures_util::StreamExt;
use tokio::task::JoinHandle;

use super::measure::{ms, now_ns, Latencies, Stamps};

/// Which of a task's journal writes.
#[derive(Clone, Copy)]
enum Write {
    Start,
    End,
}

#[derive(Default)]
struct Pending {
    /// Reply inbox of a journal write → the tasks it carries.
    writes: HashMap<String, Vec<(u64, Write)>>,
    /// Staged messages of an atomic batch, until its commit names a reply.
    batches: HashMap<String, Vec<(u64, Write)>>,
    /// Every other `_INBOX` message's subject → when it was seen.
    replies: HashMap<String, u64>,
    /// Stream purge requests: when, and their reply inbox.
    purges: Vec<(u64, String)>,
    /// `_INBOX` messages with a `$JS.ACK.` reply (consumer deliveries),
    /// and one of their reply subjects.
    acks: (u64, String),
}

/// The stamps the tap takes, per task id.
struct Seen {
    delivered: Arc<Stamps>,
    start_sent: Arc<Stamps>,
    start_stored: Arc<Stamps>,
    lease: Arc<Stamps>,
    outcome: Arc<Stamps>,
    end_sent: Arc<Stamps>,
    end_stored: Arc<Stamps>,
    pending: Mutex<Pending>,
}

/// The tap: started before the round's first submit, read after its last
/// task ended.
pub struct Tap {
    seen: Arc<Seen>,
    task: JoinHandle<()>,
}

impl Tap {
    pub async fn start(url: &str, subjects: &Subjects, n: usize) -> Tap {
        let client = async_nats::ConnectOptions::new()
            .name("bench-tap")
            .subscription_capacity(1 << 22)
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("tap: connecting to {url}: {e}"));
        let p = subjects.prefix();
        let results = subjects.results_bucket();
        let mut subs = Vec::new();
        for subject in [
            "_INBOX.>".to_string(),
            format!("$KV.{results}.>"),
            format!("{p}.worker.*.lease"),
            format!("{p}.worker.*.leases"),
            format!("{p}.w.*.outcome"),
            format!("{p}.w.*.outcomes"),
            "$JS.API.STREAM.PURGE.*".to_string(),
        ] {
            subs.push(client.subscribe(subject).await.expect("tap subscription"));
        }
        client.flush().await.expect("tap flush");
        let seen = Arc::new(Seen {
            delivered: Stamps::new(n),
            start_sent: Stamps::new(n),
            start_stored: Stamps::new(n),
            lease: Stamps::new(n),
            outcome: Stamps::new(n),
            end_sent: Stamps::new(n),
            end_stored: Stamps::new(n),
            pending: Mutex::default(),
        });
        let ack_marker = format!(".{}.", subjects.submit_stream());
        let kv_prefix = format!("$KV.{results}.");
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let _client = client;
                let mut all = futures_util::stream::select_all(subs);
                while let Some(m) = all.next().await {
                    let t = now_ns();
                    seen.take(&m, t, &ack_marker, &kv_prefix);
                }
            })
        };
        Tap { seen, task }
    }

    /// Prints the stages of submit→start (p50, p99, and their medians
    /// among the slowest 1 % of tasks) and of start→end.
    pub async fn report(
        self,
        submitted: &Stamps,
        accepted: &Stamps,
        handled: &Stamps,
        ended: &Stamps,
    ) {
        // Let the last acknowledgements reach the tap.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        self.task.abort();
        let s = &self.seen;
        {
            let pending = s.pending.lock().expect("tap");
            for (reply, tasks) in &pending.writes {
                let Some(&t) = pending.replies.get(reply) else {
                    continue;
                };
                for &(id, write) in tasks {
                    match write {
                        Write::Start => s.start_stored.set_first(id, t),
                        Write::End => s.end_stored.set_first(id, t),
                    }
                }
            }
        }
        {
            let pending = s.pending.lock().expect("tap");
            println!(
                "  tap: {} consumer deliveries seen (e.g. reply {:?})",
                pending.acks.0, pending.acks.1
            );
            let first = (1..submitted.0.len() as u64)
                .map(|id| submitted.get(id))
                .filter(|&t| t > 0)
                .min()
                .unwrap_or(0);
            let purges: Vec<String> = pending
                .purges
                .iter()
                .map(|(t, reply)| {
                    let took = pending
                        .replies
                        .get(reply)
                        .map_or("no reply seen".to_string(), |r| {
                            ms(std::time::Duration::from_nanos(r.saturating_sub(*t)))
                        });
                    format!("{:.2} s ({took})", t.saturating_sub(first) as f64 / 1e9)
                })
                .collect();
            println!(
                "  tap: stream purges at (since the first submit) {}",
                purges.join(", ")
            );
            // When the slowest 1 % were submitted.
            let total = Stamps::deltas(submitted, handled);
            let p99 = total.pct(99.0).as_nanos() as u64;
            let slow: Vec<u64> = (1..submitted.0.len() as u64)
                .filter(|&id| {
                    let (a, h) = (submitted.get(id), handled.get(id));
                    a > 0 && h > 0 && h - a >= p99
                })
                .map(|id| submitted.get(id).saturating_sub(first))
                .collect();
            if let (Some(lo), Some(hi)) = (slow.iter().min(), slow.iter().max()) {
                println!(
                    "  tap: the slowest 1 % were submitted between {:.2} s and {:.2} s",
                    *lo as f64 / 1e9,
                    *hi as f64 / 1e9
                );
            }
        }
        let chain: [(&str, &Stamps); 7] = [
            ("submitted", submitted),
            ("delivered", &s.delivered),
            ("start sent", &s.start_sent),
            ("start stored", &s.start_stored),
            ("lease", &s.lease),
            ("handler", handled),
            ("", handled),
        ];
        let total = Stamps::deltas(submitted, handled);
        let p99 = total.pct(99.0).as_nanos() as u64;
        println!("  tap: where submit→handler goes (each stage: p50, p99; median among the slowest 1 %, ≥ {})", ms(total.pct(99.0)));
        println!(
            "    {:<28} {}",
            "submitted → accepted (PubAck)",
            Stamps::deltas(submitted, accepted).describe()
        );
        for w in chain[..6].windows(2) {
            let ((a, from), (b, to)) = (w[0], w[1]);
            let all = Stamps::deltas(from, to);
            let slow = slow_median(submitted, handled, p99, from, to);
            println!(
                "    {:<28} p50 {} p99 {}   slowest 1 %: {} (n {})",
                format!("{a} → {b}"),
                ms(all.pct(50.0)),
                ms(all.pct(99.0)),
                ms(slow),
                all.0.len()
            );
        }
        let after: [(&str, &Stamps); 5] = [
            ("handler", handled),
            ("outcome", &s.outcome),
            ("end sent", &s.end_sent),
            ("end stored", &s.end_stored),
            ("terminal event", ended),
        ];
        for w in after.windows(2) {
            let ((a, from), (b, to)) = (w[0], w[1]);
            let all = Stamps::deltas(from, to);
            println!(
                "    {:<28} p50 {} p99 {} (n {})",
                format!("{a} → {b}"),
                ms(all.pct(50.0)),
                ms(all.pct(99.0)),
                all.0.len()
            );
        }
    }
}

/// The median of `to - from` among tasks whose submit→handler is at least
/// `p99` ns.
fn slow_median(
    submitted: &Stamps,
    handled: &Stamps,
    p99: u64,
    from: &Stamps,
    to: &Stamps,
) -> std::time::Duration {
    let mut v: Vec<u64> = (1..submitted.0.len() as u64)
        .filter(|&id| {
            let (s, h) = (submitted.get(id), handled.get(id));
            s > 0 && h > 0 && h - s >= p99
        })
        .filter_map(|id| {
            let (a, b) = (from.get(id), to.get(id));
            (a > 0 && b > 0).then(|| b.saturating_sub(a))
        })
        .collect();
    v.sort_unstable();
    Latencies(v).pct(50.0)
}

impl Seen {
    fn take(&self, m: &async_nats::Message, t: u64, ack_marker: &str, kv_prefix: &str) {
        let subject = m.subject.as_str();
        if subject.starts_with("$JS.API.STREAM.PURGE.") {
            if let Some(reply) = m.reply.as_deref() {
                let mut pending = self.pending.lock().expect("tap");
                pending.purges.push((t, reply.to_string()));
            }
            return;
        }
        if subject.starts_with("_INBOX.") {
            if let Some(reply) = m.reply.as_deref().filter(|r| r.starts_with("$JS.ACK.")) {
                let mut pending = self.pending.lock().expect("tap");
                pending.acks.0 += 1;
                if pending.acks.1.is_empty() {
                    pending.acks.1 = reply.to_string();
                }
            }
            match m.reply.as_deref() {
                Some(reply) if reply.starts_with("$JS.ACK.") && reply.contains(ack_marker) => {
                    if let Some(seq) = ack_stream_seq(reply, ack_marker) {
                        self.delivered.set_first(seq, t);
                    }
                }
                _ => {
                    self.pending
                        .lock()
                        .expect("tap")
                        .replies
                        .entry(subject.to_string())
                        .or_insert(t);
                }
            }
            return;
        }
        if let Some(key) = subject.strip_prefix(kv_prefix) {
            let tasks: Vec<(u64, Write)> = if let Some(_slot) = wire::parse_start_key(key) {
                wire::decode::<StartRecords>(&m.payload)
                    .map(|r| r.starts.iter().map(|s| (s.id.0, Write::Start)).collect())
                    .unwrap_or_default()
            } else if wire::is_result_key(key) {
                // A turn's results: each task's end.
                wire::decode::<wire::ResultRecords>(&m.payload)
                    .map(|r| r.results.iter().map(|t| (t.id.0, Write::End)).collect())
                    .unwrap_or_default()
            } else if let Ok(id) = key.parse::<u64>() {
                // The task's own record: its end once its lease was seen.
                let write = if self.lease.get(id) > 0 {
                    Write::End
                } else {
                    Write::Start
                };
                vec![(id, write)]
            } else {
                return;
            };
            for &(id, write) in &tasks {
                match write {
                    Write::Start => self.start_sent.set_first(id, t),
                    Write::End => self.end_sent.set_first(id, t),
                }
            }
            let batch = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Batch-Id"))
                .map(|v| v.as_str().to_string());
            let mut pending = self.pending.lock().expect("tap");
            match (batch, m.reply.as_deref()) {
                (Some(batch), reply) => {
                    let staged = pending.batches.entry(batch.clone()).or_default();
                    staged.extend(tasks);
                    if let Some(reply) = reply {
                        let staged = pending.batches.remove(&batch).unwrap_or_default();
                        pending
                            .writes
                            .entry(reply.to_string())
                            .or_default()
                            .extend(staged);
                    }
                }
                (None, Some(reply)) => {
                    pending
                        .writes
                        .entry(reply.to_string())
                        .or_default()
                        .extend(tasks);
                }
                (None, None) => {}
            }
            return;
        }
        if subject.ends_with(".leases") {
            if let Ok(batch) = wire::decode::<Leases>(&m.payload) {
                for l in batch.leases {
                    self.lease.set_first(l.task_id.0, t);
                }
            }
        } else if subject.ends_with(".lease") {
            if let Ok(l) = wire::decode::<Lease>(&m.payload) {
                self.lease.set_first(l.task_id.0, t);
            }
        } else if subject.ends_with(".outcomes") {
            if let Ok(r) = wire::decode::<AttemptReports>(&m.payload) {
                for r in r.reports {
                    self.outcome.set_first(r.task_id.0, t);
                }
            }
        } else if subject.ends_with(".outcome") {
            if let Ok(r) = wire::decode::<AttemptReport>(&m.payload) {
                self.outcome.set_first(r.task_id.0, t);
            }
        }
    }
}

/// The stream sequence in a `$JS.ACK.…` reply subject: the third token
/// after the stream's name (`<stream>.<consumer>.<delivered>.<sseq>…`).
fn ack_stream_seq(reply: &str, marker: &str) -> Option<u64> {
    let (_, rest) = reply.split_once(marker)?;
    rest.split('.').nth(2)?.parse().ok()
}
