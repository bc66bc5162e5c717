//! The HTTP API's errors and their one mapping to a status and OpenAI's error JSON:
//! `{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::engine::generate::GenerateError;
use crate::engine::scheduler::{JobError, SubmitError};
use crate::pipeline::ServiceError;
use crate::store::StoreError;

/// An error as the HTTP API answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status code.
    pub status: StatusCode,
    /// Human-readable error message.
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `permission_error`,
    /// `not_found_error`, `rate_limit_error`, `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A short machine-readable code (`invalid_api_key`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400 for a bad request body.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::invalid(message) }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// 503 while the model loads.
    pub fn loading() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the model is still loading; retry shortly").with_code("loading")
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code }
        })
    }

    /// The `code` label of `forge_requests_rejected_total` (as the gRPC side names them).
    pub fn metric_code(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::FORBIDDEN => "permission_denied",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::TOO_MANY_REQUESTS => "resource_exhausted",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            s if s.is_server_error() => "internal",
            _ => "invalid_argument",
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let message = e.to_string();
        let (status, kind, code) = match &e {
            ServiceError::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            ServiceError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "authentication_error", Some("invalid_api_key")),
            ServiceError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "permission_error", None),
            ServiceError::UnknownModel { .. } => (StatusCode::NOT_FOUND, "not_found_error", Some("model_not_found")),
            ServiceError::Submit(SubmitError::QueueFull(_)) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("queue_full")),
            ServiceError::Submit(SubmitError::Stopped) => (StatusCode::SERVICE_UNAVAILABLE, "server_error", None),
            ServiceError::Store(StoreError::NoSuchFact(_)) => (StatusCode::NOT_FOUND, "not_found_error", None),
            ServiceError::Store(StoreError::Invalid(_)) => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            ServiceError::Store(StoreError::Unavailable(_)) => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", None),
            ServiceError::Job(JobError::Generate(GenerateError::EmptyPrompt | GenerateError::PromptTooLong { .. } | GenerateError::Sampling(_))) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None)
            }
            ServiceError::Store(_) | ServiceError::Job(_) | ServiceError::Internal(_) => {
                tracing::error!(error = %e, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None)
            }
        };
        ApiError { status, message, kind, param: None, code }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, self.body().to_string()).into_response();
        r.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_shape() {
        let e = ApiError::from(ServiceError::Submit(SubmitError::QueueFull(3)));
        assert_eq!((e.status, e.kind, e.code), (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("queue_full")));
        let e = ApiError::from(ServiceError::Unauthenticated("unknown API key".into()));
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        let body = ApiError::param("n", "n must be 1").body();
        assert_eq!(body["error"]["param"], "n");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["code"].is_null());
        let e = ApiError::from(ServiceError::Job(JobError::Generate(GenerateError::PromptTooLong { prompt: 9, context: 8 })));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
