//! The follower's side of the API: [`NodeApi`] serves HTTP on every server, asking the leader (locally or over NATS), and says whether this server is ready.

use super::*;
use crate::api::{
    BackfillRange, BackfillReport, CreateScheduleRequest, FireRecord, ScheduleEntry, ScheduleInfo,
};

/// The server's API whoever leads: the local leader while this server
/// leads, the leader over NATS while it follows.
#[derive(Clone)]
pub struct NodeApi {
    pub(super) inner: Arc<NodeInner>,
}

pub(super) struct NodeInner {
    pub(super) client: async_nats::Client,
    pub(super) leading: std::sync::RwLock<Option<LeaderApi>>,
    pub(super) remote: crate::client::Client,
    pub(super) seen: watch::Receiver<Option<election::Seen>>,
    /// The election timeout: a leader record that stands still for half of
    /// it means no server leads.
    pub(super) election_timeout: Duration,
    /// The JetStream streams cronoq needs that are missing (looked at every
    /// couple of seconds by [`watch_assets`]); `None`: all there.
    pub(super) missing: Arc<std::sync::RwLock<Option<String>>>,
    /// A standby's copies of the submit stream and the journal have caught
    /// up since it last stood by ([`watch_standby`]); always true with
    /// `warm_standby = false`.
    pub(super) standby_warm: Arc<AtomicBool>,
}

impl NodeApi {
    pub(super) fn set_leading(&self, api: Option<LeaderApi>) {
        *self
            .inner
            .leading
            .write()
            .unwrap_or_else(|e| e.into_inner()) = api;
    }

