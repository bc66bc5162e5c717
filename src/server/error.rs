//! The one mapping of the pipeline's request errors ([`ServiceError`]) to gRPC status codes
//! (what goes wrong on the wire, before a request exists, is mapped in `server/codec.rs`).

use tonic::{Code, Status};

use crate::engine::generate::GenerateError;
use crate::engine::scheduler::{JobError, SubmitError};
pub use crate::pipeline::ServiceError;
use crate::store::StoreError;

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
            ServiceError::Store(StoreError::Unavailable(_)) => Code::Unavailable,
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
            tracing::error!(error = %e, "internal error");
        }
        Status::new(code, clip(e.to_string()))
    }
}

/// A status message travels in an HTTP/2 header, which clients limit (16 KiB by default): a
/// longer message would arrive as a protocol error instead of the status. Messages name what
/// was wrong in a line or two, and echo callers' values shortened
/// ([`crate::pipeline::error::quoted`]); this is the backstop.
const MAX_MESSAGE_BYTES: usize = 4096;

fn clip(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let total = message.len();
        let mut cut = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(&format!("... (message cut, {total} bytes)"));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(Status::from(ServiceError::Submit(SubmitError::QueueFull(3))).code(), Code::ResourceExhausted);
        assert_eq!(Status::from(ServiceError::Store(StoreError::NoSuchFact(9))).code(), Code::NotFound);
        assert_eq!(Status::from(ServiceError::Store(StoreError::Unavailable("db down".into()))).code(), Code::Unavailable);
        let e = ServiceError::Job(JobError::Generate(GenerateError::PromptTooLong { prompt: 9000, context: 8192 }));
        let s = Status::from(e);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("9000"), "{}", s.message());
        let long = Status::from(ServiceError::InvalidArgument("é".repeat(10_000)));
        assert!(long.message().len() < MAX_MESSAGE_BYTES + 64 && long.message().ends_with("(message cut, 20000 bytes)"), "{}", long.message().len());
    }
}
