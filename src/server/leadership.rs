//! One leadership's lifetime: [`lead`] starts the driver, the request loop, the submit consumer, the committer and the purger for an epoch, and its [`Tenure`] says until when it may act.

use super::*;

/// One leadership's tasks.
pub(super) struct Leadership {
    pub(super) api: LeaderApi,
    pub(super) driver: tokio::task::JoinHandle<()>,
    /// Renewing the leadership ([`election::Election::hold`]): ends with
    /// why it was lost.
    pub(super) holding: tokio::task::JoinHandle<String>,
    pub(super) others: Vec<tokio::task::JoinHandle<()>>,
    /// Set when a fenced write is refused: a successor took over.
    pub(super) lost: watch::Receiver<Option<String>>,
}

impl Leadership {
    pub(super) fn stop(self) {
        self.holding.abort();
        self.driver.abort();
        for task in self.others {
            task.abort();
        }
    }
}

/// Starts leading with `epoch`: a fresh driver (or the one `successor`
/// prepared while the leader was silent, if nothing it read changed) reads the submit
/// stream from its first message, answers `P.api.*`, and writes results
/// fenced on the leader subject.
pub(super) async fn lead(
    base: &Base,
    epoch: u64,
    election: &election::Election,
    renewed: Arc<election::AtomicInstant>,
    successor: &successor::Successor,
) -> Result<Leadership, Error> {
    let s = &base.config.server;
    // The bucket keeps the max age it was created with (or the last
    // leader's): this leader's `results_ttl` governs, and its rewrites of
    // live records keep pace with the max age the bucket has.
    let results_max_age = journal::results_max_age(
        &base.js,
        &format!("KV_{}", base.subjects.results_bucket()),
        s.results_ttl,
    )
    .await;
    let now = wall_now();
    base.takeovers.fetch_add(1, Ordering::Relaxed);
    let journal_pending = Arc::new(AtomicU64::new(0));
    let journal_waiting_since = Arc::new(AtomicU64::new(0));
    let worker_timeout = Millis::from_duration(s.worker_timeout);
    let (inputs, input_rx) = mpsc::channel(65_536);
    let (commit_tx, commit_rx) = mpsc::unbounded_channel::<Turn>();
    let pending: Pending = Arc::default();
    let (floor_tx, floor_rx) = watch::channel(1u64);
    let (lost_tx, lost_rx) = watch::channel(None);
    let guard = Arc::new(
        Guard::new(base.auth.clone(), base.subjects.clone(), worker_timeout)
            .with_seal(base.seal.clone()),
    );
    let api = LeaderApi {
        inner: Arc::new(LeaderInner {
            client: base.client.clone(),
            js: base.js.clone(),
            subjects: base.subjects.clone(),
            inputs: inputs.clone(),
            results: base.results.clone(),
            stream_name: base.subjects.submit_stream(),
            max_payload_bytes: base.max_payload_bytes,
            driver_alive: AtomicBool::new(true),
            driver_beat: AtomicU64::new(now.0),
            consumed_below: AtomicU64::new(0),
            consumer_beat: AtomicU64::new(now.0),
            allow_undeclared_pools: s.allow_undeclared_pools,
            declared_pools: base.pools.iter().map(|(name, _)| name.clone()).collect(),
            epoch,
            takeovers: base.takeovers.clone(),
            journal_pending: journal_pending.clone(),
            journal_waiting_since: journal_waiting_since.clone(),
            guard: guard.clone(),
            seal: base.seal.clone(),
            replies: Replies::default(),
        }),
    };
    // Subscribed before the first renewal announces this leadership, so a
    // worker that heartbeats on seeing it finds someone answering. The
    // renewal goes out on the other connection: the flush waits until
    // nats-server has taken the subscriptions.
    let mut requests = futures_util::stream::SelectAll::new();
    for subject in [base.subjects.api("*"), base.subjects.worker_api_all()] {
        requests.push(
            base.inbound
                .subscribe(subject.clone())
                .await
                .map_err(nats_err(format!("subscribing to {subject}")))?,
        );
    }
    base.inbound
        .flush()
        .await
        .map_err(nats_err("subscribing to the leader's requests"))?;
    let tenure = Tenure {
        renewed,
        timeout: election.timeout(),
    };
    let api_requests = AbortOnDrop::spawn(serve_api(
        base.client.clone(),
        api.clone(),
        requests,
        tenure.clone(),
    ));
    // Renewing from here on: what follows (waiting for a successor
    // prepared ahead, reading back) may take longer than the right to act
    // lasts without a renewal. Requests that come meanwhile wait in the
    // driver's channel.
    let holding = AbortOnDrop::spawn({
        let (election, renewed) = (election.clone(), tenure.renewed.clone());
        async move { election.hold(epoch, &renewed).await }
    });
    let prepared = successor.claim(base).await;
    let startup = base
        .submit_stream
        .clone()
        .info()
        .await
        .map_err(nats_err("reading the submit stream"))?
        .state
        .clone();
    let startup_last = startup.last_sequence;
    // The log to its end, then this leadership's takeover entry after it
    // (fenced: every later append of the deposed leader is refused).
    let warm = warm_journal(base).await;
    base.warm_paused.send_replace(true);
    let (appender, journal_before) = base
        .warm
        .take_over(&base.log, epoch, &base.server_id)
        .await
        .map_err(|e| Error::Nats {
            context: "taking over the log".into(),
            source: e.to_string().into(),
        })?;
    // A successor prepared while the leader was silent, if nothing it
    // read changed since (`successor`).
    let prepared = prepared.and_then(|p| {
        let why = match warm {
            false => Some("the warm journal is behind"),
            true => {
                let found = successor::Basis {
                    submit_first: startup.first_sequence,
                    submit_last: startup_last,
                    journal_records: journal_before,
                    max_age: results_max_age,
                };
                successor::unusable(&p.basis, &found)
            }
        };
        match why {
            None => Some(p),
            Some(why) => {
                tracing::info!(why, "the prepared successor is not used");
                drop_later(p);
                None
            }
        }
    });
    // Submissions left by earlier leaderships: read them (and their journal
    // records) before serving workers, who list their attempts once. A
    // prepared driver is reading them already.
    let catch_up_to = (startup.messages > 0 || prepared.is_some()).then_some(startup_last);
    let (driver, handed) = match prepared {
        Some(p) => {
            tracing::info!(
                held = p.held,
                handed = p.handed,
                ready_ms_ago = p.ready.elapsed().as_millis() as u64,
                "leading with the successor prepared while the leader was silent"
            );
            let mut driver = p.driver;
            driver.set_epoch(epoch);
            (driver, Some(p.handed))
        }
        None => {
            let mut driver = new_driver(base, epoch, results_max_age, now);
            if catch_up_to.is_some() {
                driver.catch_up_first(usize::try_from(startup.messages).unwrap_or(usize::MAX));
            }
            // The schedules: they step once the journal is read.
            driver.restore_schedules(base.warm.schedules());
            (driver, None)
        }
    };
    // The standby's copy of the submit stream: taken (and so emptied)
    // whatever follows, used with a warm journal only (it holds no
    // records), as far as it got within a short wait — after what a
    // prepared driver was handed.
    let copied = match catch_up_to {
        Some(upto) if warm => {
            let whole = base
                .submissions
                .caught_up(upto, warm_submits::CATCH_UP_WAIT)
                .await;
            let from = handed.map_or(startup.first_sequence, |h| h + 1);
            let mut copied = base.submissions.take(from);
            copied.seen = copied.seen.max(handed.unwrap_or(0));
            tracing::info!(
                upto,
                seen = copied.seen,
                held = copied.submissions.len(),
                whole,
                "taking submissions from the standby's copy"
            );
            Some(copied)
        }
        _ => {
            base.submissions.take(u64::MAX);
            None
        }
    };
    let consumer = tokio::spawn(consume(
        base.inbound.clone(),
        base.inbound_submit.clone(),
        base.subjects.clone(),
        base.results.clone(),
        Startup {
            last: startup_last,
            warm: Some(base.warm.clone()),
            batched: Arc::default(),
            catch_up_to,
            copied,
            keys_bound: handed.is_some(),
        },
        inputs.clone(),
        api.clone(),
    ));
    let committer = tokio::spawn(commit(
        commit_rx,
        CommitCtx {
            client: client_for(&api),
            inputs: inputs.clone(),
            pending: pending.clone(),
            js: base.js.clone(),
            submit_stream: base.submit_stream.clone(),
            subjects: base.subjects.clone(),
            guard,
            seal: base.seal.clone(),
            tenure: tenure.clone(),
            replies: api.inner.replies.clone(),
            waiting_since: journal_waiting_since,
            pending_records: journal_pending,
            lost: lost_tx,
            log: base.log.clone(),
            journal: base.warm.clone(),
            results_prefix: format!("$KV.{}.", base.subjects.results_bucket()),
            snapshot_every: journal::SnapshotEvery {
                entries: s.snapshot_entries,
                interval: s.snapshot_interval,
            },
            telemetry: base.telemetry.clone(),
        },
        appender,
    ));
    let purger = tokio::spawn(purge(base.submit_stream.clone(), floor_rx, pending.clone()));
    let driver = {
        let api = api.clone();
        tokio::spawn(async move {
            drive(
                driver,
                input_rx,
                commit_tx,
                pending,
                floor_tx,
                &api.inner.driver_beat,
                &api.inner.consumed_below,
                tenure,
            )
            .await;
            api.inner.driver_alive.store(false, Ordering::Relaxed);
            api.inner.replies.close();
        })
    };
    Ok(Leadership {
        api,
        driver,
        holding: holding.defuse(),
        others: vec![consumer, api_requests.defuse(), committer, purger],
        lost: lost_rx,
    })
}