    pub(super) fn leader(&self) -> Option<LeaderApi> {
        self.inner
            .leading
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn health(&self) -> Health {
        let missing = self
            .inner
            .missing
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(missing) = missing {
            return Health {
                live: true,
                ready: false,
                detail: missing,
            };
        }
        if let Some(leader) = self.leader() {
            let mut health = leader.health();
            if health.ready {
                health.detail = format!("leader (epoch {})", leader.inner.epoch);
            }
            return health;
        }
        let connected = matches!(
            self.inner.client.connection_state(),
            async_nats::connection::State::Connected
        );
        let seen = self.inner.seen.borrow().clone();
        match (connected, seen) {
            (false, _) => Health {
                live: true,
                ready: false,
                detail: "not connected to NATS".into(),
            },
            (true, Some(seen)) => {
                let health = follower_health(&seen, self.inner.election_timeout);
                if health.ready && !self.inner.standby_warm.load(Ordering::Relaxed) {
                    // Not ready until it could take over quickly: a rolling
                    // restart that waits for readiness never leaves only
                    // a standby still copying what the leader holds.
                    return Health {
                        live: true,
                        ready: false,
                        detail: "standing by: its copies of the submit stream and the journal are \
                                 catching up"
                            .into(),
                    };
                }
                health
            }
            (true, None) => Health {
                live: true,
                ready: false,
                detail: "no leader known yet".into(),
            },
        }
    }
}

/// A follower is ready while a server leads: the leader record is one a
/// cronoq server wrote, not resigned, and moved within half the election
/// timeout (a leader renews every quarter of it).
pub(super) fn follower_health(seen: &election::Seen, election_timeout: Duration) -> Health {
    let o = &seen.observed;
    let unready = |detail: String| Health {
        live: true,
        ready: false,
        detail,
    };
    let Some(record) = &o.record else {
        return unready("no leader known yet".into());
    };
    if let Some(why) = o.not_genuine() {
        return unready(format!(
            "no leader: the leader record was not written by a cronoq server ({why})"
        ));
    }
    if record.resigned {
        return unready("no leader: the last one resigned".into());
    }
    // No figures or ids in a reason: it is a metric label too
    // (`cronoq_unready{reason}`), and whoever can publish on the leader
    // subject chooses the id.
    if seen.since.elapsed() >= election_timeout / 2 {
        return unready(
            "no leader: the leader record has not moved for half the election timeout".into(),
        );
    }
    Health {
        live: true,
        ready: true,
        detail: format!("follower of {} (epoch {})", record.id, o.epoch()),
    }
}

/// How many messages of `stream` a copy that has seen up to sequence
/// `seen` still lacks: none when the stream is empty (a journal whose
/// newest entry aged out has nothing left to copy), and none below its
/// first sequence (purged).
pub(super) fn copy_behind(stream: &stream::State, seen: u64) -> u64 {
    behind(
        stream.messages,
        stream.first_sequence,
        stream.last_sequence,
        seen,
    )
}

/// [`copy_behind`] of a stream holding `messages` from `first` to `last`.
fn behind(messages: u64, first: u64, last: u64, seen: u64) -> u64 {
    match messages {
        0 => 0,
        _ => last.saturating_sub(seen.max(first.saturating_sub(1))),
    }
}

/// Every half second while this process stands by, whether its copies
/// ([`warm::follow`], [`warm_submits::follow`]) have caught up with the
/// submit stream and the journal; `warm` is set once they have (and
/// logged), and cleared while this process leads (they start over when it
/// stands by again) or when the submissions' copy starts over while it
/// stands by. A follower is ready only once warm (`/readyz`).
pub(super) async fn watch_standby(
    js: jetstream::Context,
    submit_stream: stream::Stream,
    journal_stream: String,
    copies: (warm::WarmJournal, warm_submits::WarmSubmissions),
    mut leading: watch::Receiver<bool>,
    warm: Arc<AtomicBool>,
) {
    let (journal, submissions) = copies;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut since = std::time::Instant::now();
    let mut generation = submissions.generation();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // The copy started over (a successor prepared ahead was
                // dropped: `successor`): not warm until it catches up.
                if submissions.generation() != generation {
                    generation = submissions.generation();
                    if !*leading.borrow() && warm.swap(false, Ordering::Relaxed) {
                        tracing::info!("the submissions' copy started over: standby not warm");
                        since = std::time::Instant::now();
                    }
                }
            }
            changed = leading.changed() => {
                if changed.is_err() {
                    return;
                }
                warm.store(false, Ordering::Relaxed);
                since = std::time::Instant::now();
                continue;
            }
        }
        if *leading.borrow() || warm.load(Ordering::Relaxed) {
            continue;
        }
        let mut submit = submit_stream.clone();
        let (Ok(submit), Ok(mut journal_info)) =
            (submit.info().await, js.get_stream(&journal_stream).await)
        else {
            continue;
        };
        let Ok(journal_info) = journal_info.info().await else {
            continue;
        };
        let behind = copy_behind(&submit.state, submissions.seen())
            + copy_behind(&journal_info.state, journal.seen());
        if behind == 0 && !*leading.borrow() {
            let (live, finished, _) = journal.len();
            tracing::info!(
                elapsed_ms = since.elapsed().as_millis() as u64,
                submissions = submit.state.messages,
                live,
                finished,
                "standby warm: its copies of the submit stream and the journal caught up"
            );
            warm.store(true, Ordering::Relaxed);
        }
    }
}

/// Every couple of seconds, whether the JetStream streams cronoq needs
/// (the submit and dead-letter streams, the results bucket's stream)
/// exist; a missing one makes the server unready until it is back
/// (`/readyz` and the `cronoq_unready` metric name it). A stream NATS does
/// not answer about is not called missing.
pub(super) async fn watch_assets(
    js: jetstream::Context,
    names: Vec<(String, &'static str)>,
    missing: Arc<std::sync::RwLock<Option<String>>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let mut gone = Vec::new();
        for (name, what) in &names {
            if let Err(e) = js.get_stream(name).await {
                let text = e.to_string().to_ascii_lowercase();
                if text.contains("not found") || text.contains("10059") {
                    gone.push(format!("{what} {name}"));
                }
            }
        }
        let now = (!gone.is_empty()).then(|| format!("missing in JetStream: {}", gone.join(", ")));
        let mut slot = missing.write().unwrap_or_else(|e| e.into_inner());
        if *slot != now {
            match &now {
                Some(m) => tracing::error!(missing = %m, "a stream cronoq needs is missing"),
                None => tracing::info!("every stream cronoq needs is there again"),
            }
            *slot = now;
        }
    }
}

