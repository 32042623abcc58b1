//! Leader election and fencing over one JetStream subject.
//!
//! **The leader subject** `$KV.<P>_RESULTS._leader` lives in the results
//! bucket's stream, beside every result the leader writes. Each message on
//! it is a [`LeaderRecord`]; every write is a compare-and-set
//! (`Nats-Expected-Last-Subject-Sequence` = the sequence the writer last
//! saw there), so the messages on that subject form one chain and whoever
//! wrote its last link owns it.
//!
//! * **Taking over**: a candidate writes a record expecting the sequence it
//!   observed. The sequence of that write is the new **epoch**: stream
//!   sequences only grow, so epochs do too.
//! * **Holding**: the leader renews every `election_timeout / 4`, expecting
//!   its own last sequence. A renewal refused as "wrong last sequence" means
//!   someone took over (unless the last record is its own: a renewal whose
//!   acknowledgement was lost): the leader steps down at once. A renewal
//!   unacknowledged for a period (lost with a NATS reconnect) is asked
//!   again at once, not after the JetStream timeout.
//! * **Standing by**: a follower polls the subject; if its sequence has not
//!   moved for `election_timeout` (measured on the follower's own clock) it
//!   takes over, expecting that sequence — so of two candidates only one
//!   wins, and a leader that renewed meanwhile keeps its place.
//! * **Resigning**: a leader that stops writes a record with `resigned`;
//!   followers take over at their next poll, without waiting.
//! * **Fencing**: every result the leader stores carries
//!   `Nats-Expected-Last-Subject-Sequence-Subject: <leader subject>` with
//!   the leader's last sequence there, so once a successor has written the
//!   subject, a deposed leader (paused, partitioned, slow) can no longer
//!   change durable state: NATS refuses the write (error 10071), not good
//!   manners. A leader also stops acting (no leases) once its last
//!   successful renewal is older than `election_timeout`, before a
//!   follower may take over.
//!
//! No TTL is involved in liveness (replicas' clocks may disagree about
//! one): only "the sequence did not move for this long" on one clock, and
//! compare-and-set for safety.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::core::Millis;

/// The follower's rule, as a pure state machine (the simulation in
/// `tests/election_sim.rs` drives it): when to try a takeover, and
/// expecting which sequence.
#[derive(Clone, Debug, Default)]
pub struct Standby {
    /// The sequence seen last and when it was first seen (own clock).
    last: Option<(u64, Millis)>,
    /// The highest record count seen of each writing process (the newest
    /// few): a record at or below it is a replay.
    newest: std::collections::BTreeMap<String, u64>,
}

impl Standby {
    /// What the subject holds, seen at `now` on this server's clock: the
    /// sequence to expect in a takeover write, if one should go out now —
    /// no record, a resigned one, this process's own (`me` is its
    /// instance id), or one that has not moved for `timeout` since this
    /// server first saw it. A record of another process is never taken at
    /// once, even under the same server id: two servers given one id took
    /// it from each other every few hundred milliseconds, for good.
    ///
    /// ```
    /// use cronoq::core::Millis;
    /// use cronoq::server::election::{LeaderRecord, Observed, Standby};
    /// let rec = |id: &str| Some(LeaderRecord { id: "s".into(), http: String::new(), epoch: 3, resigned: false, instance: id.into(), renewal: 0, seal: None });
    /// let mut s = Standby::default();
    /// let seen = Observed { seq: 9, record: rec("a") };
    /// assert_eq!(s.consider(Millis(0), Millis(750), &seen, "b"), None);
    /// assert_eq!(s.consider(Millis(749), Millis(750), &seen, "b"), None);
    /// assert_eq!(s.consider(Millis(750), Millis(750), &seen, "b"), Some(9));
    /// ```
    pub fn consider(
        &mut self,
        now: Millis,
        timeout: Millis,
        observed: &Observed,
        me: &str,
    ) -> Option<u64> {
        let replay = self.replayed(observed);
        if let Some(r) = observed
            .record
            .as_ref()
            .filter(|r| r.renewal > 0 && !replay)
        {
            self.newest.insert(r.instance.clone(), r.renewal);
            if self.newest.len() > 16 {
                let oldest = self
                    .newest
                    .iter()
                    .min_by_key(|(_, n)| **n)
                    .map(|(i, _)| i.clone());
                if let Some(oldest) = oldest.filter(|o| *o != r.instance) {
                    self.newest.remove(&oldest);
                }
            }
        }
        let stale = match (&observed.record, self.last) {
            (None, _) => true,
            (Some(r), _) if r.resigned => true,
            // This process's own record (it stepped down after a slow
            // renewal): take it back now.
            (Some(r), _) if !me.is_empty() && r.instance == me => true,
            (Some(_), Some((seq, since))) if seq == observed.seq => now >= since.plus(timeout),
            // A genuine record published again (issue 34, finding 9): the
            // subject moved, nobody renewed. Counted from before it; the
            // takeover expects its sequence.
            (Some(_), Some((_, since))) if replay => {
                self.last = Some((observed.seq, since));
                now >= since.plus(timeout)
            }
            _ => {
                self.last = Some((observed.seq, now));
                false
            }
        };
        stale.then_some(observed.seq)
    }

