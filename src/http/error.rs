//! Errors over HTTP: the one place where a stable code becomes a status
//! ([`status_of`], [`HttpError`]), and messages cut to
//! [`MAX_MESSAGE_CHARS`].

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::ApiError;
use crate::core::{ErrorCode, Rejection};
use crate::wire::WireError;

/// The HTTP status of a stable code; an unknown code is 500.
///
/// ```
/// use cronoq::core::ErrorCode;
/// use cronoq::http::status_of;
/// assert_eq!(status_of(&ErrorCode::NOT_FOUND).as_u16(), 404);
/// assert_eq!(status_of(&ErrorCode::FAILED_PRECONDITION).as_u16(), 409);
/// assert_eq!(status_of(&ErrorCode("NEWER_CODE".into())).as_u16(), 500);
/// ```
pub fn status_of(code: &ErrorCode) -> StatusCode {
    match code.as_str() {
        "INVALID_ARGUMENT" => StatusCode::BAD_REQUEST,
        "UNAUTHENTICATED" => StatusCode::UNAUTHORIZED,
        "PERMISSION_DENIED" => StatusCode::FORBIDDEN,
        "NOT_FOUND" => StatusCode::NOT_FOUND,
        "ALREADY_EXISTS" | "FAILED_PRECONDITION" => StatusCode::CONFLICT,
        "RESOURCE_EXHAUSTED" => StatusCode::TOO_MANY_REQUESTS,
        "UNAVAILABLE" => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error answered over HTTP: the one place where a code becomes a status.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl HttpError {
    pub(super) fn invalid(message: impl Into<String>) -> HttpError {
        HttpError(WireError::new(ErrorCode::INVALID_ARGUMENT, message))
    }
}

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> HttpError {
        HttpError(e)
    }
}

impl From<Rejection> for HttpError {
    fn from(r: Rejection) -> HttpError {
        HttpError(r.into())
    }
}

/// The longest message an HTTP error carries, in characters. Messages quote
/// the offending value (`deadline "…": …`); a value of a megabyte must not
/// come back whole.
pub const MAX_MESSAGE_CHARS: usize = 200;

/// `message`, cut to [`MAX_MESSAGE_CHARS`] characters with a note of how
/// long it was.
///
/// ```
/// let long = format!("deadline {:?}: bad", "x".repeat(100_000));
/// let short = cronoq::http::clamp_message(&long);
/// assert!(short.len() < 300 && short.starts_with("deadline \"xxx"));
/// assert_eq!(cronoq::http::clamp_message("short"), "short");
/// ```
pub fn clamp_message(message: &str) -> std::borrow::Cow<'_, str> {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => message.into(),
        Some((cut, _)) => format!(
            "{}… (message cut, {} bytes in all)",
            &message[..cut],
            message.len()
        )
        .into(),
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = status_of(&self.0.code);
        let body = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // Internal detail goes to the log, not to the caller.
            tracing::error!(code = %self.0.code, error = %clamp_message(&self.0.message), "request failed");
            WireError::new(self.0.code, "internal error; the server log has the detail")
        } else {
            let message = clamp_message(&self.0.message).into_owned();
            tracing::debug!(code = %self.0.code, error = %message, "request refused");
            WireError::new(self.0.code, message)
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"cronoq\""),
            );
        }
        response
    }
}
