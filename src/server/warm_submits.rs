//! A standby's copy of the submit stream, decoded (issue 22: "warm
//! standbys must really be warm"). Beside the journal's warm copy
//! ([`super::warm`]), every server that stands by follows the submit
//! stream with an ordered consumer and keeps each submission as the
//! leader's consumer would hand it to the driver, less its journal record
//! ([`Decoded`]: decoded, credentials checked — the same answer as at a
//! takeover, see there). A takeover takes the copy whole and hands it to
//! the driver with each submission's record from the journal's warm copy,
//! then reads from the stream only what came after the copy's last
//! sequence: reading, decoding and checking 100,000 submissions again was
//! most of a large takeover.
//!
//! The copy holds every message the stream held from the first it
//! delivered up to `seen` (an ordered consumer delivers each in order and
//! starts over from the next after a gap), so a takeover that hands over
//! the copy's submissions from the stream's first sequence on and reads
//! the stream from `seen + 1` sees exactly what reading the whole stream
//! would. It is pruned below the stream's first sequence every
//! [`PRUNE_EVERY`] (the purge drops only finished submissions), so it
//! holds no more than the stream held a second or two before. Taking it
//! empties it: the follow starts over from the stream's first message once
//! this process stands by again (while it leads, the follow is paused with
//! the journal's).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use tokio::sync::watch;

use super::consumer::{decode, read_raw, submissions_from, Decoded};
use super::guard::Guard;
use crate::wire::Subjects;

/// How often the copy forgets submissions purged from the stream (as
/// often as the leader purges: a submission kept costs about 1 KiB, the
/// task decoded, and a busy stream purges tens of thousands a second).
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// How long a takeover waits for the copy to reach the stream's last
/// sequence; past it, the copy is handed over as far as it got and the
/// stream read from there.
pub(crate) const CATCH_UP_WAIT: Duration = Duration::from_millis(250);

#[derive(Default)]
struct Copy {
    submissions: BTreeMap<u64, Decoded>,
    /// The last stream sequence delivered.
    seen: u64,
    /// Bumped when a takeover takes the copy: a follow begun before stops.
    generation: u64,
    /// Submissions up to this sequence were lent to a successor prepared
    /// ahead ([`WarmSubmissions::lend`]; 0: none): the copy has a hole.
    lent_upto: u64,
}

/// What a takeover took from the copy.
pub(crate) struct Copied {
    /// The copy's submissions from the stream's first sequence on.
    pub(crate) submissions: BTreeMap<u64, Decoded>,
    /// Every message of the stream up to this sequence is in
    /// `submissions`, or was purged.
    pub(crate) seen: u64,
}

/// The copy, shared by the follow and the takeover.
#[derive(Clone, Default)]
pub(crate) struct WarmSubmissions {
    copy: Arc<Mutex<Copy>>,
}

impl WarmSubmissions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.copy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last stream sequence the copy holds (or skipped, purged).
    pub(crate) fn seen(&self) -> u64 {
        self.lock().seen
    }

    /// Bumped each time the copy starts over (taken, reset).
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Adds submission `seq`, delivered by a follow begun at
    /// `generation`; false if a takeover took the copy since (that follow
    /// must stop).
    fn apply(&self, generation: u64, seq: u64, decoded: Decoded) -> bool {
        let mut copy = self.lock();
        if copy.generation != generation {
            return false;
        }
        if seq > copy.seen {
            copy.seen = seq;
            copy.submissions.insert(seq, decoded);
        }
        true
    }

    /// Forgets submissions below `first` (purged from the stream).
    fn prune_below(&self, first: u64) {
        let mut copy = self.lock();
        copy.submissions = copy.submissions.split_off(&first);
    }

    /// Waits until the copy has seen sequence `upto`; false after `wait`.
    pub(crate) async fn caught_up(&self, upto: u64, wait: Duration) -> bool {
        super::warm::poll_until(wait, || self.seen() >= upto).await
    }

    /// Lends the copy's submissions from `first` on to a successor
    /// prepared before the election ([`super::successor`]): they leave the
    /// copy, which goes on from where it was (`seen` stays), so a takeover
    /// that leads with that successor takes only what came after. One that
    /// does not must [`WarmSubmissions::reset`] the copy: it has a hole.
    /// (Cloning 400,000 decoded submissions took 300 ms, longer than
    /// admitting them.)
    /// `None` if the copy has a hole already (lent before, not reset).
    pub(crate) fn lend(&self, first: u64) -> Option<Copied> {
        let mut copy = self.lock();
        if copy.lent_upto > 0 {
            return None;
        }
        copy.lent_upto = copy.seen.max(1);
        let mut held = std::mem::take(&mut copy.submissions);
        let lent = held.split_off(&first);
        // Below `first`: purged.
        drop_elsewhere(held);
        Some(Copied {
            submissions: lent,
            seen: copy.seen,
        })
    }

    /// Empties the copy; a follow begun before stops, and the next starts
    /// over from the stream's first message.
    pub(crate) fn reset(&self) {
        drop_elsewhere(self.take(u64::MAX).submissions);
    }

    /// Takes the copy's submissions from `first` (the stream's first
    /// sequence at this takeover, or the one after what a prepared
    /// successor was lent) on; the copy is empty afterwards, and a follow
    /// begun before it stops. Nothing (`seen` 0: read the stream) if part
    /// of that was lent to a successor not led with.
    pub(crate) fn take(&self, first: u64) -> Copied {
        let mut copy = self.lock();
        let taken = std::mem::take(&mut *copy);
        copy.generation = taken.generation + 1;
        if taken.lent_upto > 0 && taken.lent_upto >= first {
            drop_elsewhere(taken.submissions);
            return Copied {
                submissions: BTreeMap::new(),
                seen: 0,
            };
        }
        let mut submissions = taken.submissions;
        let from_first = submissions.split_off(&first);
        drop_elsewhere(submissions);
        Copied {
            submissions: from_first,
            seen: taken.seen,
        }
    }
}