    /// Whether `observed` repeats a record this standby has seen its
    /// writer surpass (or seen itself): a replay, not a renewal.
    pub fn replayed(&self, observed: &Observed) -> bool {
        observed.record.as_ref().is_some_and(|r| {
            r.renewal > 0
                && self
                    .newest
                    .get(&r.instance)
                    .is_some_and(|&n| r.renewal <= n)
        })
    }

    /// Another server's write came first: start counting again.
    pub fn lost_race(&mut self) {
        self.last = None;
    }

    /// The leader record could not be read: its silence is counted again
    /// from the next read (the stream may be electing a leader, and the
    /// leader's renewals wait for it too).
    pub fn could_not_read(&mut self) {
        self.last = None;
    }
}

/// The leader's rule: it may act (lease, reply, write, look at its
/// timers) until `timeout` after it *sent* its last stored write on the
/// leader subject, less [`act_margin`] — never later than a follower may
/// take over, since a follower counts from when it first saw that write,
/// which is after it was sent. The margin covers what happens between
/// the check at the top of a turn and the turn's last publish, and clocks
/// that run at slightly different rates.
///
/// ```
/// use cronoq::core::Millis;
/// use cronoq::server::election::may_act;
/// assert!(may_act(Millis(2_699), Millis(0), Millis(3_000)));
/// assert!(!may_act(Millis(2_700), Millis(0), Millis(3_000)));
/// ```
pub fn may_act(now: Millis, last_sent: Millis, timeout: Millis) -> bool {
    now.plus(act_margin(timeout)) < last_sent.plus(timeout)
}

/// How long before the election timeout a leader stops acting: a tenth
/// of it (300 ms of the default 3 s).
pub fn act_margin(timeout: Millis) -> Millis {
    Millis(timeout.0 / 10)
}

/// What the leader subject holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The server id.
    pub id: String,
    /// Its HTTP address, for operators.
    #[serde(default)]
    pub http: String,
    /// The leadership's epoch: the sequence of its first record (0 in that
    /// first record itself, which is its own sequence).
    #[serde(default)]
    pub epoch: u64,
    /// The leader stopped and handed over.
    #[serde(default)]
    pub resigned: bool,
    /// The writing process's random instance id: two processes started
    /// with the same server id (a mistake) are still told apart.
    #[serde(default)]
    pub instance: String,
    /// The writing process's count of its records (from 1; 0 from servers
    /// before issue 34): a record whose count its process already
    /// surpassed is a replay, not a renewal (finding 9).
    #[serde(default)]
    pub renewal: u64,
    /// The servers' storage seal over the fields above
    /// ([`super::seal`]); with a storage key set, a record without the
    /// right one is no record at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

impl LeaderRecord {
    /// Whether `seal` vouches for it (always, without a storage key).
    pub fn sealed_by(&self, seal: &super::seal::Seal) -> bool {
        seal.leader_ok(
            self.seal.as_deref(),
            &self.id,
            &self.instance,
            (self.epoch, self.renewal),
            self.resigned,
            &self.http,
        )
    }
}

