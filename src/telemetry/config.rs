//! Where telemetry is configured: the `[telemetry]` section of a server's
//! or worker's config file and the standard OpenTelemetry env vars, merged
//! into the [`ExportSettings`] the exporter runs with — or `None`: off.
//!
//! Pure: the env is handed in as a lookup, so the rules are unit tested
//! without touching the process's environment. **The env wins** over the
//! file, setting by setting (as cronoq's `CRONOQ_*` vars do, and as an
//! operator who injects `OTEL_*` into every pod expects); docs/choices.md.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[telemetry]`: the same settings as the standard env vars, which win.
/// Export is off unless an endpoint is set here or in the env.
///
/// ```
/// use cronoq::telemetry::TelemetryConfig;
/// let config: TelemetryConfig = toml::from_str(r#"
///     endpoint = "http://otel-collector:4318"
///     service_name = "cronoq-eu"
///     resource_attributes = { "deployment.environment" = "prod" }
/// "#).unwrap();
/// assert_eq!(config.endpoint.as_deref(), Some("http://otel-collector:4318"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP endpoint's base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`):
    /// spans go to `<endpoint>/v1/traces`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `http/protobuf` (the default) or `http/json`
    /// (`OTEL_EXPORTER_OTLP_PROTOCOL`). `grpc` is refused: point cronoq at
    /// the collector's HTTP port (4318).
    #[serde(default)]
    pub protocol: Option<String>,
    /// `service.name` (`OTEL_SERVICE_NAME`); default `cronoq-server`,
    /// `cronoq-worker` or `cronoq`.
    #[serde(default)]
    pub service_name: Option<String>,
    /// More resource attributes (`OTEL_RESOURCE_ATTRIBUTES`, whose keys
    /// win over these).
    #[serde(default)]
    pub resource_attributes: BTreeMap<String, String>,
    /// The most spans waiting to be exported (`OTEL_BSP_MAX_QUEUE_SIZE`;
    /// default 2048). A span that finds the queue full is dropped and
    /// counted (`cronoq_trace_spans_dropped_total`): exporting never makes
    /// scheduling wait.
    #[serde(default)]
    pub max_queue_size: Option<usize>,
}

/// How OTLP travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`.
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
}

/// What the exporter runs with, once something turned it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSettings {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub traces_endpoint: String,
    /// How OTLP travels.
    pub protocol: Protocol,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Resource attributes besides `service.name`, by key.
    pub resource_attributes: BTreeMap<String, String>,
    /// The most spans waiting for export.
    pub max_queue_size: usize,
    /// The most spans in one export request.
    pub max_export_batch_size: usize,
    /// How long a batch waits to fill before it is sent.
    pub schedule_delay: Duration,
    /// How long one export request may take.
    pub export_timeout: Duration,
}

/// A telemetry setting that cannot be used (the process refuses to start:
/// a typo should not silently turn tracing off).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct ConfigError(pub String);

const DEFAULT_QUEUE: usize = 2048;
const DEFAULT_BATCH: usize = 512;
const DEFAULT_DELAY: Duration = Duration::from_millis(5000);
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(10_000);
/// No queue beyond this: a span is a few hundred bytes, and the bound is
/// what keeps a dead collector from growing the process.
const MAX_QUEUE: usize = 1 << 20;

impl TelemetryConfig {
    /// The settings this section and the env give, `None` when neither
    /// names an endpoint (or `OTEL_SDK_DISABLED=true`,
    /// `OTEL_TRACES_EXPORTER=none`). `default_service` names the process
    /// when nothing else does.
    ///
    /// ```
    /// use cronoq::telemetry::TelemetryConfig;
    /// let none = |_: &str| None;
    /// assert_eq!(TelemetryConfig::default().resolve("cronoq", none).unwrap(), None);
    /// let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://c:4318/".to_string());
    /// let on = TelemetryConfig::default().resolve("cronoq", env).unwrap().unwrap();
    /// assert_eq!(on.traces_endpoint, "http://c:4318/v1/traces");
    /// ```
    pub fn resolve(
        &self,
        default_service: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ExportSettings>, ConfigError> {
        // An empty variable counts as unset (the spec's rule).
        let env = |key: &str| {
            env(key)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match env("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(ConfigError(format!(
                "OTEL_TRACES_EXPORTER={other}: cronoq exports traces over OTLP only (otlp or none)"
            )))
            }
        }
        let traces_endpoint = if let Some(url) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            url // the signal's own variable is the full URL
        } else if let Some(base) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
            traces_url(&base)
        } else if let Some(base) = self.endpoint.as_deref().filter(|b| !b.trim().is_empty()) {
            traces_url(base.trim())
        } else {
            return Ok(None);
        };
        check_url(&traces_endpoint)?;
        let protocol = match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .or_else(|| self.protocol.clone())
            .as_deref()
        {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("http/json") => Protocol::HttpJson,
            Some("grpc") => {
                return Err(ConfigError(
                    "protocol grpc is not supported: cronoq exports OTLP over HTTP \
                     (http/protobuf or http/json; the collector's HTTP port is 4318)"
                        .into(),
                ))
            }
            Some(other) => {
                return Err(ConfigError(format!(
                    "protocol {other:?}: want http/protobuf or http/json"
                )))
            }
        };
        let mut resource_attributes = self.resource_attributes.clone();
        if let Some(text) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for (key, value) in parse_resource_attributes(&text)? {
                resource_attributes.insert(key, value);
            }
        }
        let from_attributes = resource_attributes.remove("service.name");
        let service_name = env("OTEL_SERVICE_NAME")
            .or(from_attributes)
            .or_else(|| self.service_name.clone())
            .unwrap_or_else(|| default_service.to_string());
        let number = |key: &str| -> Result<Option<u64>, ConfigError> {
            env(key)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| ConfigError(format!("{key}={v}: not a whole number")))
                })
                .transpose()
        };
        let max_queue_size = match number("OTEL_BSP_MAX_QUEUE_SIZE")? {
            Some(n) => n as usize,
            None => self.max_queue_size.unwrap_or(DEFAULT_QUEUE),
        };
        if max_queue_size == 0 || max_queue_size > MAX_QUEUE {
            return Err(ConfigError(format!(
                "max_queue_size {max_queue_size}: want 1 to {MAX_QUEUE}"
            )));
        }
        let max_export_batch_size = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")?
            .map_or(DEFAULT_BATCH, |n| n as usize)
            .clamp(1, max_queue_size);
        let schedule_delay =
            number("OTEL_BSP_SCHEDULE_DELAY")?.map_or(DEFAULT_DELAY, Duration::from_millis);
        let export_timeout = number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")?
            .or(number("OTEL_EXPORTER_OTLP_TIMEOUT")?)
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
            .max(Duration::from_millis(1));
        Ok(Some(ExportSettings {
            traces_endpoint,
            protocol,
            service_name,
            resource_attributes,
            max_queue_size,
            max_export_batch_size,
            schedule_delay,
            export_timeout,
        }))
    }
}

