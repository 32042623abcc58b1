//! The log's shell: its JetStream streams, fenced pipelined appends,
//! reading it back, snapshots and truncation (issue 35). The rules are
//! `log/` (pure); this file only moves bytes.
//!
//! - *The log* is one stream per log instance (`<P>_LOG_<INSTANCE>`, one
//!   subject), with no age or count limit: an entry leaves it only when a
//!   stored snapshot covers it.
//! - *Appends are fenced by the log itself*: every message carries
//!   `Nats-Expected-Last-Sequence` — the sequence the stream is at before
//!   it, so a leader's pieces go out pipelined as N, N+1, N+2… (nats-server
//!   checks it against the stream's last sequence on one node, and against
//!   the last proposed one, `clseq`, on a replicated stream). A successor's
//!   takeover entry moves the stream, and every later append of the
//!   deposed leader is refused. Leadership renewals are on another stream
//!   (the election's), so they never conflict with appends.
//! - *A failed or unanswered append is read back* before anything is
//!   sent again: a piece found at its place is stored (a lost
//!   acknowledgement); another's piece there means a successor leads; an
//!   empty place is written again.
//! - *Snapshots* go to a second stream (`<P>_SNAP_<INSTANCE>`): the state's
//!   bytes in chunks (`c.<at>.<i>`), then a manifest (`m`, the last few
//!   kept) naming the log sequence `at` it covers, its size and digest.
//!   Only then is the log purged below `at + 1`. A reader takes the newest
//!   manifest (the highest `at`) whose chunks are whole, then the log from
//!   `at + 1`; a reader that finds the log purged past it loads the newer
//!   snapshot.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::log::{
    pieces, read_back, Assembler, AtPlace, Entry, Item, LogState, ReadBack, SEAL_KEY,
};
use super::seal::Seal;

/// The names of one log instance's streams and subjects.
#[derive(Clone, Debug)]
pub(crate) struct LogNames {
    pub log_stream: String,
    pub log_subject: String,
    pub snap_stream: String,
    snap_prefix: String,
}

impl LogNames {
    /// The names of log `instance` under `subjects`' prefix.
    pub(crate) fn new(subjects: &crate::wire::Subjects, instance: &str) -> LogNames {
        let prefix = subjects.prefix();
        let upper = format!("{prefix}_{instance}")
            .to_uppercase()
            .replace(['-', '.'], "_");
        let upper = upper
            .split_once('_')
            .map_or(upper.clone(), |(p, i)| format!("{p}_LOG_{i}"));
        LogNames {
            snap_stream: upper.replacen("_LOG_", "_SNAP_", 1),
            log_stream: upper,
            log_subject: format!("{prefix}.log.{instance}"),
            snap_prefix: format!("{prefix}.snap.{instance}"),
        }
    }

    fn manifest(&self) -> String {
        format!("{}.m", self.snap_prefix)
    }

    fn chunk(&self, at: u64, i: u32) -> String {
        format!("{}.c.{at}.{i}", self.snap_prefix)
    }

    fn chunks_of(&self, at: u64) -> String {
        format!("{}.c.{at}.>", self.snap_prefix)
    }
}

/// What went wrong with the log.
#[derive(Debug)]
pub(crate) enum LogError {
    /// A successor leads: this leadership's appends are refused.
    Fenced,
    /// NATS did not answer as it should (retry later).
    Nats(String),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::Fenced => write!(f, "a successor leads"),
            LogError::Nats(e) => write!(f, "{e}"),
        }
    }
}

/// A snapshot's manifest: what it covers and how to read it.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    /// The log sequence of the last message it covers.
    at: u64,
    chunks: u32,
    len: u64,
    sha256: [u8; 32],
}

/// How many manifests the snapshot stream keeps (readers take the newest
/// whole one; a deposed leader's late, older snapshot never hides a newer
/// one).
const MANIFESTS_KEPT: i64 = 4;

/// One log instance's streams.
#[derive(Clone)]
pub(crate) struct LogStore {
    js: jetstream::Context,
    log: stream::Stream,
    snaps: stream::Stream,
    names: LogNames,
    seal: Seal,
    /// The largest message the log writes (NATS's limit less headers).
    max_message: usize,
}