/// The last record on the leader subject and its sequence (0: none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Sequence of the last message on the subject.
    pub seq: u64,
    /// Its record, if there is one and it decodes.
    pub record: Option<LeaderRecord>,
}

/// What a follower last saw on the leader subject, and since when (its own
/// clock) that sequence has stood: a leader renews every quarter of the
/// election timeout, so a sequence that stands still means none does.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The last record.
    pub observed: Observed,
    /// When its sequence was first seen.
    pub since: Instant,
}

impl Observed {
    /// Why the record cannot be one a cronoq server wrote (`None`: it may
    /// be). Every server writes its id, its random instance id (16 hex
    /// digits) and an epoch that is 0 (a takeover) or the sequence of an
    /// earlier record on the subject; anyone allowed to publish there (an
    /// open NATS) can write anything, and such a record leads nobody.
    ///
    /// ```
    /// use cronoq::server::election::{LeaderRecord, Observed};
    /// let forged: LeaderRecord = serde_json::from_str(r#"{"id":"evil","epoch":99999999}"#).unwrap();
    /// let o = Observed { seq: 12, record: Some(forged) };
    /// assert!(o.not_genuine().is_some());
    /// let real = LeaderRecord { id: "s1".into(), http: String::new(), epoch: 9, resigned: false, instance: "0123456789abcdef".into(), renewal: 0, seal: None };
    /// assert_eq!(Observed { seq: 12, record: Some(real) }.not_genuine(), None);
    /// ```
    pub fn not_genuine(&self) -> Option<String> {
        let r = self.record.as_ref()?;
        if r.id.is_empty() {
            return Some("it names no server".into());
        }
        // No figures or free text in a reason: it ends up in a metric
        // label (`cronoq_unready{reason}`), which must not take a new
        // value with every forged write.
        if r.epoch > self.seq {
            return Some("its epoch is past its own sequence".into());
        }
        let hex16 = r.instance.len() == 16 && r.instance.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex16 {
            return Some("its instance id is not one a server makes".into());
        }
        None
    }

    /// The epoch the record stands for.
    pub fn epoch(&self) -> u64 {
        match &self.record {
            Some(r) if r.epoch != 0 => r.epoch,
            _ => self.seq,
        }
    }
}

/// How a write on the leader subject went.
#[derive(Debug)]
pub(crate) enum Write {
    /// Stored at this sequence.
    Stored(u64),
    /// Someone else wrote the subject first.
    Lost,
    /// A replicated stream refused it because another write checking the
    /// same subject was in flight (JetStream error 10164): try again now.
    Busy,
    /// NATS did not answer; nothing is known.
    Failed(String),
}

/// JetStream's 10164: on a replicated stream only one in-flight write may
/// check a given subject's last sequence; others are refused until it is
/// stored. async-nats reports it as `Other`, so it is told by its code.
pub(crate) fn is_busy(e: &async_nats::jetstream::context::PublishError) -> bool {
    e.to_string().contains("10164")
}

/// One server's view of the election.
#[derive(Clone)]
pub(crate) struct Election {
    js: jetstream::Context,
    stream: String,
    subject: String,
    server_id: String,
    /// This process's instance id (random), in every record it writes.
    instance: String,
    http: String,
    timeout: Duration,
    /// The leader's last sequence on the subject (0: not leading): the
    /// value every fenced write expects.
    pub fence: Arc<AtomicU64>,
    /// The servers' storage key: seals this process's records, and a
    /// record not sealed with it is none.
    seal: super::seal::Seal,
    /// Records this process wrote (each carries its count: a replay of an
    /// older one is told from a renewal).
    written: Arc<AtomicU64>,
}

/// The header pair that fences a write on `subject`'s last sequence.
pub(crate) fn fence_headers(subject: &str, seq: u64) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence",
        seq.to_string().as_str(),
    );
    headers.insert("Nats-Expected-Last-Subject-Sequence-Subject", subject);
    headers
}

