//! The OpenAPI 3.1 document of the HTTP API, generated (by `aide`) from
//! the handlers themselves: their extractors say the parameters and the
//! body ([`super::extract`]'s `JsonBody`, `IdPath`, [`Params`]), their
//! return types say the answers (`Json<T>` through `T`'s
//! `schemars::JsonSchema`, the same impls that write `proto-schemas/`),
//! and every [`HttpError`] is the one [`ErrorBody`] schema whose `code`
//! is an enum of [`ErrorCode::ALL`].
//!
//! **One list serves and documents.** A file of routes builds a
//! [`Routes`], whose only way to add a route is [`Routes::get`] /
//! [`Routes::post`] / [`Routes::delete`]: each records `(method, path)`,
//! adds the route to the document and to the router in one call. So a new
//! route is one line next to the others (`.get("/v1/tasks/{id}/output",
//! output, |op| op.summary("…"))`), and cannot be served undocumented.
//! [`served_routes`] is that list; `tests/openapi.rs` checks it against
//! the document and drives every route through the real router.
//!
//! The document is served at `GET /v1/openapi.json` by every router
//! (embedded, leader, follower; open like `/healthz`: it describes, it
//! carries no data) and checked in as `proto-schemas/openapi.yaml` by the
//! generator of `proto-schemas/` (`tests/proto_gen`).

use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};

use aide::axum::ApiRouter;
use aide::generate::GenContext;
use aide::openapi::{Info, MediaType, OpenApi, Operation, Response, SchemaObject, StatusCode};
use aide::operation::{OperationHandler, OperationInput, OperationOutput};
use aide::transform::TransformOperation;
use axum::extract::FromRequestParts;
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{header, Method};
use axum::response::IntoResponse;
use axum::Router;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

use super::extract::{IdPath, JsonBody};
use super::{Caller, HttpError};
use crate::api::Api;
use crate::core::{ErrorCode, TaskId};

/// What a file of routes builds: the routes, documented as they are added.
pub(super) struct Routes {
    api: ApiRouter<Arc<dyn Api>>,
    served: Served,
}

