//! Request parts every route reads the same way: a JSON object body
//! ([`JsonBody`]) and a task id in the path ([`IdPath`]); refusals are
//! `INVALID_ARGUMENT`.

use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::{serve, HttpError};
use crate::core::{ErrorCode, TaskId};

/// A JSON object body (its `Content-Type`, `application/json`, is checked
/// by [`origin::require_json`] before); refusals are `INVALID_ARGUMENT`.
pub(super) struct JsonBody<T>(pub(super) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let body = match Bytes::from_request(req, state).await {
            Ok(body) => body,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                // 413 rather than `status_of`'s 400: the status says which
                // limit it was; the code is the payload limit's.
                return Err(serve::refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::INVALID_ARGUMENT,
                    format!("reading the body: {}", e.body_text()),
                ));
            }
            Err(e) => {
                return Err(
                    HttpError::invalid(format!("reading the body: {}", e.body_text()))
                        .into_response(),
                )
            }
        };
        // A struct would also accept a JSON array of its fields in order.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(HttpError::invalid("the body must be a JSON object").into_response());
        }
        serde_json::from_slice(&body)
            .map(JsonBody)
            .map_err(|e| HttpError::invalid(format!("malformed JSON body: {e}")).into_response())
    }
}

/// The `{id}` of a path, as a [`TaskId`].
pub(super) struct IdPath(pub(super) TaskId);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let Path(text) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| HttpError::invalid(e.body_text()))?;
        Ok(IdPath(text.parse()?))
    }
}