impl Election {
    pub(crate) fn new(
        js: jetstream::Context,
        subjects: &crate::wire::Subjects,
        server_id: String,
        http: String,
        timeout: Duration,
    ) -> Election {
        Election {
            js,
            stream: format!("KV_{}", subjects.results_bucket()),
            subject: subjects.leader(),
            server_id,
            instance: format!("{:016x}", rand::random::<u64>()),
            http,
            timeout,
            fence: Arc::new(AtomicU64::new(0)),
            seal: super::seal::Seal::none(),
            written: Arc::default(),
        }
    }

    /// Seals its records with the servers' storage key, and takes only
    /// records sealed with it.
    pub(crate) fn with_seal(mut self, seal: super::seal::Seal) -> Election {
        self.seal = seal;
        self
    }

    /// A record of this process (epoch 0: a takeover).
    fn record(&self, epoch: u64, resigned: bool) -> LeaderRecord {
        let renewal = self.written.fetch_add(1, Ordering::SeqCst) + 1;
        let mut record = LeaderRecord {
            id: self.server_id.clone(),
            http: self.http.clone(),
            epoch,
            resigned,
            instance: self.instance.clone(),
            renewal,
            seal: None,
        };
        record.seal = self.seal.leader_seal(
            &record.id,
            &record.instance,
            (epoch, renewal),
            resigned,
            &record.http,
        );
        record
    }

    /// This process's instance id.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// The election timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Reads the last record, giving up after the election timeout (at
    /// least 1 s): while a replicated stream elects its leader a read can
    /// hang for JetStream's whole request timeout.
    pub(crate) async fn observe(&self) -> Result<Observed, String> {
        let bound = self.timeout.max(Duration::from_secs(1));
        tokio::time::timeout(bound, self.observe_now())
            .await
            .unwrap_or_else(|_| Err("reading the leader record timed out".into()))
    }

