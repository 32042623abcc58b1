//! The worker's link to the leader: requests (registration over a challenge, signed calls, their errors), and outcome reports sent many per request.

use super::*;

/// Backoff between registration attempts and outcome report retries.
pub(super) const RETRY_INITIAL: Duration = Duration::from_millis(250);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(5);
/// Floors against a leader that sends zero spans.
pub(super) const MIN_HEARTBEAT: Duration = Duration::from_millis(50);
pub(super) const MIN_RENEW_PERIOD: Duration = Duration::from_millis(20);

/// Why a request got no usable answer.
#[derive(Clone, Debug)]
pub(super) enum CallError {
    /// No answer: timeout, no responders, connection trouble. Retry.
    Transport(String),
    /// The leader answered with an error.
    Remote(WireError),
    /// The answer could not be read.
    Malformed(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transport(e) => write!(f, "{e}"),
            CallError::Remote(e) => write!(f, "{e}"),
            CallError::Malformed(e) => write!(f, "unreadable reply: {e}"),
        }
    }
}

impl CallError {
    /// No answer, or the leader is not ready: asking again may work.
    pub(super) fn is_retryable(&self) -> bool {
        match self {
            CallError::Transport(_) => true,
            // UNAUTHENTICATED: the session is unknown to a new leader until
            // the next heartbeat registers again.
            CallError::Remote(e) => {
                e.code == ErrorCode::UNAVAILABLE || e.code == ErrorCode::UNAUTHENTICATED
            }
            CallError::Malformed(_) => false,
        }
    }

    /// The leader no longer knows the attempt (or knows a newer one).
    pub(super) fn is_stale(&self) -> bool {
        matches!(self, CallError::Remote(e) if crate::worker::rules::lease_lost(&e.code))
    }
}

/// What every request needs; shared by the loop and the attempt tasks.
pub(super) struct Link {
    pub(super) client: async_nats::Client,
    pub(super) subjects: Subjects,
    pub(super) worker_id: String,
    /// Tells this process apart from another one using the same worker id
    /// (the leader refuses the second with `ALREADY_EXISTS`).
    pub(super) instance: String,
    pub(super) request_timeout: Duration,
    /// The credential it registers with (auth on).
    pub(super) credential: Option<Credential>,
    /// The session the leader granted at the last registration.
    pub(super) session: std::sync::Mutex<Option<WorkerSession>>,
    /// A leader refused `outcomes` as unknown (an older version): report
    /// one outcome per request from then on.
    pub(super) singles: AtomicBool,
    pub(super) max_payload: crate::nats::MaxPayload,
    /// This worker's subjects, built once rather than per message.
    pub(super) own: OwnSubjects,
}

/// The subjects one worker uses per message, built once: what it hears
/// (compared with every message's subject) and the requests it sends per
/// attempt (cloned, a reference count, per request).
pub(super) struct OwnSubjects {
    pub(super) lease: String,
    pub(super) leases: String,
    pub(super) revoke: String,
    renew: async_nats::Subject,
    outcome: async_nats::Subject,
    outcomes: async_nats::Subject,
    heartbeat: async_nats::Subject,
}

impl OwnSubjects {
    pub(super) fn new(subjects: &Subjects, worker_id: &str) -> OwnSubjects {
        let api = |verb| async_nats::Subject::from(subjects.worker_api(worker_id, verb));
        OwnSubjects {
            lease: subjects.lease(worker_id),
            leases: subjects.leases(worker_id),
            revoke: subjects.revoke(worker_id),
            renew: api("renew"),
            outcome: api("outcome"),
            outcomes: api("outcomes"),
            heartbeat: api("heartbeat"),
        }
    }

    /// The subject of request `verb`: a kept one for the frequent verbs.
    fn api(&self, subjects: &Subjects, worker_id: &str, verb: &str) -> async_nats::Subject {
        match verb {
            "renew" => self.renew.clone(),
            "outcome" => self.outcome.clone(),
            "outcomes" => self.outcomes.clone(),
            "heartbeat" => self.heartbeat.clone(),
            _ => subjects.worker_api(worker_id, verb).into(),
        }
    }
}

/// A value that differs between processes and between runs of one.
pub(super) fn new_instance() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:016x}-{}", h.finish(), std::process::id())
}