/// Where reading the log stopped: the state, the assembler's place, and
/// the last stream sequence read (entries and dropped messages alike).
pub(crate) struct Reader {
    pub state: LogState,
    pub assembler: Assembler,
    pub read: u64,
}

impl Reader {
    /// A reader that goes on from a snapshot's state (`None`: from the
    /// log's beginning).
    pub(crate) fn from_snapshot(state: Option<LogState>) -> Reader {
        match state {
            Some(state) => {
                let (epoch, last_n) = state.position();
                let read = state.applied();
                Reader {
                    assembler: Assembler::after(epoch, last_n),
                    state,
                    read,
                }
            }
            None => Reader {
                state: LogState::default(),
                assembler: Assembler::default(),
                read: 0,
            },
        }
    }
}

impl LogStore {
    /// Opens (creating if need be) log `names`' streams, `replicas` each.
    pub(crate) async fn open(
        js: jetstream::Context,
        names: LogNames,
        replicas: usize,
        seal: Seal,
        max_message: usize,
    ) -> Result<LogStore, LogError> {
        let log = js
            .get_or_create_stream(stream::Config {
                name: names.log_stream.clone(),
                subjects: vec![names.log_subject.clone()],
                num_replicas: replicas,
                storage: stream::StorageType::File,
                max_message_size: max_message as i32 + 1024,
                ..Default::default()
            })
            .await
            .map_err(|e| LogError::Nats(format!("creating the log stream: {e}")))?;
        let snaps = js
            .get_or_create_stream(stream::Config {
                name: names.snap_stream.clone(),
                subjects: vec![format!("{}.>", names.snap_prefix)],
                num_replicas: replicas,
                storage: stream::StorageType::File,
                max_messages_per_subject: MANIFESTS_KEPT,
                max_message_size: max_message as i32 + 1024,
                ..Default::default()
            })
            .await
            .map_err(|e| LogError::Nats(format!("creating the snapshot stream: {e}")))?;
        Ok(LogStore {
            js,
            log,
            snaps,
            names,
            seal,
            max_message,
        })
    }

    /// Its streams' names.
    pub(crate) fn names(&self) -> &LogNames {
        &self.names
    }

    /// The largest message it writes.
    pub(crate) fn max_message(&self) -> usize {
        self.max_message
    }

    /// The log stream's (first, last) sequences.
    pub(crate) async fn bounds(&self) -> Result<(u64, u64), LogError> {
        let mut log = self.log.clone();
        let info = log
            .info()
            .await
            .map_err(|e| LogError::Nats(e.to_string()))?;
        Ok((info.state.first_sequence, info.state.last_sequence))
    }

    /// The state from the newest snapshot and the whole log after it.
    pub(crate) async fn load(&self) -> Result<Reader, LogError> {
        loop {
            let mut reader = Reader::from_snapshot(self.load_snapshot().await?);
            let (_, last) = self.bounds().await?;
            match self.read_to(&mut reader, last).await {
                Ok(()) => return Ok(reader),
                // Purged past us: a newer snapshot covers it.
                Err(ReadError::Gap) => continue,
                Err(ReadError::Nats(e)) => return Err(LogError::Nats(e)),
            }
        }
    }

