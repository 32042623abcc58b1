//! The routes that read the snapshot: `GET /v1/snapshot` and
//! `GET /v1/autoscale` ([`autoscale_query`]).

use axum::http::Uri;
use axum::Json;

use super::openapi::{AutoscaleParams, Params, Routes};
use super::{Caller, HttpError};
use crate::core::{AutoscaleAnswer, Labels, PoolName, Rejection, Snapshot};

/// The snapshot routes, merged into [`super::router`].
pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/snapshot", snapshot, |op| {
            op.summary("Pools, groups, demand and workers")
        })
        .get("/v1/autoscale", autoscale, |op| {
            op.summary("The autoscaling figures of one fleet (KEDA metrics-api)")
        })
}

async fn snapshot(Caller(api): Caller) -> Result<Json<Snapshot>, HttpError> {
    Ok(Json(api.snapshot().await?))
}

/// The query of `GET /v1/autoscale`: `pool` (default `default`) and
/// `labels` (`k=v,k=v`, URL-encoded or not; empty or absent: the
/// unlabeled fleet). Any other parameter, a parameter given twice, a
/// malformed pool name or label set is `INVALID_ARGUMENT`.
///
/// ```
/// use cronoq::core::Labels;
/// let (pool, labels) = cronoq::http::autoscale_query(Some("pool=inference&labels=gpu=a100,zone=eu")).unwrap();
/// assert_eq!((pool.as_str(), labels), ("inference", Labels::from([("gpu", "a100"), ("zone", "eu")])));
/// assert!(cronoq::http::autoscale_query(Some("pool=inference&label=gpu=a100")).is_err());
/// assert!(cronoq::http::autoscale_query(Some("labels=gpu")).is_err());
/// ```
pub fn autoscale_query(query: Option<&str>) -> Result<(PoolName, Labels), Rejection> {
    let invalid = |m: String| Rejection::InvalidArgument(format!("autoscale query: {m}"));
    let uri: Uri = format!("/?{}", query.unwrap_or(""))
        .parse()
        .map_err(|e| invalid(format!("{e}")))?;
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map_err(|e| invalid(e.body_text()))?;
    let (mut pool, mut labels): (Option<String>, Option<String>) = (None, None);
    for (key, value) in pairs {
        let slot = match key.as_str() {
            "pool" => &mut pool,
            "labels" => &mut labels,
            other => {
                return Err(invalid(format!(
                    "unknown parameter {} (expected pool and labels)",
                    crate::core::excerpt(other)
                )))
            }
        };
        if slot.replace(value).is_some() {
            return Err(invalid(format!("{key} is given twice")));
        }
    }
    let pool = PoolName::new(pool.as_deref().unwrap_or(PoolName::DEFAULT))
        .map_err(|e| invalid(e.to_string()))?;
    // Any malformed label set is INVALID_ARGUMENT here, too many labels
    // included: no fleet can have them, the query is wrong.
    let labels = Labels::parse(labels.as_deref().unwrap_or(""))
        .map_err(|e| invalid(format!("labels: {e}")))?;
    Ok((pool, labels))
}

/// `GET /v1/autoscale?pool=P&labels=k=v,…`: the autoscaling figures of one
/// fleet ([`crate::core::answer`]), for KEDA's `metrics-api` scaler
/// (`valueLocation: desired`). Always 200 for a well-formed query: an
/// idle fleet, a fleet with no worker yet, an unknown pool or an
/// undeclared label set answer (`declared: false` for the last two,
/// desired 0).
async fn autoscale(
    Caller(api): Caller,
    query: Params<AutoscaleParams>,
) -> Result<Json<AutoscaleAnswer>, HttpError> {
    let (pool, labels) = autoscale_query(query.raw())?;
    let snapshot = api.snapshot().await?;
    Ok(Json(crate::core::answer(&snapshot, &pool, &labels)))
}
