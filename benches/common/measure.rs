//! What the distributed benches measure with: a process-wide nanosecond
//! clock, one time stamp per task id, sorted latencies with nearest-rank
//! percentiles, and the CPU and message counters of the bench process and
//! of every `nats-server` node.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::nats::NatsServer;

/// Nanoseconds since the bench started, plus one (0 means "not yet").
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// One time stamp per task id (ids are stream sequences 1..=n).
pub struct Stamps(pub Vec<AtomicU64>);

impl Stamps {
    pub fn new(n: usize) -> Arc<Stamps> {
        Arc::new(Stamps((0..=n).map(|_| AtomicU64::new(0)).collect()))
    }

    fn slot(&self, id: u64) -> &AtomicU64 {
        self.0
            .get(id as usize)
            .unwrap_or_else(|| panic!("task id {id} beyond the round's {} tasks", self.0.len() - 1))
    }

    pub fn set(&self, id: u64, t: u64) {
        self.slot(id).store(t, Ordering::Relaxed);
    }

    /// Keeps the first stamp only; ids beyond the round are ignored.
    pub fn set_first(&self, id: u64, t: u64) {
        if let Some(slot) = self.0.get(id as usize) {
            let _ = slot.compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    pub fn get(&self, id: u64) -> u64 {
        self.0
            .get(id as usize)
            .map_or(0, |s| s.load(Ordering::Relaxed))
    }

    /// `to - from` per id where both are set, sorted.
    pub fn deltas(from: &Stamps, to: &Stamps) -> Latencies {
        let mut v: Vec<u64> = from
            .0
            .iter()
            .zip(&to.0)
            .skip(1)
            .filter_map(|(a, b)| {
                let (a, b) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
                (a > 0 && b > 0).then(|| b.saturating_sub(a))
            })
            .collect();
        v.sort_unstable();
        Latencies(v)
    }
}

/// Sorted latencies in ns.
pub struct Latencies(pub Vec<u64>);

impl Latencies {
    /// Nearest-rank percentile.
    pub fn pct(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        Duration::from_nanos(self.0[rank.clamp(1, self.0.len()) - 1])
    }

    pub fn describe(&self) -> String {
        format!(
            "p50 {} p99 {} max {}",
            ms(self.pct(50.0)),
            ms(self.pct(99.0)),
            ms(self.pct(100.0))
        )
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// utime + stime of a process (0 where `/proc` is missing).
pub fn proc_cpu(path: &str) -> Duration {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Duration::ZERO;
    };
    // The fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// Counters of the NATS servers (summed over the nodes) and CPU of the
/// bench process and of the servers.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    pub in_msgs: u64,
    pub out_msgs: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub js_api: u64,
    pub nats_cpu: Duration,
    pub self_cpu: Duration,
}

impl Usage {
    pub fn since(self, before: Usage) -> Usage {
        Usage {
            in_msgs: self.in_msgs - before.in_msgs,
            out_msgs: self.out_msgs - before.out_msgs,
            in_bytes: self.in_bytes - before.in_bytes,
            out_bytes: self.out_bytes - before.out_bytes,
            js_api: self.js_api - before.js_api,
            nats_cpu: self.nats_cpu.saturating_sub(before.nats_cpu),
            self_cpu: self.self_cpu.saturating_sub(before.self_cpu),
        }
    }

    pub fn per_task(&self, n: usize) -> String {
        let n = n as f64;
        format!(
            "msgs/task in {:.1} out {:.1} ({:.0} / {:.0} bytes), js api/task {:.2}, cpu/task bench {:.0} µs nats-server {:.0} µs",
            self.in_msgs as f64 / n,
            self.out_msgs as f64 / n,
            self.in_bytes as f64 / n,
            self.out_bytes as f64 / n,
            self.js_api as f64 / n,
            self.self_cpu.as_secs_f64() * 1e6 / n,
            self.nats_cpu.as_secs_f64() * 1e6 / n,
        )
    }
}

/// The NATS a bench runs against: one node, or the nodes of one cluster
/// (streams then get `replicas` replicas). Clients connect to node 1
/// unless they ask for another ([`Nats::url_for`]).
pub struct Nats {
    pub nodes: Vec<NatsServer>,
    pub replicas: usize,
}

impl Nats {
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// Node `i` modulo the node count: to spread workers over a cluster.
    pub fn url_for(&self, i: usize) -> String {
        self.nodes[i % self.nodes.len()].url()
    }

    /// Waits (up to 5 minutes) until every node uses under 10% of a core
    /// over half a second: a backlog of JetStream API requests left by a
    /// round that did not settle must not run into the next one.
    pub async fn wait_quiet(&self) {
        let stats: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("/proc/{}/stat", n.child.id()))
            .collect();
        let cpu = || stats.iter().map(|s| proc_cpu(s)).collect::<Vec<_>>();
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut before = cpu();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = cpu();
            if now
                .iter()
                .zip(&before)
                .all(|(a, b)| a.saturating_sub(*b) < Duration::from_millis(50))
            {
                return;
            }
            before = now;
        }
        eprintln!("  (nats-server still busy after 300 s; going on)");
    }

    /// Messages, API calls and CPU summed over the nodes (a cluster's
    /// counts include what the nodes route to each other), and this
    /// process's CPU.
    pub fn usage(&self) -> Usage {
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let mut u = Usage {
            self_cpu: proc_cpu("/proc/self/stat"),
            ..Usage::default()
        };
        for node in &self.nodes {
            let varz = node.monitoring("/varz");
            let jsz = node.monitoring("/jsz");
            u.in_msgs += n(&varz["in_msgs"]);
            u.out_msgs += n(&varz["out_msgs"]);
            u.in_bytes += n(&varz["in_bytes"]);
            u.out_bytes += n(&varz["out_bytes"]);
            u.js_api += n(&jsz["api"]["total"]);
            u.nats_cpu += proc_cpu(&format!("/proc/{}/stat", node.child.id()));
        }
        u
    }

    /// Messages in stream `name`, the most any node's replica holds
    /// (`None`: no node has such a stream).
    pub fn stream_messages(&self, name: &str) -> Option<u64> {
        self.nodes
            .iter()
            .filter_map(|node| {
                let jsz = node.monitoring("/jsz?accounts=true&streams=true");
                jsz["account_details"]
                    .as_array()?
                    .iter()
                    .filter_map(|a| a["stream_detail"].as_array())
                    .flatten()
                    .find(|s| s["name"] == name)
                    .and_then(|s| s["state"]["messages"].as_u64())
            })
            .max()
    }
}
