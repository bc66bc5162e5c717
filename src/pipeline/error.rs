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
    #[error("unknown model {requested:?}: this server serves {served:?} (id {id})")]
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
