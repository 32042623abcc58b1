//! Connecting to NATS: retrying until the server answers, refusing at once a login NATS refuses.

use super::*;

/// Connects to NATS, retrying every second until it works or `give_up`.
///
/// `login` is read first: a bad credentials file or inbox prefix fails at
/// once (`INVALID_ARGUMENT`), and so does a login NATS refuses
/// (`UNAUTHENTICATED`: the credentials are wrong, waiting will not help).
/// Permission violations NATS reports later are logged as warnings.
pub async fn connect_nats(
    url: &str,
    name: &str,
    login: &crate::wire::NatsLogin,
    give_up: Option<Duration>,
) -> Result<async_nats::Client, Error> {
    let login = login.load()?;
    let connection = name.to_string();
    let started = tokio::time::Instant::now();
    let mut logged = false;
    loop {
        let connection = connection.clone();
        match login
            .options()
            .name(name)
            .max_reconnects(None)
            .event_callback(move |event| {
                let connection = connection.clone();
                async move {
                    if let async_nats::Event::Disconnected = event {
                        tracing::warn!(connection, "nats connection lost; reconnecting");
                    }
                    log_server_error(&event)
                }
            })
            .connect(wire::server_list(url))
            .await
        {
            Ok(client) => return Ok(client),
            Err(e) if e.kind() == async_nats::ConnectErrorKind::AuthorizationViolation => {
                return Err(Error::Refused(format!(
                    "connecting to {url}: NATS refused the login ({}): check nats_creds / \
                     --nats-creds against the nats-server's users",
                    if login.has_credentials() {
                        "wrong or unknown credentials"
                    } else {
                        "it requires credentials and none were given"
                    }
                )));
            }
            Err(e) => {
                if give_up.is_some_and(|g| started.elapsed() >= g) {
                    return Err(nats_err(format!("connecting to {url}"))(e));
                }
                if !logged {
                    tracing::warn!(url, error = %e, "cannot reach nats yet; retrying");
                    logged = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Logs what NATS reports as an error on a connection (a permission
/// violation: the nats-server's users do not allow a subject cronoq uses).
pub(crate) fn log_server_error(event: &async_nats::Event) {
    if let async_nats::Event::ServerError(e) = event {
        tracing::warn!(error = %e, "nats-server reported an error on this connection");
    }
}
