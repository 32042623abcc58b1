//! One `cronoq server` process: [`serve`] connects, makes sure the JetStream objects exist (waiting for JetStream while it elects), serves HTTP, and stands by or leads, one leadership after another.

use super::*;

/// A running server's handles, for embedding (tests, `cronoq dev`).
pub struct Running {
    /// The API the HTTP routes serve.
    pub api: NodeApi,
    /// The HTTP address actually bound.
    pub http_addr: std::net::SocketAddr,
}

/// Runs the server until `shutdown` resolves.
pub async fn run(
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (ready_tx, _ready_rx) = oneshot::channel();
    serve(config, shutdown, ready_tx).await
}

/// Like [`run`], reporting the bound HTTP address once serving.
pub async fn serve(
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: oneshot::Sender<Running>,
) -> Result<(), Error> {
    config.check()?;
    let auth = Arc::new(config.authenticator().map_err(Error::Auth)?);
    let s = &config.server;
    let seal = config.seal().map_err(Error::Auth)?;
    if config.auth.required && s.nats_creds.is_none() {
        tracing::warn!(
            "[auth] required = true but this server connects to NATS without credentials ([server] nats_creds): \
             on a NATS without accounts and permissions anyone can read every payload, write to JetStream \
             and delete cronoq's streams; production needs deploy/nats/ (see SECURITY.md)"
        );
    }
    if config.auth.required && !seal.is_set() {
        tracing::warn!(
            "[auth] required = true but no [server] storage_key_env: what the leader stores is not sealed, \
             so anyone who can write to JetStream can forge results and leader records (see SECURITY.md)"
        );
    }
    let subjects = Subjects::new(&s.subject_prefix)?;
    let server_id = s.id.clone().unwrap_or_else(default_server_id);
    // Off (None) unless `[telemetry]` or the OTEL_* env names an endpoint.
    let telemetry = crate::telemetry::Telemetry::start(&config.telemetry, "cronoq-server")?;
    let pools = config
        .pools
        .iter()
        .map(PoolSection::to_core)
        .collect::<Result<Vec<_>, _>>()?;

    // One stop signal for start-up, the HTTP server and the election loop.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let login = s.nats_login();
    let client = connect_nats(
        &s.nats_url,
        &format!("cronoq-server {server_id}"),
        &login,
        None,
    )
    .await?;
    // A second connection for what anyone allowed to publish sends the
    // leader (submissions, worker and client requests): a message whose
    // headers async-nats cannot parse resets the connection that receives
    // it, and on this one that costs no journal acknowledgement and no
    // leadership renewal (tests/hostile.rs::a_header_value_…).
    let inbound = connect_nats(
        &s.nats_url,
        &format!("cronoq-server {server_id} inbound"),
        &login,
        None,
    )
    .await?;
    tracing::info!(url = %s.nats_url, server_id = %server_id, "connected to nats");
    let nats_max_payload = client.server_info().max_payload;
    let max_payload_bytes = effective_payload_limit(s.max_payload_bytes, nats_max_payload);
    if max_payload_bytes < s.max_payload_bytes {
        // Expected with the defaults (1 MiB both sides): say so quietly;
        // a configured limit NATS cannot carry deserves a warning.
        let configured = s.max_payload_bytes != ServerSection::default().max_payload_bytes;
        let message =
            "max_payload_bytes lowered to what fits in one NATS message with its envelope";
        if configured {
            tracing::warn!(
                configured = s.max_payload_bytes,
                nats_max_payload,
                limit = max_payload_bytes,
                "{message}"
            );
        } else {
            tracing::info!(nats_max_payload, limit = max_payload_bytes, "{message}");
        }
    }
    let js = jetstream::new(client.clone());
    let submit_config = stream::Config {
        name: subjects.submit_stream(),
        subjects: vec![subjects.submit_all()],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        // Headers and body together: JetStream refuses a larger publish.
        max_message_size: i32::try_from(nats_max_payload).unwrap_or(i32::MAX),
        num_replicas: s.replicas,
        ..Default::default()
    };
    // JetStream may not be ready yet (a cluster still electing its meta
    // leader, nats-server started without JetStream for now): every step
    // that needs it waits for it, as the connection waits for NATS.
    let Some(submit_stream) = until_jetstream("the submit stream", &stop_rx, || {
        ensure_stream(&js, submit_config.clone(), "the submit stream")
    })
    .await
    else {
        return Ok(());
    };
    let inbound_js = jetstream::new(inbound.clone());
    let Some(inbound_submit) = until_jetstream("the submit stream", &stop_rx, || async {
        inbound_js
            .get_stream(subjects.submit_stream())
            .await
            .map_err(nats_err("reading the submit stream"))
    })
    .await
    else {
        return Ok(());
    };
    let dead_letter_config = stream::Config {
        name: subjects.dead_letter_stream(),
        subjects: vec![subjects.dead_letter_all()],
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(7 * 24 * 3600),
        max_messages: 100_000,
        discard: stream::DiscardPolicy::Old,
        num_replicas: s.replicas,
        ..Default::default()
    };
    let Some(_) = until_jetstream("the dead-letter stream", &stop_rx, || {
        ensure_stream(&js, dead_letter_config.clone(), "the dead-letter stream")
    })
    .await
    else {
        return Ok(());
    };
    let Some(results) = until_jetstream("the results bucket", &stop_rx, || async {
        match js.get_key_value(subjects.results_bucket()).await {
            Ok(kv) => Ok(kv),
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: subjects.results_bucket(),
                    history: 1,
                    max_age: s.results_ttl,
                    storage: stream::StorageType::File,
                    num_replicas: s.replicas,
                    ..Default::default()
                })
                .await
                .map_err(nats_err("creating the results bucket")),
        }
    })
    .await
    else {
        return Ok(());
    };
    // The log: the leader's durable state, one entry per group commit.
    let log_names = crate::server::log_store::LogNames::new(&subjects, &s.log);
    let Some(log) = until_jetstream("the log", &stop_rx, || async {
        crate::server::log_store::LogStore::open(
            js.clone(),
            log_names.clone(),
            s.replicas,
            seal.clone(),
            nats_max_payload.saturating_sub(512),
        )
        .await
        .map_err(|e| Error::Nats {
            context: "creating the log".into(),
            source: e.to_string().into(),
        })
    })
    .await
    else {
        return Ok(());
    };
    if s.journal_batches.is_some() {
        tracing::warn!(
            "[server] journal_batches has no effect: the log appends one entry per group commit"
        );
    }

    let listener = tokio::net::TcpListener::bind(&s.http_addr)
        .await
        .map_err(|e| Error::Http {
            addr: s.http_addr.clone(),
            source: e,
        })?;
    let http_addr = listener.local_addr().map_err(|e| Error::Http {
        addr: s.http_addr.clone(),
        source: e,
    })?;
    let election = election::Election::new(
        js.clone(),
        &subjects,
        server_id.clone(),
        http_addr.to_string(),
        s.election_timeout,
    )
    .with_seal(seal.clone());
    // Also the HTTP API's client with credentials: it checks a payload
    // against the limit in force before publishing it.
    let remote = crate::client::ClientOptions::new()
        .prefix(subjects.prefix())
        .max_payload_bytes(max_payload_bytes)
        .nats_login(login)
        .connect(&s.nats_url)
        .await
        .map_err(nats_err("connecting the follower's client"))?;
    let (seen_tx, seen_rx) = watch::channel(None);
    let node = NodeApi {
        inner: Arc::new(NodeInner {
            client: client.clone(),
            leading: std::sync::RwLock::new(None),
            remote,
            seen: seen_rx,
            election_timeout: s.election_timeout,
            missing: Arc::default(),
            standby_warm: Arc::new(AtomicBool::new(!config.server.warm_standby)),
        }),
    };

    tracing::info!(addr = %http_addr, "http api listening");
    // With credentials required, the HTTP API calls the leader over NATS
    // as each caller (its Bearer token), so the leader alone enforces.
    let http_auth = config
        .auth
        .required
        .then(|| crate::http::HttpAuth::through(node.inner.remote.clone()));
    let router = crate::http::router_with_auth(Arc::new(node.clone()), http_auth);
    let _ = ready.send(Running {
        api: node.clone(),
        http_addr,
    });
    let limits = crate::http::HttpLimits {
        header_timeout: s.http_header_timeout,
        idle_timeout: s.http_idle_timeout,
        max_connections: s.http_max_connections,
        // Checked when the config was loaded.
        allowed_hosts: config.allowed_hosts().unwrap_or_default(),
        ..Default::default()
    };
    let http = tokio::spawn(crate::http::serve(
        listener,
        router,
        limits,
        stopped(stop_rx.clone()),
    ));

    let assets = tokio::spawn(watch_assets(
        js.clone(),
        vec![
            (subjects.submit_stream(), "the submit stream"),
            (subjects.dead_letter_stream(), "the dead-letter stream"),
            (
                format!("KV_{}", subjects.results_bucket()),
                "the results bucket's stream",
            ),
            (log_names.log_stream.clone(), "the log stream"),
        ],
        node.inner.missing.clone(),
    ));
    let (warm_paused, warm_paused_rx) = watch::channel(false);
    // The same for every server of this installation, and new when the
    // submit stream (and so its task ids) starts over.
    let trace_salt = crate::telemetry::TraceSalt::derive(&[
        subjects.prefix().as_bytes(),
        &submit_stream
            .cached_info()
            .created
            .unix_timestamp_nanos()
            .to_be_bytes(),
    ]);
    let base = Arc::new(Base {
        config: config.clone(),
        pools,
        server_id,
        subjects,
        client: client.clone(),
        js,
        submit_stream,
        inbound,
        inbound_submit,
        results,
        max_payload_bytes,
        nats_max_payload,
        log,
        takeovers: Arc::default(),
        auth,
        warm: warm::WarmJournal::sealed(seal.clone()),
        warm_paused,
        seal: seal.clone(),
        submissions: warm_submits::WarmSubmissions::default(),
        telemetry: telemetry.clone(),
        trace_salt,
    });
    // Standing by warm: the journal is followed from the start, so a
    // takeover reads it from memory.
    let follower = base.config.server.warm_standby.then(|| {
        tokio::spawn(warm::follow(
            base.log.clone(),
            base.submit_stream.clone(),
            base.warm.clone(),
            warm_paused_rx.clone(),
        ))
    });
    // And the submit stream, decoded, so a takeover need not read it.
    let submissions_follower = base.config.server.warm_standby.then(|| {
        let source = warm_submits::Source {
            client: base.inbound.clone(),
            stream: base.inbound_submit.clone(),
            subjects: base.subjects.clone(),
            guard: Arc::new(
                Guard::new(
                    base.auth.clone(),
                    base.subjects.clone(),
                    Millis::from_duration(s.worker_timeout),
                )
                .with_seal(base.seal.clone()),
            ),
        };
        tokio::spawn(warm_submits::follow(
            source,
            base.submissions.clone(),
            warm_paused_rx,
        ))
    });
    let standby = base.config.server.warm_standby.then(|| {
        tokio::spawn(watch_standby(
            base.js.clone(),
            base.submit_stream.clone(),
            base.log.names().log_stream.clone(),
            (base.warm.clone(), base.submissions.clone()),
            base.warm_paused.subscribe(),
            node.inner.standby_warm.clone(),
        ))
    });
    // And the successor's driver, built from those copies while the
    // leader record stands still (`successor`).
    let successor = successor::Successor::default();
    let preparing = base.config.server.warm_standby.then(|| {
        tokio::spawn(successor.clone().watch(
            base.clone(),
            seen_tx.subscribe(),
            election.instance().to_string(),
            s.election_timeout,
        ))
    });
    loop {
        tracing::info!("standing by");
        successor.reopen();
        let (epoch, sent) = tokio::select! {
            won = election.campaign(&seen_tx) => won,
            () = stopped(stop_rx.clone()) => break,
        };
        tracing::info!(epoch, "leading");
        let renewed = Arc::new(election::AtomicInstant::new(sent));
        let mut leadership = match lead(&base, epoch, &election, renewed, &successor).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(epoch, error = %e, "cannot start leading; standing by");
                base.warm_paused.send_replace(false);
                election.resign(epoch).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        node.set_leading(Some(leadership.api.clone()));
        let mut lost = leadership.lost.clone();
        let why = tokio::select! {
            why = &mut leadership.holding => {
                Some(why.unwrap_or_else(|e| format!("renewing stopped: {e}")))
            }
            why = lost.wait_for(|l| l.is_some()) => {
                Some(why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default())
            }
            _ = &mut leadership.driver => Some("the driver stopped".to_string()),
            () = stopped(stop_rx.clone()) => None,
        };
        let Some(why) = why else {
            node.set_leading(None);
            leadership.stop();
            election.resign(epoch).await;
            break;
        };
        tracing::warn!(epoch, why = %why, "lost leadership; standing by");
        node.set_leading(None);
        leadership.stop();
        base.warm_paused.send_replace(false);
        election.fence.store(0, Ordering::SeqCst);
    }
    for follower in [follower, submissions_follower, standby, preparing]
        .into_iter()
        .flatten()
    {
        follower.abort();
    }
    assets.abort();
    tracing::info!("shutting down");
    let result = match http.await {
        Ok(r) => r.map_err(|e| Error::Http {
            addr: http_addr.to_string(),
            source: e,
        }),
        Err(_) => Ok(()),
    };
    let _ = client.flush().await;
    if let Some(telemetry) = telemetry {
        telemetry.shutdown(Duration::from_secs(5)).await;
    }
    result
}

