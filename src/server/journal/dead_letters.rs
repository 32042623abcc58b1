//! Dead letters: a refused submission is copied, headers and body, to `P.deadletter.<pool>` with its reason.

use crate::server::*;

/// Copies submission `seq` to `P.deadletter.<pool>` with its headers and
/// body as they were, plus `Cronoq-Dead-Letter-Code`, `-Reason` (at most
/// 1,000 bytes) and `-Seq`. A few tries; a dead letter that cannot be
/// written is logged, never allowed to block the pipeline.
pub(in crate::server) async fn dead_letter_copy(
    js: &jetstream::Context,
    submit_stream: &stream::Stream,
    subjects: &Subjects,
    seq: u64,
    pool: &PoolName,
    reason: &WireError,
    max_payload: usize,
) {
    let original = match submit_stream.get_raw_message(seq).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(seq, error = %e, "dead letter: the submission is gone");
            return;
        }
    };
    let mut headers = async_nats::HeaderMap::new();
    for (name, values) in original.headers.iter() {
        // A copied Nats-Msg-Id would make the stream drop a second letter.
        if name.to_string().eq_ignore_ascii_case("Nats-Msg-Id") {
            continue;
        }
        for value in values {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert("Cronoq-Dead-Letter-Code", reason.code.as_str());
    let mut text = reason.message.clone();
    if text.len() > 1_000 {
        let mut end = 1_000;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    // Header values are one line.
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    headers.insert("Cronoq-Dead-Letter-Reason", text.as_str());
    headers.insert("Cronoq-Dead-Letter-Seq", seq.to_string().as_str());
    // A body that fills the submission's NATS message leaves no room for
    // the reason headers: NATS would close the connection over it. Such a
    // letter keeps the headers and says how long the body was.
    let mut body = original.payload.clone();
    let header_bytes: usize = headers
        .iter()
        .map(|(n, vs)| {
            let name: &str = n.as_ref();
            vs.iter()
                .map(|v| name.len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum();
    let limit = max_payload.saturating_sub(1024);
    if body.len() + header_bytes > limit {
        headers.insert(
            "Cronoq-Dead-Letter-Body-Dropped",
            body.len().to_string().as_str(),
        );
        body = Bytes::new();
    }
    for attempt in 0..5u32 {
        let sent = js
            .publish_with_headers(subjects.dead_letter(pool), headers.clone(), body.clone())
            .await;
        let acked = match sent {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match acked {
            Ok(()) => {
                tracing::info!(seq, pool = %pool, code = %reason.code, "submission dead-lettered");
                return;
            }
            Err(e) => {
                tracing::warn!(seq, error = %e, attempt, "writing a dead letter failed");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}