/// `<base>/v1/traces`, as the spec builds it from the general endpoint.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

fn check_url(url: &str) -> Result<(), ConfigError> {
    let parsed: Result<hyper::Uri, _> = url.parse();
    match parsed {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {
            Ok(())
        }
        _ => Err(ConfigError(format!(
            "endpoint {}: want http://host:port or https://host:port",
            crate::core::excerpt(url)
        ))),
    }
}

/// `key=value,key=value` with percent-encoded values (W3C baggage octets).
fn parse_resource_attributes(text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(ConfigError(format!(
                "OTEL_RESOURCE_ATTRIBUTES: {} is not key=value",
                crate::core::excerpt(item)
            )));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(ConfigError(
                "OTEL_RESOURCE_ATTRIBUTES: an attribute has no key".into(),
            ));
        }
        out.push((key.to_string(), percent_decode(value.trim())));
    }
    Ok(out)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_configured_is_off() {
        let config = TelemetryConfig::default();
        assert_eq!(config.resolve("cronoq", env_of(&[])), Ok(None));
        // Settings without an endpoint do not turn it on.
        let env = env_of(&[
            ("OTEL_SERVICE_NAME", "x"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_RESOURCE_ATTRIBUTES", "a=b"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        ]);
        let named = TelemetryConfig {
            service_name: Some("y".into()),
            ..Default::default()
        };
        assert_eq!(named.resolve("cronoq", env), Ok(None));
    }

    #[test]
    fn the_env_wins_over_the_file_setting_by_setting() {
        let config = TelemetryConfig {
            endpoint: Some("http://file:4318".into()),
            protocol: Some("http/json".into()),
            service_name: Some("from-file".into()),
            resource_attributes: [("zone", "eu"), ("team", "infra")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            max_queue_size: Some(10),
        };
        let file_only = config.resolve("cronoq", env_of(&[])).unwrap().unwrap();
        assert_eq!(file_only.traces_endpoint, "http://file:4318/v1/traces");
        assert_eq!(file_only.protocol, Protocol::HttpJson);
        assert_eq!(file_only.service_name, "from-file");
        assert_eq!(file_only.max_queue_size, 10);
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://env:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "from-env"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "zone=us%2Deast, k8s.pod.name=p-1",
            ),
        ]);
        let both = config.resolve("cronoq", env).unwrap().unwrap();
        assert_eq!(both.traces_endpoint, "https://env:4318/v1/traces");
        assert_eq!(both.protocol, Protocol::HttpProtobuf);
        assert_eq!(both.service_name, "from-env");
        let attrs: Vec<_> = both
            .resource_attributes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(attrs, ["k8s.pod.name=p-1", "team=infra", "zone=us-east"]);
    }

    #[test]
    fn the_traces_endpoint_is_taken_as_it_is_and_service_name_falls_back() {
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9999/custom"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs"),
        ]);
        let s = TelemetryConfig::default()
            .resolve("cronoq-worker", env)
            .unwrap()
            .unwrap();
        assert_eq!(s.traces_endpoint, "http://c:9999/custom");
        assert_eq!(s.service_name, "from-attrs");
        assert!(!s.resource_attributes.contains_key("service.name"));
        let plain = env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]);
        let s = TelemetryConfig::default()
            .resolve("cronoq-worker", plain)
            .unwrap()
            .unwrap();
        assert_eq!(s.service_name, "cronoq-worker");
        assert_eq!(s.max_queue_size, DEFAULT_QUEUE);
    }

    #[test]
    fn disabling_and_refusals() {
        let on = "http://c:4318";
        let config = TelemetryConfig {
            endpoint: Some(on.into()),
            ..Default::default()
        };
        assert_eq!(
            config.resolve("c", env_of(&[("OTEL_SDK_DISABLED", "true")])),
            Ok(None)
        );
        assert_eq!(
            config.resolve("c", env_of(&[("OTEL_TRACES_EXPORTER", "none")])),
            Ok(None)
        );
        for env in [
            env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
            env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")]),
            env_of(&[("OTEL_TRACES_EXPORTER", "zipkin")]),
            env_of(&[("OTEL_RESOURCE_ATTRIBUTES", "novalue")]),
            env_of(&[("OTEL_BSP_MAX_QUEUE_SIZE", "0")]),
            env_of(&[("OTEL_BSP_SCHEDULE_DELAY", "soon")]),
            env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
        ] {
            assert!(config.resolve("c", env).is_err());
        }
    }
}
