//! The errors of a request, for every front end: the gRPC service maps them to `tonic::Status`
//! (`server/error.rs`), the HTTP API to a status and OpenAI's error JSON (`server/http/error.rs`);
//! each in one place.

use crate::engine::scheduler::{JobError, SubmitError};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("unknown model {}: this server serves {served:?} (id {id})", quoted(.requested))]
    UnknownModel { requested: String, served: String, id: String },
    #[error(transparent)]
    Submit(#[from] SubmitError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<tokio::task::JoinError> for ServiceError {
    fn from(e: tokio::task::JoinError) -> Self {
        ServiceError::Internal(format!("a background task failed: {e}"))
    }
}

/// Shorthand for a request the pipeline refuses as invalid.
pub(crate) fn invalid(msg: impl Into<String>) -> ServiceError {
    ServiceError::InvalidArgument(msg.into())
}

/// `text` as a quoted string for an error message, shortened when long: a caller's value is
/// echoed back, and a status message travels in an HTTP/2 header (a 1 MB one never arrives).
pub fn quoted(text: &str) -> String {
    const SHOWN: usize = 64;
    if text.chars().count() <= SHOWN {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(SHOWN).collect();
    format!("{head:?}... ({} bytes)", text.len())
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_shortens_long_values() {
        assert_eq!(super::quoted("acme"), "\"acme\"");
        let long = "é".repeat(100);
        let q = super::quoted(&long);
        assert!(q.starts_with(&format!("\"{}", "é".repeat(64))) && q.ends_with("\"... (200 bytes)"), "{q}");
    }
}
