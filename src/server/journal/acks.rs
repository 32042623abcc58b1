//! The committer's own acknowledgement inbox ([`Acks`]): a record written on its own is published with a reply subject under one subscription, and its PubAck is read in the commit loop — no request, timers, channel or JSON decoding per write. Anything but a plain success (an error, no answer in time) is written again the full way (`put_counted`).

use crate::server::*;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Instant;

use super::pipeline::WriteId;

/// How long an acknowledgement may take before its write is tried again
/// the full way (async-nats' own JetStream timeout).
pub(in crate::server) const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How often writes are checked for an overdue acknowledgement.
pub(in crate::server) const ACK_SWEEP: Duration = Duration::from_secs(1);

/// A write to be tried again the full way: its id, key and sealed body.
pub(in crate::server) type Retry = (WriteId, Key, Bytes);

/// A record's key in the results bucket, kept as what it is made of: a
/// write names it once, in its subject, and keeps no string of it while
/// its acknowledgement is awaited.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::server) enum Key {
    /// A task's record: its sequence.
    Task(u64),
    /// A start-record slot (`s.<n>`).
    Slot(u32),
    /// Any other key (a schedule's).
    Named(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Task(seq) => write!(f, "{seq}"),
            Key::Slot(slot) => write!(f, "s.{slot}"),
            Key::Named(name) => f.write_str(name),
        }
    }
}

/// Single record writes waiting for their PubAck on one subscription.
pub(in crate::server) struct Acks {
    /// `<inbox>.`: a write's reply subject is this and its token.
    inbox: String,
    /// `$KV.<bucket>.`: a record's subject is this and its key.
    prefix: String,
    acks: async_nats::Subscriber,
    /// The fence and the headers that carry it (rebuilt when it moves).
    headers: (u64, async_nats::HeaderMap),
    /// Writes by token, oldest first: `sent[i]` has token `first + i`
    /// (`None`: acknowledged or tried again). Tokens are given in order and
    /// acknowledgements come nearly in order, so this stays short.
    sent: VecDeque<Option<Sent>>,
    first: u64,
    /// The `Some` entries of `sent`.
    open: usize,
}

/// A write published and not yet acknowledged.
struct Sent {
    id: WriteId,
    key: Key,
    body: Bytes,
    at: Instant,
}

/// What became of a write handed to [`Acks::send`].
pub(in crate::server) enum Sending {
    /// Published; its acknowledgement will come through [`Acks::acked`].
    Sent,
    /// This server no longer leads (the fence is gone).
    Fenced,
    /// Not published: write it the full way.
    Retry(Retry),
}

impl Acks {
    /// Subscribes the inbox; `None` if NATS will not have it (then every
    /// write goes the full way).
    pub(in crate::server) async fn open(results: &Fenced) -> Option<Acks> {
        let inbox = results.client.new_inbox();
        let acks = results.client.subscribe(format!("{inbox}.*")).await.ok()?;
        Some(Acks {
            inbox: format!("{inbox}."),
            prefix: format!("$KV.{}.", results.bucket),
            acks,
            headers: (0, async_nats::HeaderMap::new()),
            sent: VecDeque::new(),
            first: 0,
            open: 0,
        })
    }

    /// Whether writes await their acknowledgement.
    pub(in crate::server) fn waiting(&self) -> bool {
        self.open > 0
    }

    /// Seals `body` (under its key) and publishes it under `key`, fenced
    /// on the leader subject, with this inbox as its reply subject.
    pub(in crate::server) async fn send(
        &mut self,
        results: &Fenced,
        seal: &seal::Seal,
        id: WriteId,
        key: Key,
        body: Bytes,
    ) -> Sending {
        let mut subject = String::with_capacity(self.prefix.len() + 24);
        subject.push_str(&self.prefix);
        let _ = write!(subject, "{key}");
        let body = seal.seal(&subject[self.prefix.len()..], body);
        let fence = results.fence.load(Ordering::SeqCst);
        if fence == 0 {
            return Sending::Fenced;
        }
        if self.headers.0 != fence {
            self.headers = (fence, election::fence_headers(&results.subject, fence));
        }
        let token = self.first + self.sent.len() as u64;
        let mut reply = String::with_capacity(self.inbox.len() + 20);
        reply.push_str(&self.inbox);
        let _ = write!(reply, "{token}");
        let published = results
            .client
            .publish_with_reply_and_headers(subject, reply, self.headers.1.clone(), body.clone())
            .await;
        if published.is_err() {
            return Sending::Retry((id, key, body));
        }
        results.pending_records.fetch_add(1, Ordering::Relaxed);
        self.sent.push_back(Some(Sent {
            id,
            key,
            body,
            at: Instant::now(),
        }));
        self.open += 1;
        Sending::Sent
    }