/// A fresh driver for leadership `epoch` (0: not known yet, a successor
/// prepared ahead, [`super::successor`]), with the results bucket's max
/// age `results_max_age`, at `now`.
pub(super) fn new_driver(
    base: &Base,
    epoch: u64,
    _results_max_age: Duration,
    now: Millis,
) -> Driver {
    let s = &base.config.server;
    let worker_timeout = Millis::from_duration(s.worker_timeout);
    Driver::new(
        base.subjects.clone(),
        epoch,
        Settings {
            server_id: base.server_id.clone(),
            lease_ttl: Millis::from_duration(s.lease_ttl),
            worker_timeout,
            heartbeat_interval: Millis((worker_timeout.0 / 3).max(100)),
            max_payload_bytes: base.max_payload_bytes,
            max_reply_bytes: base.nats_max_payload.saturating_sub(1024),
            // The fence headers take about 150 bytes of the message.
            max_record_bytes: base.nats_max_payload.saturating_sub(512),
            retain_finished: 10_000,
            pools: base.pools.clone(),
            max_workers: s.max_workers,
            limits: s.limits(),
            // A re-attaching worker registers within a heartbeat of seeing
            // the new leader; one silent this long is gone anyway.
            reattach_grace: worker_timeout,
            events: s.events,
            max_schedules: s.max_schedules,
            schedules_refused: (base.auth.required() && !base.seal.is_set()).then(|| {
                "schedules need [server] storage_key_env when credentials are required: \
                 the leader seals the fires it publishes with the storage key"
                    .to_string()
            }),
            auth: base.auth.clone(),
            trace: base.telemetry.as_ref().map(|_| base.trace_salt),
        },
        now,
    )
}