/// `(method, path)` of routes, in the order they were added.
type Served = Vec<(Method, &'static str)>;

/// How a route is described beyond its types (a summary, other answers).
type Docs = fn(TransformOperation<'_>) -> TransformOperation<'_>;

macro_rules! route_method {
    ($name:ident, $with:ident, $method:ident) => {
        #[doc = concat!("Serves and documents `", stringify!($method), " path` by `handler`.")]
        pub(super) fn $name<H, I, O, T>(self, path: &'static str, handler: H, docs: Docs) -> Self
        where
            H: Handler<T, Arc<dyn Api>> + OperationHandler<I, O>,
            I: OperationInput,
            O: OperationOutput,
            T: 'static,
        {
            self.add(
                Method::$method,
                path,
                aide::axum::routing::$with(handler, docs),
            )
        }
    };
}

impl Routes {
    pub(super) fn new() -> Routes {
        Routes {
            api: ApiRouter::new(),
            served: Vec::new(),
        }
    }

    route_method!(get, get_with, GET);
    route_method!(post, post_with, POST);
    route_method!(delete, delete_with, DELETE);

    fn add(
        mut self,
        method: Method,
        path: &'static str,
        route: aide::axum::routing::ApiMethodRouter<Arc<dyn Api>>,
    ) -> Routes {
        self.served.push((method, path));
        self.api = self.api.api_route(path, route);
        self
    }

    /// Both sets of routes.
    pub(super) fn merge(mut self, other: Routes) -> Routes {
        self.served.extend(other.served);
        self.api = self.api.merge(other.api);
        self
    }

    /// The router and its document.
    fn finish(self) -> (Router<Arc<dyn Api>>, OpenApi, Served) {
        let mut doc = OpenApi {
            info: Info {
                title: "cronoq".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                description: Some(DESCRIPTION.into()),
                ..Info::default()
            },
            ..OpenApi::default()
        };
        doc.components
            .get_or_insert_with(Default::default)
            .security_schemes
            .insert(
                BEARER.into(),
                aide::openapi::ReferenceOr::Item(aide::openapi::SecurityScheme::Http {
                    scheme: "bearer".into(),
                    bearer_format: Some("cronoq token credential".into()),
                    description: Some(
                        "A cronoq token credential; required by a server with \
                         `[auth] required = true`, ignored otherwise."
                            .into(),
                    ),
                    extensions: Default::default(),
                }),
            );
        let router = self.api.finish_api(&mut doc);
        (router, doc, self.served)
    }
}

const DESCRIPTION: &str = "The HTTP API of cronoq, a label-aware task scheduler. \
Every error answer is an ErrorBody {\"code\", \"message\"}; the status follows the code \
(INVALID_ARGUMENT 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, \
ALREADY_EXISTS and FAILED_PRECONDITION 409, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, \
INTERNAL 500). With `[auth] required = true`, every /v1 call but this document takes \
`Authorization: Bearer <token>`. Instants are milliseconds since the Unix epoch. \
Generated from the handlers by aide; do not edit.";

/// Every route of the router, as one list: the router's routes are these
/// and no others (see the module docs).
pub(super) fn all() -> Routes {
    // One file per group of routes: a new group is a file with its
    // `routes()`, merged here.
    Routes::new()
        .merge(super::tasks::routes())
        .merge(super::snapshot::routes())
        .merge(super::metrics::routes())
        .merge(super::health::routes())
        .merge(super::dashboard::routes())
        .merge(super::schedules::routes())
        .get("/v1/openapi.json", openapi_json, |op| {
            op.summary("This document (OpenAPI 3.1)")
                .response::<200, axum::Json<serde_json::Value>>()
        })
}

/// The routes of [`super::router_with_auth`], before its layers.
pub(super) fn router() -> Router<Arc<dyn Api>> {
    all().finish().0
}

/// The `(method, path)` of every route the router serves, in the order
/// they were added; paths as axum writes them (`/v1/tasks/{id}`).
pub fn served_routes() -> Vec<(Method, &'static str)> {
    all().finish().2
}

/// The OpenAPI 3.1 document of every route, as JSON.
pub fn openapi_document() -> serde_json::Value {
    serde_json::to_value(all().finish().1).expect("the document serializes")
}

static DOCUMENT: LazyLock<Vec<u8>> =
    LazyLock::new(|| serde_json::to_vec(&openapi_document()).expect("the document serializes"));

async fn openapi_json() -> axum::response::Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_slice(),
    )
        .into_response()
}

// ---- how the extractors and answers describe themselves ------------------

/// The body of every error answer: a stable code and a message.
#[allow(dead_code)]
#[derive(JsonSchema)]
#[schemars(rename = "ErrorBody")]
pub(super) struct ErrorBody {
    /// Which error: one of the stable codes (proto-schemas/error-codes.md).
    code: StableCode,
    /// What went wrong, for people (at most 200 characters and a note);
    /// never branch on it.
    message: String,
}

/// The stable codes as an enum, from [`ErrorCode::ALL`].
struct StableCode;

impl JsonSchema for StableCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
        json_schema!({
            "type": "string",
            "description": "a stable error code (proto-schemas/error-codes.md)",
            "enum": codes
        })
    }
}

fn error_response(ctx: &mut GenContext) -> Response {
    answer(
        "an error: the status follows the code",
        "application/json",
        ctx.schema.subschema_for::<ErrorBody>(),
    )
}

/// An answer of `media_type` whose body `schema` describes.
fn answer(description: &str, media_type: &str, schema: Schema) -> Response {
    Response {
        description: description.into(),
        content: [(
            media_type.into(),
            MediaType {
                schema: Some(SchemaObject {
                    json_schema: schema,
                    example: None,
                    external_docs: None,
                }),
                ..MediaType::default()
            },
        )]
        .into_iter()
        .collect(),
        ..Response::default()
    }
}

impl OperationOutput for HttpError {
    type Inner = crate::wire::WireError;

    fn operation_response(ctx: &mut GenContext, _: &mut Operation) -> Option<Response> {
        Some(error_response(ctx))
    }

    fn inferred_responses(
        ctx: &mut GenContext,
        _: &mut Operation,
    ) -> Vec<(Option<StatusCode>, Response)> {
        vec![(None, error_response(ctx))]
    }
}

/// The name of the Bearer security scheme in the document.
const BEARER: &str = "bearer";