/// Drops submissions on a blocking thread when there are many
/// ([`super::drop_later`]).
fn drop_elsewhere(submissions: BTreeMap<u64, Decoded>) {
    if submissions.len() > 1024 {
        super::drop_later(submissions);
    }
}

/// What the follow needs: the connection others publish to (a submission
/// whose headers reset a connection resets this one, not the journal's),
/// the submit stream seen through it, and the checks of the consumer.
pub(crate) struct Source {
    pub(crate) client: async_nats::Client,
    pub(crate) stream: stream::Stream,
    pub(crate) subjects: Subjects,
    /// Only its checks of submissions are used: the same per process.
    pub(crate) guard: Arc<Guard>,
}

/// Keeps `copy` up to date with the submit stream, for the life of the
/// process, while `paused` is false (this process stands by); starts over
/// after the last sequence seen when the consumer breaks or NATS
/// reconnects. A submission no client can read (its headers reset the
/// connection: the follow stalls on it twice) is read through the
/// JetStream API, as the leader's consumer does.
pub(crate) async fn follow(
    source: Source,
    copy: WarmSubmissions,
    mut paused: watch::Receiver<bool>,
) {
    let js = jetstream::new(source.client.clone());
    let stream_name = source.subjects.submit_stream();
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalls = 0u32;
    loop {
        if *paused.borrow_and_update() {
            if paused.wait_for(|p| !*p).await.is_err() {
                return;
            }
            continue;
        }
        let generation = copy.generation();
        let from = copy.seen() + 1;
        let connects = source.client.statistics().connects.load(Ordering::Relaxed);
        let mut messages = match submissions_from(&source.stream, from).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "cannot follow the submit stream; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let mut reconnect_check = tokio::time::interval(Duration::from_millis(250));
        let mut interrupted = false;
        loop {
            tokio::select! {
                message = messages.next() => match message {
                    Some(Ok(m)) => {
                        let Ok(info) = m.info() else { continue };
                        let (seq, published) = (info.stream_sequence, SystemTime::from(info.published));
                        let decoded = decode(&source.subjects, &source.guard, &m.message, seq, published);
                        if !copy.apply(generation, seq, decoded) {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "following the submit stream interrupted; resuming");
                        interrupted = true;
                        break;
                    }
                    None => {
                        interrupted = true;
                        break;
                    }
                },
                _ = paused.changed() => break,
                _ = reconnect_check.tick() => {
                    if source.client.statistics().connects.load(Ordering::Relaxed) != connects {
                        interrupted = true;
                        break;
                    }
                    // Reset meanwhile (a successor prepared ahead was
                    // dropped): start over now, not at the next message,
                    // which an idle stream may never bring.
                    if copy.generation() != generation {
                        break;
                    }
                }
                _ = prune.tick() => {
                    let mut stream = source.stream.clone();
                    if let Ok(info) = stream.info().await {
                        copy.prune_below(info.state.first_sequence);
                    }
                }
            }
        }
        drop(messages);
        stalls = if interrupted && copy.seen() + 1 == from {
            stalls + 1
        } else {
            0
        };
        if stalls >= 2 {
            if let Ok(Some((m, published))) = read_raw(&js, &stream_name, from).await {
                tracing::warn!(
                    seq = from,
                    "submission read through the API: its headers reset the connection"
                );
                let decoded = decode(&source.subjects, &source.guard, &m, from, published);
                copy.apply(generation, from, decoded);
                stalls = 0;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::consumer::tests::decoded;

    fn seqs(copied: &Copied) -> Vec<u64> {
        copied.submissions.keys().copied().collect()
    }

    #[test]
    fn a_takeover_takes_the_copy_from_the_streams_first_and_leaves_it_empty() {
        let copy = WarmSubmissions::default();
        let generation = copy.generation();
        for seq in [3, 4, 5, 7] {
            assert!(copy.apply(generation, seq, decoded("t")));
        }
        // A redelivery changes nothing.
        assert!(copy.apply(generation, 4, decoded("again")));
        copy.prune_below(4);
        assert_eq!(copy.seen(), 7);
        let copied = copy.take(5);
        assert_eq!((seqs(&copied), copied.seen), (vec![5, 7], 7));
        // The follow begun before the takeover stops; a new one starts
        // over from the stream's start.
        assert!(!copy.apply(generation, 8, decoded("t")));
        assert_eq!(copy.seen(), 0);
        let copied = copy.take(0);
        assert_eq!((seqs(&copied), copied.seen), (vec![], 0));
    }

    #[test]
    fn a_copy_lent_ahead_goes_on_after_it_and_a_reset_starts_over() {
        let copy = WarmSubmissions::default();
        let generation = copy.generation();
        for seq in [3, 4, 5] {
            assert!(copy.apply(generation, seq, decoded("t")));
        }
        let lent = copy.lend(4).expect("whole");
        assert_eq!((seqs(&lent), lent.seen), (vec![4, 5], 5));
        // Holed: not lent again.
        assert!(copy.lend(0).is_none());
        // The follow goes on; a takeover leading with what was lent takes
        // what came after.
        assert!(copy.apply(generation, 6, decoded("t")));
        let copied = copy.take(6);
        assert_eq!((seqs(&copied), copied.seen), (vec![6], 6));
        // One not leading with it gets nothing: the stream is read.
        let generation = copy.generation();
        for seq in [1, 2] {
            assert!(copy.apply(generation, seq, decoded("t")));
        }
        copy.lend(0).expect("whole again after the take");
        assert!(copy.apply(generation, 3, decoded("t")));
        let copied = copy.take(1);
        assert_eq!((seqs(&copied), copied.seen), (vec![], 0));
        // Lent and dropped: reset, the follow starts over, whole.
        let generation = copy.generation();
        assert!(copy.apply(generation, 7, decoded("t")));
        copy.lend(0).expect("whole");
        copy.reset();
        assert!(!copy.apply(generation, 8, decoded("t")));
        assert_eq!(copy.seen(), 0);
        assert!(copy.lend(0).is_some());
    }

    /// The follow against a real nats-server: it copies the stream, and
    /// once the copy is reset (a successor prepared ahead was dropped) it
    /// starts over and catches up again with nothing new on the stream (it
    /// used to wait for the next message, and the standby stayed unready).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reset_copy_is_followed_again_from_the_start_of_an_idle_stream() {
        let nats = crate::test_nats::NatsServer::start();
        let client = async_nats::connect(&nats.url).await.unwrap();
        let js = jetstream::new(client.clone());
        let subjects = Subjects::new("cqws").unwrap();
        let stream = js
            .create_stream(stream::Config {
                name: subjects.submit_stream(),
                subjects: vec![subjects.submit_all()],
                ..Default::default()
            })
            .await
            .unwrap();
        for i in 0..3 {
            js.publish("cqws.submit.default", format!("t{i}").into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let guard = Guard::new(
            Arc::new(crate::auth::Authenticator::disabled()),
            subjects.clone(),
            crate::core::Millis(10_000),
        );
        let source = Source {
            client,
            stream,
            subjects,
            guard: Arc::new(guard),
        };
        let copy = WarmSubmissions::default();
        let (_paused, paused_rx) = watch::channel(false);
        let follow = tokio::spawn(follow(source, copy.clone(), paused_rx));
        assert!(copy.caught_up(3, Duration::from_secs(30)).await);
        copy.lend(0).expect("whole");
        copy.reset();
        assert_eq!(copy.seen(), 0);
        assert!(
            copy.caught_up(3, Duration::from_secs(30)).await,
            "the follow did not start over"
        );
        assert_eq!(seqs(&copy.take(0)), vec![1, 2, 3]);
        follow.abort();
    }

    #[tokio::test]
    async fn catching_up_waits_for_the_last_sequence_and_no_longer() {
        let copy = WarmSubmissions::default();
        let generation = copy.generation();
        copy.apply(generation, 1, decoded("t"));
        assert!(!copy.caught_up(2, Duration::from_millis(20)).await);
        assert!(copy.caught_up(1, Duration::ZERO).await);
        let later = copy.clone();
        tokio::spawn(async move { later.apply(generation, 2, decoded("t")) });
        assert!(copy.caught_up(2, Duration::from_secs(30)).await);
    }
}