/// Runs a start-up step that needs JetStream until it succeeds, with a
/// warning saying what it waits for and backoff (250 ms doubling to 5 s);
/// `None` if the server is told to stop meanwhile. Every error is waited
/// out: while a JetStream cluster elects its meta leader it answers
/// timeouts, `UNAVAILABLE` and "insufficient resources" alike, and a
/// server that exited then would have to be restarted by hand.
pub(super) async fn until_jetstream<T, F, Fut>(
    what: &str,
    stop: &watch::Receiver<bool>,
    mut step: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut delay = Duration::from_millis(250);
    let mut tries = 0u32;
    loop {
        let result = tokio::select! {
            result = step() => result,
            () = stopped(stop.clone()) => return None,
        };
        match result {
            Ok(value) => {
                if tries > 0 {
                    tracing::info!(what, tries, "jetstream ready");
                }
                return Some(value);
            }
            Err(e) => {
                tries += 1;
                tracing::warn!(
                    what,
                    tries,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %e,
                    "waiting for jetstream"
                );
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(stop.clone()) => return None,
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Resolves once `stop` turns true.
pub(super) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// What every leadership of this process shares.
pub(super) struct Base {
    pub(super) config: ServerConfig,
    /// `config.pools`, checked and converted once.
    pub(super) pools: Vec<(PoolName, crate::core::PoolConfig)>,
    pub(super) server_id: String,
    pub(super) subjects: Subjects,
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) submit_stream: stream::Stream,
    /// The connection that receives what others publish to the leader
    /// (submissions, requests), apart from the journal's and the
    /// election's, and the submit stream as seen through it.
    pub(super) inbound: async_nats::Client,
    pub(super) inbound_submit: stream::Stream,
    pub(super) results: kv::Store,
    pub(super) max_payload_bytes: usize,
    pub(super) nats_max_payload: usize,
    /// The log this server's leaderships write.
    pub(super) log: crate::server::log_store::LogStore,
    /// Times this process took the lead.
    pub(super) takeovers: Arc<AtomicU64>,
    /// The credentials `[auth]` allows.
    pub(super) auth: Arc<Authenticator>,
    /// This process's warm copy of the journal.
    pub(super) warm: warm::WarmJournal,
    /// The servers' storage key.
    pub(super) seal: seal::Seal,
    /// True while this process leads: the copy is not followed
    /// ([`warm::follow`], [`warm_submits::follow`]).
    pub(super) warm_paused: watch::Sender<bool>,
    /// This process's copy of the submit stream, decoded.
    pub(super) submissions: warm_submits::WarmSubmissions,
    /// Where finished tasks' spans go (`None`: telemetry off).
    pub(super) telemetry: Option<crate::telemetry::Telemetry>,
    /// What tells this installation's spans apart (`telemetry::trace`).
    pub(super) trace_salt: crate::telemetry::TraceSalt,
}

/// Gets or creates a stream, then brings an existing one's limits up to
/// `config` (a `max_message_size` set by an older build, say).
pub(super) async fn ensure_stream(
    js: &jetstream::Context,
    config: stream::Config,
    what: &str,
) -> Result<stream::Stream, Error> {
    let mut stream = js
        .get_or_create_stream(config.clone())
        .await
        .map_err(nats_err(format!("creating {what}")))?;
    let current = stream
        .info()
        .await
        .map_err(nats_err(format!("reading {what}")))?
        .config
        .clone();
    if current.max_message_size != config.max_message_size
        || current.max_age != config.max_age
        || current.max_messages != config.max_messages
    {
        let updated = stream::Config {
            max_message_size: config.max_message_size,
            max_age: config.max_age,
            max_messages: config.max_messages,
            ..current
        };
        if let Err(e) = js.update_stream(updated).await {
            tracing::warn!(stream = %config.name, error = %e, "cannot update the stream's limits");
        }
    }
    Ok(stream)
}