    async fn observe_now(&self) -> Result<Observed, String> {
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| e.to_string())?;
        match stream.get_last_raw_message_by_subject(&self.subject).await {
            Ok(m) => {
                let record = serde_json::from_slice::<LeaderRecord>(&m.payload)
                    .ok()
                    .filter(|r| {
                        let ok = r.sealed_by(&self.seal);
                        if !ok {
                            // Forged (an open NATS), or another
                            // deployment's key: it leads nothing.
                            tracing::warn!(seq = m.sequence, id = %r.id, epoch = r.epoch, "leader record not sealed with the servers' storage key ignored");
                        }
                        ok
                    });
                Ok(Observed {
                    seq: m.sequence,
                    record,
                })
            }
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                Ok(Observed::default())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    async fn write(&self, expected: u64, record: &LeaderRecord) -> Write {
        // The same compare-and-set as a fenced result, on the subject itself.
        let headers = fence_headers(&self.subject, expected);
        let body = Bytes::from(serde_json::to_vec(record).expect("a record serializes"));
        let sent = self
            .js
            .publish_with_headers(self.subject.clone(), headers, body)
            .await;
        let ack = match sent {
            Ok(ack) => ack.await,
            Err(e) => return Write::Failed(e.to_string()),
        };
        match ack {
            Ok(ack) => Write::Stored(ack.sequence),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Write::Lost,
            Err(e) if is_busy(&e) => Write::Busy,
            Err(e) => Write::Failed(e.to_string()),
        }
    }

    /// Stands by until this server takes over; returns the new epoch and
    /// when its takeover write was sent (the start of its right to act).
    /// Follower state (who leads) is reported through `seen`.
    pub(crate) async fn campaign(
        &self,
        seen: &tokio::sync::watch::Sender<Option<Seen>>,
    ) -> (u64, Instant) {
        let poll = (self.timeout / 8).clamp(Duration::from_millis(20), Duration::from_millis(50));
        let base = Instant::now();
        let clock = || Millis(Instant::now().duration_since(base).as_millis() as u64);
        let timeout = Millis::from_duration(self.timeout);
        let mut standby = Standby::default();
        let mut warned = false;
        loop {
            match self.observe().await {
                Ok(observed) => {
                    let replay = standby.replayed(&observed);
                    seen.send_modify(|last| {
                        let since = match last {
                            Some(l) if l.observed.seq == observed.seq || replay => l.since,
                            _ => Instant::now(),
                        };
                        *last = observed.record.is_some().then(|| Seen {
                            observed: observed.clone(),
                            since,
                        });
                    });
                    if let Some(r) = &observed.record {
                        if r.id == self.server_id
                            && r.instance != self.instance
                            && !r.resigned
                            && !warned
                        {
                            warned = true;
                            tracing::warn!(
                                server_id = %self.server_id,
                                "the leader record names this server's id but another process \
                                 (or this server before a restart): give every server its own --id"
                            );
                        }
                    }
                    if let Some(expected) =
                        standby.consider(clock(), timeout, &observed, &self.instance)
                    {
                        let record = self.record(0, false);
                        let sent = Instant::now();
                        match self.write(expected, &record).await {
                            Write::Stored(seq) => {
                                self.fence.store(seq, Ordering::SeqCst);
                                return (seq, sent);
                            }
                            Write::Lost => standby.lost_race(),
                            Write::Busy => {}
                            Write::Failed(e) => {
                                tracing::warn!(error = %e, "taking over failed; retrying")
                            }
                        }
                    }
                }
                Err(e) => {
                    // The stream may be electing a leader of its own, and
                    // the leader's renewals wait for it too: count its
                    // silence again from when it can be read (issue 34,
                    // finding 14).
                    standby.could_not_read();
                    tracing::debug!(error = %e, "cannot read the leader record yet")
                }
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Renews leadership `epoch` until it is lost: returns why. `renewed`
    /// gets the instant of every successful renewal.
    pub(crate) async fn hold(&self, epoch: u64, renewed: &AtomicInstant) -> String {
        let every = (self.timeout / 4).max(Duration::from_millis(10));
        // The first renewal goes out at once: it carries the epoch, and
        // workers that see it re-register with this leader now.
        let mut wait = Duration::ZERO;
        loop {
            tokio::time::sleep(wait).await;
            wait = every;
            let expected = self.fence.load(Ordering::SeqCst);
            // The right to act runs from when the write was *sent*: a
            // follower starts counting no earlier than it was stored.
            let sent = Instant::now();
            // An acknowledgement lost with the connection (nats-server
            // restarting) would hold the loop for the JetStream timeout,
            // past the right to act: given up after a renewal period, and
            // asked again. Had the write been stored after all, the next
            // one is refused as "wrong last sequence" and the fence is
            // reclaimed (below).
            let record = self.record(epoch, false);
            let write = tokio::time::timeout(every, self.write(expected, &record)).await;
            let write = write.unwrap_or_else(|_| {
                Write::Failed(format!(
                    "no acknowledgement within {} ms",
                    every.as_millis()
                ))
            });
            match write {
                Write::Stored(seq) => {
                    self.fence.store(seq, Ordering::SeqCst);
                    renewed.set(sent);
                }
                // A result write checking the subject was in flight.
                Write::Busy => wait = Duration::from_millis(2),
                Write::Lost => {
                    // A renewal of ours stored without its acknowledgement
                    // (lost with a NATS restart) moved the subject.
                    match self.reclaim(epoch, expected).await {
                        Some(true) => {
                            wait = Duration::ZERO;
                            continue;
                        }
                        Some(false) => return "another server took over".into(),
                        // Not readable now: not an answer (issue 34,
                        // finding 14). Asked again.
                        None => wait = (every / 8).max(Duration::from_millis(10)),
                    }
                }
                // Not stored, and nobody else's either: the leadership
                // goes on renewing, acting on nothing meanwhile once the
                // right to act lapsed (`leadership::Tenure::wait`), until
                // a renewal is stored or another server's record is found
                // (issue 34, finding 14: a stream electing its leader
                // answers nothing for seconds).
                Write::Failed(e) => {
                    if renewed.may_act(self.timeout) {
                        tracing::warn!(error = %e, "renewing leadership failed; retrying");
                    } else {
                        tracing::debug!(error = %e, "renewing leadership failed; retrying");
                    }
                    wait = (every / 8).max(Duration::from_millis(10));
                }
            }
        }
    }

    /// After a write fenced on `expected` was refused: whether the last
    /// link of the chain is still this server's leadership `epoch` (a
    /// renewal of ours was stored but its acknowledgement is not in yet,
    /// or was lost). Nobody else writes a record of our epoch and any
    /// takeover appends one of another, so we still lead: the fence moves
    /// to that record's sequence (unless it moved meanwhile) and the
    /// caller tries again. The right to act is not extended: only a
    /// renewal whose send time is known does that.
    async fn reclaim(&self, epoch: u64, expected: u64) -> Option<bool> {
        let observed = match self.observe().await {
            Ok(o) => o,
            Err(_) => return None,
        };
        Some(match observed {
            o if o.epoch() == epoch && self.is_own_live(&o) => {
                let _ = self.fence.compare_exchange(
                    expected,
                    o.seq.max(expected),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                let fence = self.fence.load(Ordering::SeqCst);
                fence != 0 && fence != expected
            }
            _ => false,
        })
    }

    /// Hands over: followers take over at their next poll.
    ///
    /// A renewal still in flight when leadership stopped (its future is
    /// dropped, its write is not) can land after the fence this reads;
    /// the resignation is then refused as "wrong last sequence". If the
    /// last record is still this leadership's own, it resigns on top of it
    /// (the same compare-and-set: a successor's record in between refuses
    /// it). Before, such a stop fell back to the election timeout.
    pub(crate) async fn resign(&self, epoch: u64) {
        let record = self.record(epoch, true);
        let mut expected = self.fence.swap(0, Ordering::SeqCst);
        for _ in 0..RESIGN_TRIES {
            match self.write(expected, &record).await {
                Write::Stored(_) => {
                    tracing::info!(epoch, "resigned leadership");
                    return;
                }
                Write::Busy => tokio::time::sleep(Duration::from_millis(2)).await,
                Write::Lost => match self.observe().await {
                    Ok(o) if o.epoch() == epoch && self.is_own_live(&o) => expected = o.seq,
                    _ => break,
                },
                Write::Failed(e) => {
                    tracing::info!(epoch, error = %e, "could not resign");
                    return;
                }
            }
        }
        tracing::info!(epoch, "could not resign (no longer leading?)");
    }

    /// Whether `o` is a live (not resigned) record of this process.
    fn is_own_live(&self, o: &Observed) -> bool {
        o.record
            .as_ref()
            .is_some_and(|r| r.instance == self.instance && !r.resigned)
    }
}

/// How many times [`Election::resign`] writes before it gives up.
const RESIGN_TRIES: usize = 5;

/// An instant shared between tasks (ms since a base instant).
pub(crate) struct AtomicInstant {
    base: Instant,
    ms: AtomicU64,
}

impl AtomicInstant {
    /// Starting at `at` (which must not be in the future).
    pub(crate) fn new(at: Instant) -> AtomicInstant {
        AtomicInstant {
            base: at,
            ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn set(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.base).as_millis() as u64;
        self.ms.store(ms, Ordering::SeqCst);
    }

    /// [`may_act`] with this instant as the last stored write's send time:
    /// the one rule the driver, the renewal loop and the simulation share.
    pub(crate) fn may_act(&self, timeout: Duration) -> bool {
        let now = Millis(Instant::now().duration_since(self.base).as_millis() as u64);
        let sent = Millis(self.ms.load(Ordering::SeqCst));
        may_act(now, sent, Millis::from_duration(timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, instance: &str) -> Option<LeaderRecord> {
        Some(LeaderRecord {
            id: id.into(),
            http: String::new(),
            epoch: 3,
            resigned: false,
            instance: instance.into(),
            renewal: 0,
            seal: None,
        })
    }

    /// A live record of another process is waited out even when it names
    /// this server's id (two servers started with one id, or this server
    /// before a restart); only this process's own record is taken back at
    /// once. Before, two servers sharing an id took the lead from each
    /// other at every poll.
    #[test]
    fn a_record_under_the_same_id_from_another_process_is_not_taken_at_once() {
        let timeout = Millis(750);
        let mut s = Standby::default();
        let other = Observed {
            seq: 9,
            record: record("s1", "other-process"),
        };
        assert_eq!(s.consider(Millis(0), timeout, &other, "me"), None);
        assert_eq!(s.consider(Millis(749), timeout, &other, "me"), None);
        assert_eq!(s.consider(Millis(750), timeout, &other, "me"), Some(9));
        let mine = Observed {
            seq: 10,
            record: record("s1", "me"),
        };
        assert_eq!(s.consider(Millis(751), timeout, &mine, "me"), Some(10));
        // A record from before instances were written is nobody's own.
        let old = Observed {
            seq: 11,
            record: record("s1", ""),
        };
        assert_eq!(s.consider(Millis(752), timeout, &old, ""), None);
    }

    /// Issue 34, finding 9: a dead leader's genuine (sealed) record
    /// published again and again moves the subject, but it is no renewal:
    /// the standby counts the silence from the last real one and takes
    /// over after the timeout (expecting the replay's sequence). A real
    /// renewal (a higher count) resets the count as before.
    #[test]
    fn a_replayed_leader_record_is_not_a_renewal() {
        let timeout = Millis(750);
        let mut s = Standby::default();
        let at = |seq: u64, renewal: u64| Observed {
            seq,
            record: record("s1", "dead").map(|r| LeaderRecord { renewal, ..r }),
        };
        assert_eq!(s.consider(Millis(0), timeout, &at(5, 7), "me"), None);
        // Replays of renewal 7 every 500 ms under new sequences.
        assert_eq!(s.consider(Millis(500), timeout, &at(6, 7), "me"), None);
        assert!(s.replayed(&at(7, 7)));
        assert_eq!(s.consider(Millis(1_000), timeout, &at(7, 7), "me"), Some(7));
        // A real renewal counts as one.
        let mut s = Standby::default();
        assert_eq!(s.consider(Millis(0), timeout, &at(5, 7), "me"), None);
        assert_eq!(s.consider(Millis(500), timeout, &at(6, 8), "me"), None);
        assert_eq!(s.consider(Millis(1_000), timeout, &at(7, 9), "me"), None);
        assert_eq!(s.consider(Millis(1_749), timeout, &at(7, 9), "me"), None);
        assert_eq!(s.consider(Millis(1_750), timeout, &at(7, 9), "me"), Some(7));
    }

    /// A graceful stop while a renewal is in flight: the renewal lands
    /// after the fence `resign` read, and the resignation still lands on
    /// top of it (before, it was refused and followers waited out the
    /// election timeout: seen once in five graceful stops of the failover
    /// bench). A successor's record in between is never overwritten.
    #[tokio::test]
    async fn a_resignation_lands_after_a_renewal_that_was_in_flight() {
        let nats = crate::test_nats::NatsServer::start();
        let client = async_nats::connect(&nats.url).await.unwrap();
        let js = jetstream::new(client);
        let subjects = crate::wire::Subjects::new("cqel").unwrap();
        js.create_key_value(jetstream::kv::Config {
            bucket: subjects.results_bucket(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
        let timeout = Duration::from_millis(750);
        let election = Election::new(js.clone(), &subjects, "s1".into(), String::new(), timeout);
        let (seen, _) = tokio::sync::watch::channel(None);
        let (epoch, _) = election.campaign(&seen).await;
        // The renewal the stopped `hold` had sent: stored, but the fence
        // not moved to it.
        let fence = election.fence.load(Ordering::SeqCst);
        let renewal = election.write(fence, &election.record(epoch, false)).await;
        assert!(
            matches!(renewal, Write::Stored(seq) if seq > fence),
            "{renewal:?}"
        );
        election.resign(epoch).await;
        let last = election.observe().await.unwrap();
        let record = last.record.expect("a leader record");
        assert!(record.resigned, "{record:?}");
        assert_eq!(record.epoch, epoch);

        // Leading again, then a successor writes: the resignation must
        // not land on top of the successor's record.
        let (epoch, _) = election.campaign(&seen).await;
        let other = Election::new(js, &subjects, "s2".into(), String::new(), timeout);
        let current = election.observe().await.unwrap();
        let successor = other
            .write(current.seq, &other.record(epoch + 1, false))
            .await;
        assert!(matches!(successor, Write::Stored(_)), "{successor:?}");
        election.resign(epoch).await;
        let record = election.observe().await.unwrap().record.unwrap();
        assert_eq!((record.epoch, record.resigned), (epoch + 1, false));
        assert_eq!(record.instance, other.instance);
    }
}