    /// Takes the write of `token` out, if it still waits.
    fn take(&mut self, token: u64) -> Option<Sent> {
        let i = usize::try_from(token.checked_sub(self.first)?).ok()?;
        let sent = self.sent.get_mut(i)?.take()?;
        self.open -= 1;
        self.trim();
        Some(sent)
    }

    /// Drops the settled writes at the front.
    fn trim(&mut self) {
        while matches!(self.sent.front(), Some(None)) {
            self.sent.pop_front();
            self.first += 1;
        }
    }

    /// The next acknowledgement; `None` once the subscription ended (the
    /// client is gone).
    pub(in crate::server) async fn next(&mut self) -> Option<async_nats::Message> {
        self.acks.next().await
    }

    /// An acknowledgement came: `Ok(id)` if its write is stored, `Err` with
    /// the write to try again the full way if the answer is anything else
    /// (refused, fenced, no stream). `None`: not one of ours any more (it
    /// was already tried again).
    pub(in crate::server) fn acked(
        &mut self,
        results: &Fenced,
        ack: &async_nats::Message,
    ) -> Option<Result<WriteId, Retry>> {
        let token = ack
            .subject
            .as_str()
            .rsplit('.')
            .next()?
            .parse::<u64>()
            .ok()?;
        let sent = self.take(token)?;
        results.pending_records.fetch_sub(1, Ordering::Relaxed);
        if stored(ack) {
            Some(Ok(sent.id))
        } else {
            Some(Err((sent.id, sent.key, sent.body)))
        }
    }

    /// The writes whose acknowledgement is overdue at `now` (or every
    /// write, the subscription having ended), to try again the full way.
    pub(in crate::server) fn overdue(
        &mut self,
        results: &Fenced,
        now: Option<Instant>,
    ) -> Vec<Retry> {
        let mut late = Vec::new();
        for entry in self.sent.iter_mut() {
            if entry
                .as_ref()
                .is_some_and(|s| now.map_or(true, |now| now.duration_since(s.at) >= ACK_TIMEOUT))
            {
                if let Some(s) = entry.take() {
                    results.pending_records.fetch_sub(1, Ordering::Relaxed);
                    late.push((s.id, s.key, s.body));
                }
            }
        }
        self.open -= late.len();
        self.trim();
        late
    }
}

/// Whether a PubAck says the message is stored: a plain success
/// (`{"stream":…,"seq":…}`), no status and no error in it.
fn stored(ack: &async_nats::Message) -> bool {
    let body = ack.payload.as_ref();
    ack.status.is_none()
        && body.starts_with(b"{\"stream\"")
        && !body.windows(7).any(|w| w == b"\"error\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(status: Option<async_nats::StatusCode>, body: &'static str) -> async_nats::Message {
        async_nats::Message {
            subject: "_INBOX.x.1".into(),
            reply: None,
            payload: Bytes::from_static(body.as_bytes()),
            headers: None,
            status,
            description: None,
            length: body.len(),
        }
    }

    #[test]
    fn only_a_plain_success_counts_as_stored() {
        assert!(stored(&ack(None, r#"{"stream":"KV_P_RESULTS","seq":7}"#)));
        assert!(stored(&ack(
            None,
            r#"{"stream":"KV_P_RESULTS","seq":7,"duplicate":true}"#
        )));
        assert!(!stored(&ack(
            None,
            r#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"KV_P_RESULTS","seq":0}"#
        )));
        assert!(!stored(&ack(
            None,
            r#"{"stream":"KV_P_RESULTS","seq":0,"error":{"code":503}}"#
        )));
        assert!(!stored(&ack(
            Some(async_nats::StatusCode::NO_RESPONDERS),
            ""
        )));
        assert!(!stored(&ack(None, "")));
    }
}