/// A task that is aborted when dropped, unless [`AbortOnDrop::defuse`]d:
/// one a leadership started before a later step of its start failed.
struct AbortOnDrop<T>(Option<tokio::task::JoinHandle<T>>);

impl<T: Send + 'static> AbortOnDrop<T> {
    fn spawn(task: impl std::future::Future<Output = T> + Send + 'static) -> AbortOnDrop<T> {
        AbortOnDrop(Some(tokio::spawn(task)))
    }

    fn defuse(mut self) -> tokio::task::JoinHandle<T> {
        self.0.take().expect("defused once")
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// The leadership's right to act ([`election::may_act`]): until the
/// election timeout (less a margin) after its last stored renewal was sent
/// (a follower takes over only after seeing no renewal for that long on
/// its own clock). Judged on the monotonic clock when it is about to act:
/// at the top of every driver turn and before every input, before the
/// committer announces a turn, and before a request is answered.
#[derive(Clone)]
pub(super) struct Tenure {
    pub(super) renewed: Arc<election::AtomicInstant>,
    pub(super) timeout: Duration,
}

impl Tenure {
    pub(super) fn valid(&self) -> bool {
        self.renewed.may_act(self.timeout)
    }

    /// Returns once the leadership may act. While it may not (its last
    /// stored renewal is older than the election timeout allows), the
    /// driver acts on nothing: it waits. Either a renewal is stored again
    /// — a compare-and-set on the leader record, so nobody else led
    /// meanwhile — and the driver goes on, forgiving the pause
    /// ([`Driver::forgive_pause`]); or the renewal loop finds another
    /// server leading, and the leadership is stopped (this task with it).
    pub(super) async fn wait(&self, driver: &mut Driver) {
        if self.valid() {
            return;
        }
        let paused = std::time::Instant::now();
        tracing::warn!(
            "leadership not renewed in time: acting on nothing until a renewal is stored"
        );
        while !self.valid() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(
            paused_ms = paused.elapsed().as_millis() as u64,
            "leadership renewed again: going on"
        );
        driver.forgive_pause(wall_now());
    }

    /// [`Tenure::valid`], waited for (a turn's announcements wait while
    /// the leadership may not act).
    pub(super) async fn wait_valid(&self) {
        while !self.valid() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

pub(super) fn client_for(api: &LeaderApi) -> async_nats::Client {
    api.inner.client.clone()
}
