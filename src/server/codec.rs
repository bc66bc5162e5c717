//! The gRPC codec of the Forge service: prost's, except that a request that does not decode
//! (malformed protobuf, a string field that is not UTF-8) is `INVALID_ARGUMENT` with what was
//! wrong, instead of tonic-prost's `INTERNAL` (`failed to decode Protobuf message`): the fault
//! is the caller's, and a retry of the same bytes cannot succeed.
//!
//! Not wired yet (issue 16, after the server restructuring): `build.rs` names it for the
//! generated code with `tonic_prost_build::configure().codec_path("crate::server::codec::ForgeCodec")`.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// prost encoding; decode failures become `INVALID_ARGUMENT` ([`invalid_message`]).
#[derive(Debug, Clone)]
pub struct ForgeCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ForgeCodec<T, U> {
    fn default() -> Self {
        ForgeCodec(PhantomData)
    }
}

impl<T, U> Codec for ForgeCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ForgeDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> ForgeDecoder<U> {
        ForgeDecoder(PhantomData)
    }
}

/// Decodes one message of type `U`.
#[derive(Debug, Clone, Default)]
pub struct ForgeDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for ForgeDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(invalid_message::<U>)
    }
}

/// `INVALID_ARGUMENT`: the bytes are not a valid `U` (prost's reason, e.g. "invalid string
/// value: data is not UTF-8 encoded", with the field path it names).
pub fn invalid_message<U>(e: prost::DecodeError) -> Status {
    let name = std::any::type_name::<U>().rsplit("::").next().unwrap_or("message");
    Status::invalid_argument(format!("the request is not a valid {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::proto::GenerateRequest;
    use tonic::Code;

    #[test]
    fn malformed_and_non_utf8_requests_are_invalid_arguments() {
        // Field 1 (prompt), length 2, bytes that are not UTF-8.
        let not_utf8 = GenerateRequest::decode(&b"\x0a\x02\xff\xfe"[..]).expect_err("not UTF-8");
        let s = invalid_message::<GenerateRequest>(not_utf8);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("GenerateRequest") && s.message().contains("UTF-8"), "{}", s.message());
        // A length running past the end of the message.
        let truncated = GenerateRequest::decode(&b"\x0a\x7fabc"[..]).expect_err("truncated");
        assert_eq!(invalid_message::<GenerateRequest>(truncated).code(), Code::InvalidArgument);
    }
}
