//! The errors of a request and their one mapping to gRPC status codes.

use tonic::{Code, Status};

use crate::engine::generate::GenerateError;
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

impl ServiceError {
    pub fn code(&self) -> Code {
        match self {
            ServiceError::InvalidArgument(_) => Code::InvalidArgument,
            ServiceError::Unauthenticated(_) => Code::Unauthenticated,
            ServiceError::PermissionDenied(_) => Code::PermissionDenied,
            ServiceError::UnknownModel { .. } => Code::NotFound,
            ServiceError::Submit(SubmitError::QueueFull(_)) => Code::ResourceExhausted,
            ServiceError::Submit(SubmitError::Stopped) => Code::Unavailable,
            ServiceError::Store(StoreError::NoSuchFact(_)) => Code::NotFound,
            ServiceError::Store(StoreError::Invalid(_)) => Code::InvalidArgument,
            ServiceError::Store(_) => Code::Internal,
            ServiceError::Job(JobError::Generate(
                GenerateError::EmptyPrompt | GenerateError::PromptTooLong { .. } | GenerateError::Sampling(_),
            )) => Code::InvalidArgument,
            ServiceError::Job(_) | ServiceError::Internal(_) => Code::Internal,
        }
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        let code = e.code();
        if code == Code::Internal {
            eprintln!("forge-cache: internal error: {e}");
        }
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(Status::from(ServiceError::Submit(SubmitError::QueueFull(3))).code(), Code::ResourceExhausted);
        assert_eq!(Status::from(ServiceError::Store(StoreError::NoSuchFact(9))).code(), Code::NotFound);
        let e = ServiceError::Job(JobError::Generate(GenerateError::PromptTooLong { prompt: 9000, context: 8192 }));
        let s = Status::from(e);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("9000"), "{}", s.message());
    }
}