/// Who calls: a route that calls as the caller takes the Bearer token of
/// a server with `[auth] required = true`, and none otherwise (both
/// requirements are listed); its refusals are the error answers.
impl OperationInput for Caller {
    fn operation_input(_: &mut GenContext, operation: &mut Operation) {
        if operation.security.is_empty() {
            operation.security = vec![
                Default::default(),
                [(BEARER.to_string(), Vec::new())].into_iter().collect(),
            ];
        }
    }

    fn inferred_early_responses(
        ctx: &mut GenContext,
        _: &mut Operation,
    ) -> Vec<(Option<StatusCode>, Response)> {
        vec![(None, error_response(ctx))]
    }
}

impl<T: JsonSchema> OperationInput for JsonBody<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        <axum::Json<T> as OperationInput>::operation_input(ctx, operation);
    }
}

/// The path parameters of the task routes.
#[allow(dead_code)]
#[derive(JsonSchema)]
struct TaskIdParam {
    /// The task's id.
    id: TaskId,
}

impl OperationInput for IdPath {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        <axum::extract::Path<TaskIdParam> as OperationInput>::operation_input(ctx, operation);
    }
}

/// The path parameters of the schedule routes.
#[allow(dead_code)]
#[derive(JsonSchema)]
pub(super) struct ScheduleNameParam {
    /// The schedule's name.
    name: String,
}

/// The query string of a request, read by the handler as it likes and
/// documented as the parameters `T` declares (a struct of optional
/// fields; never built).
pub(super) struct Params<T> {
    raw: Option<String>,
    _declared: PhantomData<fn() -> T>,
}

impl<T> Params<T> {
    /// The query string, if any.
    pub(super) fn raw(&self) -> Option<&str> {
        self.raw.as_deref()
    }

    /// The query as `(name, value)` pairs, in order, decoded;
    /// `INVALID_ARGUMENT` if malformed.
    pub(super) fn pairs(&self) -> Result<Vec<(String, String)>, HttpError> {
        let query = self.raw.as_deref().unwrap_or("");
        let uri: axum::http::Uri = format!("/?{query}")
            .parse()
            .map_err(|e| HttpError::invalid(format!("{e}")))?;
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map(|q| q.0)
            .map_err(|e| HttpError::invalid(e.body_text()))
    }
}

impl<T, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Params {
            raw: parts.uri.query().map(str::to_string),
            _declared: PhantomData,
        })
    }
}

impl<T: JsonSchema> OperationInput for Params<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        <axum::extract::Query<T> as OperationInput>::operation_input(ctx, operation);
    }
}

/// `?limit=N` of `GET /v1/tasks`.
#[allow(dead_code)]
#[derive(JsonSchema)]
pub(super) struct TaskListParams {
    /// How many of the newest tasks (default 50, at most 500).
    limit: Option<u32>,
}

/// `op` with a `status` answer of `media_type` text (not JSON): the
/// metrics, the dashboard's page and assets.
pub(super) fn text_answer<'t>(
    mut op: TransformOperation<'t>,
    status: u16,
    media_type: &str,
    description: &str,
) -> TransformOperation<'t> {
    let responses = op
        .inner_mut()
        .responses
        .get_or_insert_with(Default::default);
    responses.responses.insert(
        StatusCode::Code(status),
        aide::openapi::ReferenceOr::Item(answer(
            description,
            media_type,
            json_schema!({"type": "string"}),
        )),
    );
    op
}

/// `GET /v1/autoscale`'s query.
#[allow(dead_code)]
#[derive(JsonSchema)]
pub(super) struct AutoscaleParams {
    /// The pool (default `default`).
    pool: Option<String>,
    /// The fleet's labels, `k=v,k=v` (empty or absent: the unlabeled fleet).
    labels: Option<String>,
}

/// `GET /v1/dashboard`'s query.
#[allow(dead_code)]
#[derive(JsonSchema)]
pub(super) struct DashboardParams {
    /// Workers whose id, pool or labels (`k=v,k=v`) contain this text.
    filter: Option<String>,
    /// Worker rows to skip (after filtering).
    offset: Option<u32>,
    /// Worker rows to show.
    workers: Option<u32>,
    /// Recent tasks to show.
    tasks: Option<u32>,
}