impl Api for NodeApi {
    /// Through the stream; answered once the leader has decided (a
    /// refusal only it can make, such as `max_pools`, is the answer), or
    /// after [`crate::client::CONFIRM_FOR`] as accepted.
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move {
            let id = match self.leader() {
                Some(l) => l.submit(task).await?,
                None => Api::submit(&self.inner.remote, task).await?,
            };
            crate::client::leaders_verdict(self, id).await?;
            Ok(id)
        })
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.task(id).await,
                None => Api::task(&self.inner.remote, id).await,
            }
        })
    }
    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.cancel(id).await,
                None => Api::cancel(&self.inner.remote, id).await,
            }
        })
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.snapshot().await,
                None => Api::snapshot(&self.inner.remote).await,
            }
        })
    }
    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.recent_tasks(limit).await,
                None => Api::recent_tasks(&self.inner.remote, limit).await,
            }
        })
    }
    /// Only the leading server counts (and exports counters): a follower
    /// answers with no pools, so `sum(rate(…))` over servers is right.
    fn metrics(&self) -> ApiFuture<'_, MetricsSnapshot> {
        Box::pin(async move {
            match self.leader() {
                Some(l) => l.metrics().await,
                None => Ok(MetricsSnapshot::default()),
            }
        })
    }
    fn health(&self) -> Health {
        NodeApi::health(self)
    }
    fn create_schedule(&self, spec: CreateScheduleRequest) -> ApiFuture<'_, ScheduleInfo> {
        to_leader!(self, create_schedule(spec))
    }
    fn list_schedules(&self) -> ApiFuture<'_, Vec<ScheduleEntry>> {
        to_leader!(self, list_schedules())
    }
    fn get_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        to_leader!(self, get_schedule(name))
    }
    fn pause_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        to_leader!(self, pause_schedule(name))
    }
    fn resume_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        to_leader!(self, resume_schedule(name))
    }
    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        to_leader!(self, delete_schedule(name))
    }
    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, FireRecord> {
        to_leader!(self, trigger_schedule(name))
    }
    fn backfill_schedule(
        &self,
        name: String,
        range: BackfillRange,
    ) -> ApiFuture<'_, BackfillReport> {
        to_leader!(self, backfill_schedule(name, range))
    }
}

/// A schedule call of a [`NodeApi`]: to the local leader while this
/// server leads, else to the leader over NATS.
macro_rules! to_leader {
    ($self:ident, $method:ident($($arg:expr),*)) => {
        Box::pin(async move {
            match $self.leader() {
                Some(l) => Api::$method(&l, $($arg),*).await,
                None => Api::$method(&$self.inner.remote, $($arg),*).await,
            }
        })
    };
}
use to_leader;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_behind_by_the_messages_it_has_not_seen_and_no_others() {
        // Seen up to 60 of 40..=100: 40 behind.
        assert_eq!(behind(61, 40, 100, 60), 40);
        assert_eq!(behind(61, 40, 100, 100), 0);
        // A copy that starts from scratch waits for what the stream still
        // holds, not for what was purged below its first sequence.
        assert_eq!(behind(61, 40, 100, 0), 61);
        // An empty stream (everything purged, or a journal whose newest
        // entry aged out): nothing to wait for, whatever was seen.
        assert_eq!(behind(0, 101, 100, 0), 0);
        assert_eq!(behind(0, 0, 0, 0), 0);
    }
}
