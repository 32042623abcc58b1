//! One attempt: runs the handler, renews its lease while it runs, and reports its outcome until the leader answers.

use super::*;

/// Completes once the stop level reaches at least [`StopLevel::Drain`].
pub(super) async fn stopped(stop: &mut watch::Receiver<StopLevel>) {
    if stop.wait_for(|l| *l >= StopLevel::Drain).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One attempt's task: run the handler, renew meanwhile, report.
pub(super) struct Attempt {
    pub(super) link: Arc<Link>,
    pub(super) handler: Handler,
    pub(super) shared: Arc<Shared>,
    pub(super) finished: mpsc::UnboundedSender<(AttemptKey, u64)>,
    pub(super) reports: mpsc::UnboundedSender<PendingReport>,
}

impl Attempt {
    /// Runs the attempt inside its span, `cronoq.worker.attempt`: a child
    /// of the lease's traceparent, exported when the process's subscriber
    /// has the telemetry layer (`cronoq worker` with telemetry on). The
    /// handler — a command's `TRACEPARENT` — sees this span as its parent
    /// then, the lease's traceparent otherwise.
    pub(super) async fn run(
        self,
        lease: Lease,
        registration: futures_util::future::AbortRegistration,
    ) {
        use tracing::Instrument as _;
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "cronoq.worker.attempt",
            cronoq.task_id = lease.task_id.0,
            cronoq.pool = %lease.pool,
            cronoq.group = %lease.group,
            cronoq.attempt = lease.attempt,
            cronoq.worker_id = %self.link.worker_id,
        );
        if let Some(parent) = lease.traceparent.as_deref() {
            crate::telemetry::set_parent(&span, parent);
        }
        let traceparent =
            crate::telemetry::traceparent_of(&span).or_else(|| lease.traceparent.clone());
        self.attempt(lease, registration, traceparent, &span)
            .instrument(span.clone())
            .await
    }

    async fn attempt(
        self,
        lease: Lease,
        registration: futures_util::future::AbortRegistration,
        traceparent: Option<String>,
        span: &tracing::Span,
    ) {
        let key = (lease.task_id, lease.attempt);
        let ctx = TaskContext {
            task_id: lease.task_id,
            attempt: lease.attempt,
            pool: lease.pool.clone(),
            group: lease.group.clone(),
            traceparent,
            schedule: lease.schedule.clone().zip(lease.scheduled_at),
        };
        let handler = self.handler.clone();
        let payload = lease.payload.clone();
        let gentle = self.shared.gentle.clone();
        let work = AssertUnwindSafe(
            crate::worker::command::GENTLE_STOP
                .scope(gentle, async move { handler(ctx, payload).await }),
        )
        .catch_unwind();
        let mut work = Box::pin(Abortable::new(work, registration));
        let ended = tokio::select! {
            ended = &mut work => Some(ended),
            () = self.renew_until_lost(&lease) => None,
        };
        // Dropping the handler's future now kills what it owns (a child
        // process) before the report goes out.
        drop(work);
        let result = match ended {
            None => None,
            Some(Ok(Ok(Ok(output)))) => Some(AttemptResult::Succeeded { output }),
            Some(Ok(Ok(Err(e)))) => Some(AttemptResult::Failed {
                error: e.message().to_string(),
                retryable: e.is_retryable(),
            }),
            Some(Ok(Err(panic))) => Some(AttemptResult::Failed {
                error: format!("handler panicked: {}", crate::task::panic_message(&*panic)),
                retryable: true,
            }),
            Some(Err(_aborted)) => {
                let reason = *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
                match reason {
                    Some(StopReason::Revoked) => Some(AttemptResult::Cancelled),
                    Some(StopReason::Shutdown) | None => None,
                }
            }
        };
        match &result {
            Some(AttemptResult::Failed { error, .. }) => {
                crate::telemetry::set_outcome(span, "failed", Some(error))
            }
            Some(other) => crate::telemetry::set_outcome(span, outcome_name(other), None),
            // Stopped without an outcome: the leader counts it lost.
            None => crate::telemetry::set_outcome(span, "lost", Some("stopped without an outcome")),
        }
        if let Some(AttemptResult::Failed { error, retryable }) = &result {
            tracing::warn!(
                worker_id = %self.link.worker_id,
                task_id = %lease.task_id,
                attempt = lease.attempt,
                retryable,
                error = %error,
                "attempt failed"
            );
        }
        self.shared.reporting.store(true, Ordering::Relaxed);
        if let Some(result) = result {
            // The lease is renewed until the leader has the outcome: a
            // report lost with a connection or a leader (retried after a
            // request timeout and a backoff of up to seconds) must not let
            // the lease expire, or the attempt counts lost and runs again.
            // A lease the leader calls gone ends the report too (it would
            // be stale).
            tokio::select! {
                () = self.report(&lease, result) => {}
                () = self.renew_until_lost(&lease) => {}
            }
        }
        let _ = self.finished.send((key, lease.epoch));
    }

    /// Renews every ttl/3; returns only once the leader says the lease is
    /// gone.
    pub(super) async fn renew_until_lost(&self, lease: &Lease) {
        let renew = Renew {
            v: PROTOCOL_VERSION,
            worker_id: self.link.worker_id.clone(),
            task_id: lease.task_id,
            attempt: lease.attempt,
            epoch: lease.epoch,
        };
        let mut ttl = lease.ttl;
        let mut next = Instant::now() + renew_period(ttl);
        loop {
            tokio::time::sleep_until(next).await;
            let timeout = self.link.request_timeout.min(renew_period(ttl));
            match self
                .link
                .call::<_, RenewReply>("renew", &renew, timeout)
                .await
            {
                Ok(reply) => {
                    ttl = reply.ttl;
                    next = Instant::now() + renew_period(ttl);
                }
                Err(e) if e.is_stale() => {
                    tracing::warn!(
                        worker_id = %self.link.worker_id,
                        task_id = %lease.task_id,
                        attempt = lease.attempt,
                        error = %e,
                        "lease lost, attempt stopped"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(
                        worker_id = %self.link.worker_id,
                        task_id = %lease.task_id,
                        attempt = lease.attempt,
                        error = %e,
                        "lease renewal failed"
                    );
                    next = Instant::now() + crate::worker::rules::renew_retry(ttl).to_duration();
                }
            }
        }
    }

    /// Reports the outcome until the leader acknowledges it or calls it
    /// stale.
    pub(super) async fn report(&self, lease: &Lease, mut result: AttemptResult) {
        if let AttemptResult::Succeeded { output } = &result {
            // An output NATS cannot carry would be retried forever.
            let limit = self.link.max_payload.get(&self.link.client);
            if limit > 0 && output.len() + 1024 > limit {
                result = AttemptResult::Failed {
                    error: format!(
                        "output of {} bytes is above the NATS message limit of {limit} bytes",
                        output.len()
                    ),
                    retryable: false,
                };
            }
        }
        let outcome = outcome_name(&result);
        let report = AttemptReport {
            v: PROTOCOL_VERSION,
            worker_id: self.link.worker_id.clone(),
            task_id: lease.task_id,
            attempt: lease.attempt,
            epoch: lease.epoch,
            result,
        };
        let mut backoff = RETRY_INITIAL;
        loop {
            let (answer, answered) = tokio::sync::oneshot::channel();
            let sent = match self.reports.send((report.clone(), answer)) {
                Ok(()) => answered
                    .await
                    .unwrap_or_else(|_| Err(CallError::Transport("the reporter stopped".into()))),
                Err(_) => Err(CallError::Transport("the reporter stopped".into())),
            };
            match sent {
                Ok(()) => {
                    tracing::info!(
                        worker_id = %self.link.worker_id,
                        task_id = %lease.task_id,
                        attempt = lease.attempt,
                        outcome,
                        "attempt finished"
                    );
                    return;
                }
                Err(e) if e.is_stale() => {
                    tracing::warn!(
                        worker_id = %self.link.worker_id,
                        task_id = %lease.task_id,
                        attempt = lease.attempt,
                        outcome,
                        error = %e,
                        "stale outcome dropped"
                    );
                    return;
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(
                        worker_id = %self.link.worker_id,
                        task_id = %lease.task_id,
                        attempt = lease.attempt,
                        error = %e,
                        retry_in_ms = backoff.as_millis() as u64,
                        "outcome report failed, retrying"
                    );
                }
                Err(e) => {
                    tracing::error!(
                        worker_id = %self.link.worker_id,
                        task_id = %lease.task_id,
                        attempt = lease.attempt,
                        outcome,
                        error = %e,
                        "outcome refused"
                    );
                    return;
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }
}

pub(super) fn renew_period(ttl: Millis) -> Duration {
    crate::worker::rules::renew_every(ttl)
        .to_duration()
        .max(MIN_RENEW_PERIOD)
}

pub(super) fn outcome_name(result: &AttemptResult) -> &'static str {
    match result {
        AttemptResult::Succeeded { .. } => "succeeded",
        AttemptResult::Failed { .. } => "failed",
        AttemptResult::Cancelled => "cancelled",
    }
}