impl Link {
    pub(super) fn session(&self) -> Option<WorkerSession> {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Registers once: with a credential, over a fresh challenge nonce,
    /// opening the session the reply grants.
    pub(super) async fn register_once(
        &self,
        register: &mut Register,
    ) -> Result<RegisterReply, CallError> {
        let Some(credential) = &self.credential else {
            register.xkey = None;
            return self
                .call("register", &*register, self.request_timeout)
                .await;
        };
        let challenge: ChallengeReply = self
            .send(
                self.subjects
                    .worker_api(&self.worker_id, "challenge")
                    .into(),
                async_nats::HeaderMap::new(),
                wire::encode(&Challenge::default()),
                self.request_timeout,
            )
            .await?;
        let keys = WorkerKeys::new();
        register.xkey = Some(keys.public_key());
        let subject = self.subjects.worker_api(&self.worker_id, "register");
        let body = wire::encode(&*register);
        let mut headers = async_nats::HeaderMap::new();
        credential.sign_message(&challenge.nonce, &subject, &mut headers, &body);
        let reply: RegisterReply = self
            .send(subject.into(), headers, body, self.request_timeout)
            .await?;
        let grant = reply.session.as_ref().ok_or_else(|| {
            CallError::Malformed(
                "the leader granted no session: it runs with auth off, so this worker's credential would not be checked (remove --token-env/--nkey-seed, or set [auth] required = true on the servers)".into(),
            )
        })?;
        let session = keys
            .open(&Grant {
                id: grant.id.clone(),
                sealed_key: grant.sealed_key.to_vec(),
                server_xkey: grant.server_xkey.clone(),
            })
            .map_err(CallError::Remote)?;
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(session);
        Ok(reply)
    }

    /// Whether a lease or revoke really comes from the leader: with a
    /// credential, it must carry this session's proof.
    pub(super) fn sent_by_leader(&self, message: &async_nats::Message) -> bool {
        if self.credential.is_none() {
            return true;
        }
        self.session().is_some_and(|s| {
            s.verify(
                message.subject.as_str(),
                message.headers.as_ref(),
                &message.payload,
                SystemTime::now(),
            )
        })
    }

    pub(super) async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        verb: &str,
        body: &Q,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let subject = self.own.api(&self.subjects, &self.worker_id, verb);
        let body = wire::encode(body);
        let mut headers = async_nats::HeaderMap::new();
        if let Some(session) = self.session() {
            session.sign(&subject, &mut headers, &body);
        }
        self.send(subject, headers, body, timeout).await
    }

    /// Sends a request as is; its decoded reply.
    pub(super) async fn send<A: DeserializeOwned>(
        &self,
        subject: async_nats::Subject,
        headers: async_nats::HeaderMap,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .headers(headers)
            .timeout(Some(timeout));
        let message = self
            .client
            .send_request(subject, request)
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        match wire::decode::<Reply<A>>(&message.payload) {
            Ok(Reply::Ok(a)) => Ok(a),
            Ok(Reply::Error(e)) => Err(CallError::Remote(e)),
            Err(e) => Err(CallError::Malformed(e.message)),
        }
    }
}

/// An outcome waiting to be reported, and who waits for the answer.
pub(super) type PendingReport = (
    AttemptReport,
    tokio::sync::oneshot::Sender<Result<(), CallError>>,
);

/// Report requests of one worker in flight at once.
pub(super) const REPORTS_IN_FLIGHT: usize = 4;

/// Sends outcomes to the leader, many per request: each request takes
/// every outcome queued since the last one left (up to
/// [`wire::MAX_REPORTS`] and half the NATS message limit), at most
/// [`REPORTS_IN_FLIGHT`] requests at a time — so a busy worker sends one
/// report and hears one reply for many attempts (a group commit on the
/// worker's side), and a quiet one reports each outcome at once. Each
/// attempt still retries its own outcome (see [`Attempt::report`]). Ends
/// when every sender is gone.
pub(super) async fn send_reports(
    link: Arc<Link>,
    mut queue: mpsc::UnboundedReceiver<PendingReport>,
) {
    // Polled here together rather than a tokio task per request.
    let mut under_way = futures_util::stream::FuturesUnordered::new();
    let mut carried: Option<PendingReport> = None;
    loop {
        if under_way.len() >= REPORTS_IN_FLIGHT {
            under_way.next().await;
            continue;
        }
        let first = match carried.take() {
            Some(first) => first,
            None => tokio::select! {
                Some(()) = under_way.next(), if !under_way.is_empty() => continue,
                first = queue.recv() => match first {
                    Some(first) => first,
                    None => break,
                },
            },
        };
        let limit = link.max_payload.get(&link.client) / 2;
        let mut size = report_size(&first.0);
        // What is queued goes in this batch (up to the cap): sized once
        // rather than grown report by report.
        let mut batch = Vec::with_capacity((queue.len() + 1).min(wire::MAX_REPORTS));
        batch.push(first);
        while batch.len() < wire::MAX_REPORTS {
            let Ok(next) = queue.try_recv() else { break };
            let more = report_size(&next.0);
            if limit > 0 && size + more > limit {
                carried = Some(next);
                break;
            }
            size += more;
            batch.push(next);
        }
        let link = link.clone();
        under_way.push(async move { report_batch(&link, batch).await });
    }
    // Every sender is gone: finish what is under way.
    while under_way.next().await.is_some() {}
}

