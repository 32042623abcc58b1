//! `GET /healthz` and `GET /readyz`: [`Health`] JSON, 200 or 503.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::ApiState;
use crate::api::{Api, Health};
use crate::core::ErrorCode;

/// The health routes, merged into [`super::router`].
pub(super) fn routes() -> Router<Arc<dyn Api>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
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
