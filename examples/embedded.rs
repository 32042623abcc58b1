//! A first look at cronoq embedded: one pool with an unlabeled group and a
//! `gpu=a100` group; a mix of labeled, unlabeled, deadline, fixed-start and
//! flaky tasks; where each ran; the final snapshot.
//!
//! Run: `cargo run --release --example embedded`

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cronoq::{Labels, Scheduler, Task, TaskContext, TaskError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sched = Scheduler::new();
    sched.set_capacity("inference", 2)?;
    sched.set_group_capacity("inference", Labels::from([("gpu", "a100")]), 1)?;
    sched.executor("inference", |ctx: TaskContext, payload: Bytes| async move {
        let text = String::from_utf8_lossy(&payload).into_owned();
        if text.starts_with("flaky") && ctx.attempt == 1 {
            return Err(TaskError::retryable("first attempt always fails"));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok(Bytes::from(format!("{text} done")))
    })?;

    let now = SystemTime::now();
    let gpu = |t: Task| t.label("gpu", "a100");
    let tasks = vec![
        ("labeled", gpu(Task::new("train-1"))),
        ("unlabeled", Task::new("resize-1")),
        ("unlabeled", Task::new("resize-2")),
        ("labeled", gpu(Task::new("train-2"))),
        ("unlabeled", Task::new("resize-3")),
        (
            "deadline",
            Task::new("report").deadline(now + Duration::from_millis(200)),
        ),
        (
            "fixed-start",
            Task::new("nightly").start_at(now + Duration::from_millis(500), Duration::from_secs(2)),
        ),
        (
            "retried",
            Task::new("flaky-1").backoff(Duration::from_millis(50), Duration::from_secs(1)),
        ),
        ("unlabeled", Task::new("resize-4")),
    ];

    let mut handles = Vec::new();
    for (kind, task) in tasks {
        let required = task.required_labels().to_string();
        let handle = sched.submit(task.pool("inference")).await?;
        handles.push((kind, required, handle));
    }
    println!("while running:\n{}", sched.snapshot().to_table());

    println!(
        "{:<5} {:<12} {:<10} {:<10} {:<12} {:>8}  OUTPUT",
        "TASK", "KIND", "REQUIRES", "STATE", "RAN IN", "ATTEMPTS"
    );
    for (kind, required, handle) in handles {
        let id = handle.id();
        let outcome = handle.wait().await?;
        let group = match outcome.group() {
            Some(g) if g.is_empty() => "(unlabeled)".to_string(),
            Some(g) => g.to_string(),
            None => "-".to_string(),
        };
        println!(
            "{:<5} {:<12} {:<10} {:<10} {:<12} {:>8}  {}",
            id,
            kind,
            if required.is_empty() { "-" } else { &required },
            outcome.state,
            group,
            outcome.attempts.len(),
            outcome
                .output
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default(),
        );
    }
    println!("\nfinal snapshot:\n{}", sched.snapshot().to_table());
    Ok(())
}