/// Roughly what a report adds to a request.
pub(super) fn report_size(report: &AttemptReport) -> usize {
    let text = match &report.result {
        AttemptResult::Succeeded { output } => output.len(),
        AttemptResult::Failed { error, .. } => error.len(),
        AttemptResult::Cancelled => 0,
    };
    64 + report.worker_id.len() + text
}

/// One request for `batch`; each waiter hears its own answer.
pub(super) async fn report_batch(link: &Link, mut batch: Vec<PendingReport>) {
    if batch.len() == 1 {
        // One alone goes as `outcome`, understood by every leader.
        let Some((report, waiter)) = batch.pop() else {
            return;
        };
        let answer = link
            .call::<_, Ack>("outcome", &report, link.request_timeout)
            .await;
        let _ = waiter.send(answer.map(|_| ()));
        return;
    }
    let (reports, waiters): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    if link.singles.load(Ordering::Relaxed) {
        // Each goes as `outcome` once a leader did not know `outcomes`.
        let answers = futures_util::future::join_all(
            reports
                .iter()
                .map(|report| link.call::<_, Ack>("outcome", report, link.request_timeout)),
        )
        .await;
        for (waiter, answer) in waiters.into_iter().zip(answers) {
            let _ = waiter.send(answer.map(|_| ()));
        }
        return;
    }
    let request = AttemptReports {
        v: PROTOCOL_VERSION,
        worker_id: link.worker_id.clone(),
        reports,
    };
    let answers: Vec<Result<(), CallError>> = match link
        .call::<_, AttemptReportsReply>("outcomes", &request, link.request_timeout)
        .await
    {
        Ok(reply) if reply.refused.len() == waiters.len() => reply
            .refused
            .into_iter()
            .map(|refused| refused.map_or(Ok(()), |e| Err(CallError::Remote(e))))
            .collect(),
        Ok(reply) => {
            let e = CallError::Malformed(format!(
                "{} answers to {} reports",
                reply.refused.len(),
                waiters.len()
            ));
            vec![Err(e); waiters.len()]
        }
        // A leader older than `outcomes` does not know the verb: report
        // one by one (the attempts retry theirs at once).
        Err(CallError::Remote(e)) if e.code == ErrorCode::NOT_FOUND => {
            let e =
                CallError::Transport(format!("the leader does not take outcomes together: {e}"));
            link.singles.store(true, Ordering::Relaxed);
            vec![Err(e); waiters.len()]
        }
        Err(e) => vec![Err(e); waiters.len()],
    };
    for (waiter, answer) in waiters.into_iter().zip(answers) {
        let _ = waiter.send(answer);
    }
}

/// The next leader record, or never when not subscribed.
pub(super) async fn next_record(
    records: &mut Option<async_nats::Subscriber>,
) -> Option<async_nats::Message> {
    match records {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn connect(
    options: &WorkerOptions,
    login: &wire::LoadedLogin,
    worker_id: &str,
) -> Result<async_nats::Client, Error> {
    let build = |retry: bool| {
        let id = worker_id.to_string();
        let mut o = login
            .options()
            .name(format!("cronoq-worker {worker_id}"))
            .max_reconnects(None)
            .request_timeout(Some(options.request_timeout))
            .event_callback(move |event| {
                let id = id.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            tracing::info!(worker_id = %id, "connected to nats")
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!(worker_id = %id, "disconnected from nats")
                        }
                        // A refused login, a permission violation.
                        async_nats::Event::ServerError(e) => {
                            tracing::warn!(worker_id = %id, error = %e, "nats-server reported an error")
                        }
                        other => tracing::debug!(worker_id = %id, event = %other, "nats event"),
                    }
                }
            });
        if retry {
            o = o.retry_on_initial_connect();
        }
        o
    };
    let servers = wire::server_list(&options.url);
    // One plain attempt first: a login NATS refuses is final (the
    // credentials are wrong; waiting will not help), as for the server.
    // Anything else (NATS not up yet) is retried until it works.
    match build(false).connect(servers.clone()).await {
        Ok(client) => return Ok(client),
        Err(e) if e.kind() == async_nats::ConnectErrorKind::AuthorizationViolation => {
            return Err(Error::Refused(WireError::new(
                ErrorCode::UNAUTHENTICATED,
                format!(
                    "NATS at {} refused the login: check --nats-creds against the nats-server's users",
                    options.url
                ),
            )));
        }
        Err(e) => tracing::info!(worker_id, error = %e, "nats not reachable yet; retrying"),
    }
    build(true)
        .connect(servers)
        .await
        .map_err(|source| Error::Connect {
            url: options.url.clone(),
            source,
        })
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
