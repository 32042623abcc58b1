//! `GET /healthz` and `GET /readyz`: [`Health`] JSON, 200 or 503.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::openapi::Routes;
use super::ApiState;
use crate::api::Health;
use crate::core::ErrorCode;

/// The health routes, merged into [`super::router`].
pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/healthz", healthz, |op| {
            op.summary("Liveness: 200 when live, else 503")
                .response::<200, Json<Health>>()
                .response_with::<503, Json<Health>, _>(|r| {
                    r.description("not live: the Health fields and code UNAVAILABLE, message")
                })
        })
        .get("/readyz", readyz, |op| {
            op.summary("Readiness: 200 when ready, else 503")
                .response::<200, Json<Health>>()
                .response_with::<503, Json<Health>, _>(|r| {
                    r.description("not ready: the Health fields and code UNAVAILABLE, message")
                })
        })
}

fn health_response(ok: bool, health: Health) -> Response {
    if ok {
        return Json(health).into_response();
    }
    let mut body = serde_json::to_value(&health).unwrap_or_default();
    if let Some(map) = body.as_object_mut() {
        map.insert("code".into(), ErrorCode::UNAVAILABLE.as_str().into());
        map.insert("message".into(), health.detail.clone().into());
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn healthz(State(api): ApiState) -> Response {
    let health = api.health();
    health_response(health.live, health)
}

async fn readyz(State(api): ApiState) -> Response {
    let health = api.health();
    health_response(health.live && health.ready, health)
}