    /// The log's messages from sequence `from` on, as they are stored
    /// (and as they come): `(sequence, body)`. `Err(Gap)`: the log no
    /// longer holds `from` (a snapshot covers it: load it again).
    pub(crate) async fn messages_from(&self, from: u64) -> Result<LogMessages, ReadError> {
        let (first, _) = self
            .bounds()
            .await
            .map_err(|e| ReadError::Nats(e.to_string()))?;
        if first > from {
            return Err(ReadError::Gap);
        }
        let consumer = self
            .log
            .create_consumer(crate::nats::ordered_from(from))
            .await
            .map_err(|e| ReadError::Nats(e.to_string()))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| ReadError::Nats(e.to_string()))?;
        Ok(Box::pin(messages.map(|m| {
            let m = m.map_err(|e| e.to_string())?;
            let seq = m.info().map_err(|e| e.to_string())?.stream_sequence;
            Ok((seq, m.message.payload))
        })))
    }

    /// Applies the log to `reader` from after `reader.read` up to `upto`.
    /// `Err(Gap)`: the log no longer holds the next message (a snapshot
    /// covers it: load it again).
    pub(crate) async fn read_to(&self, reader: &mut Reader, upto: u64) -> Result<(), ReadError> {
        if reader.read >= upto {
            return Ok(());
        }
        let mut messages = self.messages_from(reader.read + 1).await?;
        while reader.read < upto {
            let (seq, body) = tokio::time::timeout(Duration::from_secs(5), messages.next())
                .await
                .map_err(|_| ReadError::Nats("reading the log timed out".into()))?
                .ok_or_else(|| ReadError::Nats("the log's consumer ended".into()))?
                .map_err(ReadError::Nats)?;
            if seq != reader.read + 1 {
                return Err(ReadError::Gap);
            }
            apply_message(reader, &self.seal, seq, &body);
        }
        Ok(())
    }

    /// Takes over as leadership `epoch`: reads the log to its end into
    /// `reader`, then appends the takeover entry where it ended (fenced:
    /// if the deposed leader appended meanwhile, reads on and tries
    /// again). Every append of the deposed leader after it is refused.
    /// Also returns the last sequence read before the takeover entry.
    pub(crate) async fn take_over(
        &self,
        reader: &mut Reader,
        epoch: u64,
        server: &str,
    ) -> Result<(Appender, u64), LogError> {
        loop {
            let (_, last) = self.bounds().await?;
            match self.read_to(reader, last).await {
                Ok(()) => {}
                Err(ReadError::Gap) => {
                    *reader = self.load().await?;
                    continue;
                }
                Err(ReadError::Nats(e)) => return Err(LogError::Nats(e)),
            }
            let before = reader.read;
            let entry = Entry {
                epoch,
                n: 0,
                items: vec![Item::Takeover {
                    server: server.to_string(),
                }],
            };
            let mut appender = Appender::new(self.clone(), epoch, reader.read);
            appender.send_entry(entry).await?;
            match appender.next_stored().await {
                Ok((seq, entry)) => {
                    apply_stored(reader, seq, &entry);
                    return Ok((appender, before));
                }
                // The deposed leader appended after our read: read on.
                Err(LogError::Fenced) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The newest whole snapshot, if any.
    pub(crate) async fn load_snapshot(&self) -> Result<Option<LogState>, LogError> {
        let mut manifests = Vec::new();
        let subject = self.names.manifest();
        let mut from = 1;
        // The kept manifests, oldest first (a handful).
        loop {
            match self
                .snaps
                .get_first_raw_message_by_subject(&subject, from)
                .await
            {
                Ok(m) => {
                    from = m.sequence + 1;
                    if let Ok(body) = self.seal.open("snapshot", &m.payload) {
                        if let Ok(manifest) = crate::wire::decode::<Manifest>(body) {
                            manifests.push(manifest);
                        }
                    }
                }
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
                {
                    break
                }
                Err(e) => return Err(LogError::Nats(format!("reading snapshot manifests: {e}"))),
            }
        }
        manifests.sort_by_key(|m| std::cmp::Reverse(m.at));
        for manifest in manifests {
            match self.read_snapshot(&manifest).await {
                Ok(state) => return Ok(Some(state)),
                Err(e) => {
                    tracing::warn!(at = manifest.at, error = %e, "snapshot not whole; trying an older one")
                }
            }
        }
        Ok(None)
    }

    async fn read_snapshot(&self, manifest: &Manifest) -> Result<LogState, String> {
        let mut bytes = Vec::with_capacity(manifest.len as usize);
        for i in 0..manifest.chunks {
            let chunk = self
                .snaps
                .get_last_raw_message_by_subject(&self.names.chunk(manifest.at, i))
                .await
                .map_err(|e| format!("chunk {i}: {e}"))?;
            let body = self
                .seal
                .open("snapshot", &chunk.payload)
                .map_err(|why| format!("chunk {i}: {why:?}"))?;
            bytes.extend_from_slice(body);
        }
        if bytes.len() as u64 != manifest.len
            || <[u8; 32]>::from(Sha256::digest(&bytes)) != manifest.sha256
        {
            return Err("size or digest differs".into());
        }
        let state = LogState::from_snapshot(&bytes)?;
        if state.applied() != manifest.at {
            return Err("covers another sequence than its manifest says".into());
        }
        Ok(state)
    }

    /// Stores a snapshot of `state` (every entry it holds is stored in
    /// the log: the caller applies only stored entries), then purges the
    /// log below it and the snapshots before the one it replaces.
    pub(crate) async fn write_snapshot(
        &self,
        at: u64,
        bytes: Vec<u8>,
    ) -> Result<SnapshotWritten, LogError> {
        let started = std::time::Instant::now();
        let room = self.max_message.saturating_sub(256).max(1);
        let mut chunks = 0u32;
        for chunk in bytes.chunks(room) {
            let body = self.seal.seal("snapshot", Bytes::copy_from_slice(chunk));
            self.publish(self.names.chunk(at, chunks), body).await?;
            chunks += 1;
        }
        let manifest = Manifest {
            at,
            chunks,
            len: bytes.len() as u64,
            sha256: Sha256::digest(&bytes).into(),
        };
        let body = self
            .seal
            .seal("snapshot", crate::wire::encode(&manifest).into());
        self.publish(self.names.manifest(), body).await?;
        // The log below it: covered.
        self.log
            .purge()
            .sequence(at + 1)
            .await
            .map_err(|e| LogError::Nats(format!("truncating the log: {e}")))?;
        // Snapshots older than the one before this one: no manifest is
        // left that names them, or none a reader would choose.
        if let Some(older) = self.older_snapshots(at).await {
            for old in older {
                let _ = self.snaps.purge().filter(self.names.chunks_of(old)).await;
            }
        }
        Ok(SnapshotWritten {
            bytes: bytes.len(),
            took: started.elapsed(),
        })
    }

    /// The `at` of kept manifests older than the newest two, below `at`.
    async fn older_snapshots(&self, at: u64) -> Option<Vec<u64>> {
        let mut ats = Vec::new();
        let mut from = 1;
        while let Ok(m) = self
            .snaps
            .get_first_raw_message_by_subject(self.names.manifest(), from)
            .await
        {
            from = m.sequence + 1;
            let body = self.seal.open("snapshot", &m.payload).ok()?;
            let manifest: Manifest = crate::wire::decode(body).ok()?;
            ats.push(manifest.at);
        }
        ats.sort_unstable();
        ats.retain(|&a| a < at);
        let keep_from = ats.len().saturating_sub(1);
        Some(ats[..keep_from].to_vec())
    }

    async fn publish(&self, subject: String, body: Bytes) -> Result<(), LogError> {
        self.js
            .publish(subject, body)
            .await
            .map_err(|e| LogError::Nats(e.to_string()))?
            .await
            .map_err(|e| LogError::Nats(e.to_string()))?;
        Ok(())
    }
}

/// The log's messages as read: `(sequence, body)`.
pub(crate) type LogMessages =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<(u64, Bytes), String>> + Send>>;

/// Why reading the log stopped short.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The next message is purged: a snapshot covers it.
    Gap,
    Nats(String),
}

/// What a snapshot cost.
#[derive(Debug)]
pub(crate) struct SnapshotWritten {
    pub bytes: usize,
    pub took: Duration,
}

/// Applies one message of the log, read at `seq`; the entry it
/// completed, if any.
pub(crate) fn apply_message(
    reader: &mut Reader,
    seal: &Seal,
    seq: u64,
    body: &[u8],
) -> Option<Entry> {
    reader.read = seq;
    match reader.assembler.push(seal, body) {
        Ok(Some(entry)) => {
            reader.state.apply(seq, &entry);
            Some(entry)
        }
        Ok(None) => None,
        Err(why) => {
            tracing::warn!(seq, ?why, "a message of the log is not the log's");
            None
        }
    }
}

/// Applies an entry the leader itself stored, its last message at `seq`.
pub(crate) fn apply_stored(reader: &mut Reader, seq: u64, entry: &Entry) {
    reader.read = seq;
    reader.assembler = Assembler::after(entry.epoch, Some(entry.n));
    reader.state.apply(seq, entry);
}

/// One piece sent and not yet known stored.
struct Sent {
    /// The stream sequence it must land at.
    at: u64,
    body: Bytes,
    /// The entry it ends, if it is its last piece.
    ends: Option<Entry>,
    ack: Ack,
}

/// What is known of a piece's acknowledgement.
enum Ack {
    /// Sent; the answer is awaited.
    Waiting(jetstream::context::PublishAckFuture),
    /// Found stored at its place (read back).
    Stored,
    /// Not sent, or not answered as stored: read back before anything.
    Unknown,
}

/// A leadership's appends: pipelined, in order, each fenced on the
/// sequence the log must be at.
pub(crate) struct Appender {
    store: LogStore,
    epoch: u64,
    next_n: u64,
    /// The sequence the stream is at once everything sent is stored.
    sent_upto: u64,
    under_way: VecDeque<Sent>,
}

impl Appender {
    fn new(store: LogStore, epoch: u64, at: u64) -> Appender {
        Appender {
            store,
            epoch,
            next_n: 0,
            sent_upto: at,
            under_way: VecDeque::new(),
        }
    }

    /// Entries sent and not yet known stored.
    pub(crate) fn pending(&self) -> usize {
        self.under_way.iter().filter(|s| s.ends.is_some()).count()
    }

    /// Sends the next entry of this leadership holding `items`; stored
    /// once [`Appender::next_stored`] returns it.
    pub(crate) async fn send(&mut self, items: Vec<Item>) -> Result<(), LogError> {
        let entry = Entry {
            epoch: self.epoch,
            n: self.next_n,
            items,
        };
        self.send_entry(entry).await
    }

    async fn send_entry(&mut self, entry: Entry) -> Result<(), LogError> {
        self.next_n = entry.n + 1;
        let bodies = pieces(&entry, self.store.max_message);
        let last = bodies.len() - 1;
        let mut entry = Some(entry);
        for (i, body) in bodies.into_iter().enumerate() {
            let body = self.store.seal.seal(SEAL_KEY, body.into());
            let at = self.sent_upto + 1;
            self.sent_upto = at;
            let ack = self.publish(at, body.clone()).await;
            self.under_way.push_back(Sent {
                at,
                body,
                ends: if i == last { entry.take() } else { None },
                ack,
            });
        }
        Ok(())
    }

    /// Publishes a piece fenced to land at `at` (not sent: read back and
    /// sent again later).
    async fn publish(&self, at: u64, body: Bytes) -> Ack {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Last-Sequence", (at - 1).to_string().as_str());
        self.store
            .js
            .publish_with_headers(self.store.names.log_subject.clone(), headers, body)
            .await
            .map_or(Ack::Unknown, Ack::Waiting)
    }

    /// The next entry sent, once it is stored (in the order sent), with
    /// the sequence of its last message. `Err(Fenced)`: a successor
    /// leads. Waits while NATS is away.
    pub(crate) async fn next_stored(&mut self) -> Result<(u64, Entry), LogError> {
        loop {
            let Some(front) = self.under_way.front_mut() else {
                return Err(LogError::Nats("nothing under way".into()));
            };
            let stored = match std::mem::replace(&mut front.ack, Ack::Unknown) {
                Ack::Waiting(ack) => matches!(ack.await, Ok(ack) if ack.sequence == front.at),
                Ack::Stored => true,
                Ack::Unknown => false,
            };
            if !stored {
                self.read_back().await?;
                continue;
            }
            let sent = self.under_way.pop_front().expect("front");
            if let Some(entry) = sent.ends {
                return Ok((sent.at, entry));
            }
        }
    }

    /// After a piece was not acknowledged: waits for every piece under way
    /// to be answered, then reads each unconfirmed place back. Ours there:
    /// stored. Another's: `Fenced`. Empty: sends ours again, from there on.
    async fn read_back(&mut self) -> Result<(), LogError> {
        for sent in self.under_way.iter_mut() {
            if let Ack::Waiting(ack) = std::mem::replace(&mut sent.ack, Ack::Unknown) {
                if matches!(ack.await, Ok(ack) if ack.sequence == sent.at) {
                    sent.ack = Ack::Stored;
                }
            }
        }
        let mut delay = Duration::from_millis(50);
        loop {
            match self.read_back_once().await {
                Ok(()) => return Ok(()),
                Err(LogError::Fenced) => return Err(LogError::Fenced),
                Err(LogError::Nats(e)) => {
                    tracing::warn!(error = %e, "reading the log back failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    async fn read_back_once(&mut self) -> Result<(), LogError> {
        let (first, last) = self.store.bounds().await?;
        let mut send_from = None;
        for i in 0..self.under_way.len() {
            let sent = &self.under_way[i];
            if matches!(sent.ack, Ack::Stored) {
                continue;
            }
            let message;
            let found =
                if sent.at > last {
                    AtPlace::Nothing
                } else if sent.at < first {
                    AtPlace::Purged
                } else {
                    message =
                        self.store.log.get_raw_message(sent.at).await.map_err(|e| {
                            LogError::Nats(format!("reading back {}: {e}", sent.at))
                        })?;
                    AtPlace::Holds(&message.payload)
                };
            match read_back(&self.store.seal, self.epoch, &sent.body, last, found) {
                ReadBack::Stored => self.under_way[i].ack = Ack::Stored,
                ReadBack::SendFrom(at) => {
                    if at != sent.at {
                        tracing::warn!(
                            place = sent.at,
                            "a deposed leader's piece took this leadership's place in the log; sending again after it"
                        );
                    }
                    send_from = Some((i, at));
                    break;
                }
                ReadBack::Fenced => return Err(LogError::Fenced),
            }
        }
        // The rest go out again, one after another from that place.
        let Some((from, mut at)) = send_from else {
            return Ok(());
        };
        for i in from..self.under_way.len() {
            let body = self.under_way[i].body.clone();
            self.under_way[i].at = at;
            self.under_way[i].ack = self.publish(at, body).await;
            at += 1;
        }
        self.sent_upto = at - 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::TaskState;
    use crate::server::log::tests::record;
    use crate::server::log::Known;

    async fn store(url: &str, seal: Seal) -> LogStore {
        let client = async_nats::connect(url).await.unwrap();
        let js = jetstream::new(client);
        let subjects = crate::wire::Subjects::new("cqlog").unwrap();
        LogStore::open(js, LogNames::new(&subjects, "main"), 1, seal, 4096)
            .await
            .unwrap()
    }

    /// Sends one entry per task, all before the first is known stored,
    /// then applies each as it is stored.
    async fn append_all(appender: &mut Appender, reader: &mut Reader, items: Vec<Item>) {
        let n = items.len();
        for item in items {
            appender.send(vec![item]).await.unwrap();
        }
        for _ in 0..n {
            let (seq, entry) = appender.next_stored().await.unwrap();
            apply_stored(reader, seq, &entry);
        }
    }

    #[tokio::test]
    async fn pipelined_appends_read_back_cold_as_the_leaders_state() {
        let nats = crate::test_nats::NatsServer::start();
        let seal = Seal::from_secret("0123456789abcdef0123456789abcdef").unwrap();
        let store = store(&nats.url, seal).await;
        let mut leader = store.load().await.unwrap();
        let mut appender = store.take_over(&mut leader, 7, "s1").await.unwrap().0;
        let mut items: Vec<Item> = (1..=300)
            .map(|s| Item::Task(record(s, TaskState::Running)))
            .collect();
        let mut big = record(5, TaskState::Succeeded);
        big.output = Some(vec![9u8; 20_000].into());
        items.push(Item::Task(big));
        append_all(&mut appender, &mut leader, items).await;
        assert_eq!(leader.state.known(5), Known::Finished);
        let cold = store.load().await.unwrap();
        assert_eq!(cold.state, leader.state);
        assert_eq!(cold.read, leader.read);
    }

    #[tokio::test]
    async fn a_deposed_leaders_appends_are_refused_and_the_log_keeps_what_it_stored() {
        let nats = crate::test_nats::NatsServer::start();
        let store = store(&nats.url, Seal::none()).await;
        let mut a = store.load().await.unwrap();
        let mut old = store.take_over(&mut a, 1, "a").await.unwrap().0;
        append_all(
            &mut old,
            &mut a,
            (1..=3)
                .map(|s| Item::Task(record(s, TaskState::Running)))
                .collect(),
        )
        .await;
        // B takes over while A still thinks it leads.
        let mut b = store.load().await.unwrap();
        let mut new = store.take_over(&mut b, 2, "b").await.unwrap().0;
        old.send(vec![Item::Task(record(1, TaskState::Succeeded))])
            .await
            .unwrap();
        assert!(matches!(old.next_stored().await, Err(LogError::Fenced)));
        append_all(
            &mut new,
            &mut b,
            vec![Item::Task(record(2, TaskState::Failed))],
        )
        .await;
        let cold = store.load().await.unwrap();
        assert_eq!(cold.state, b.state);
        assert!(
            matches!(cold.state.known(1), Known::Live(_)),
            "A's late result is not the log's"
        );
        assert_eq!(cold.state.known(2), Known::Finished);
        assert_eq!(cold.state.position(), (2, Some(1)));
    }

    /// A deposed leader's second pipelined piece expected the sequence
    /// the successor's takeover entry took, so it lands right after it:
    /// the successor's first append is refused, and its read-back sends
    /// it again after the stray instead of giving up its lead.
    #[tokio::test]
    async fn a_deposed_leaders_stray_after_the_takeover_entry_is_stepped_over() {
        let nats = crate::test_nats::NatsServer::start();
        let store = store(&nats.url, Seal::none()).await;
        let mut a = store.load().await.unwrap();
        let mut old = store.take_over(&mut a, 1, "a").await.unwrap().0;
        let mut b = store.load().await.unwrap();
        let mut new = store.take_over(&mut b, 2, "b").await.unwrap().0;
        let (_, takeover_at) = store.bounds().await.unwrap();
        // A's first is refused (the takeover entry is there); its second
        // expected exactly that sequence and lands.
        for s in 1..=2 {
            old.send(vec![Item::Task(record(s, TaskState::Succeeded))])
                .await
                .unwrap();
        }
        assert!(matches!(old.next_stored().await, Err(LogError::Fenced)));
        assert_eq!(
            store.bounds().await.unwrap().1,
            takeover_at + 1,
            "the stray"
        );
        append_all(
            &mut new,
            &mut b,
            vec![Item::Task(record(3, TaskState::Failed))],
        )
        .await;
        assert_eq!(b.read, takeover_at + 2, "sent again after the stray");
        let cold = store.load().await.unwrap();
        assert_eq!(cold.state, b.state);
        assert_eq!(
            cold.state.known(2),
            Known::None,
            "the stray is not the log's"
        );
        assert_eq!(cold.state.known(3), Known::Finished);
    }

    #[tokio::test]
    async fn a_snapshot_truncates_the_log_and_a_reader_behind_it_loads_it() {
        let nats = crate::test_nats::NatsServer::start();
        let store = store(&nats.url, Seal::none()).await;
        let mut leader = store.load().await.unwrap();
        let mut appender = store.take_over(&mut leader, 3, "s").await.unwrap().0;
        let behind = store.load().await.unwrap();
        append_all(
            &mut appender,
            &mut leader,
            (1..=50)
                .map(|s| Item::Task(record(s, TaskState::Succeeded)))
                .collect(),
        )
        .await;
        let first_at = leader.state.applied();
        store
            .write_snapshot(first_at, leader.state.snapshot())
            .await
            .unwrap();
        assert_eq!(store.bounds().await.unwrap().0, first_at + 1, "truncated");
        append_all(
            &mut appender,
            &mut leader,
            (51..=60)
                .map(|s| Item::Task(record(s, TaskState::Running)))
                .collect(),
        )
        .await;
        let older = leader.state.clone();
        assert!(leader.state.applied() > first_at);
        store
            .write_snapshot(leader.state.applied(), leader.state.snapshot())
            .await
            .unwrap();
        let cold = store.load().await.unwrap();
        assert_eq!(cold.state, leader.state);
        // A reader that was behind finds the log purged past it.
        let mut behind = behind;
        let (_, last) = store.bounds().await.unwrap();
        let got = store.read_to(&mut behind, last).await;
        assert!(
            matches!(got, Err(ReadError::Gap)),
            "{got:?} read {} last {last}",
            behind.read
        );
        // A deposed leader's late snapshot, older, does not hide the newer.
        let mut stale = older.clone();
        stale.prune_below(0);
        let _ = store
            .write_snapshot(older.applied(), older.snapshot())
            .await
            .unwrap();
        let cold = store.load().await.unwrap();
        assert_eq!(cold.state, leader.state);
    }
}
