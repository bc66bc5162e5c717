//! How the Forge service reads request messages off the wire, and the one mapping of what can go
//! wrong there to gRPC statuses (the pipeline's own errors are mapped in `server/error.rs`):
//!
//! * bytes that are not a valid message (malformed protobuf, a string field that is not UTF-8):
//!   `INVALID_ARGUMENT`, naming the message type and prost's reason ([`invalid_message`]),
//!   instead of tonic-prost's `INTERNAL` ("failed to decode Protobuf message"): the fault is the
//!   caller's, and a retry of the same bytes cannot succeed;
//! * a message longer than the limit (`serve --max-message-mb`, [`DEFAULT_MAX_MESSAGE_BYTES`]):
//!   `RESOURCE_EXHAUSTED`, as gRPC's implementations answer it ([`too_large`]), instead of
//!   tonic's `OUT_OF_RANGE`. [`MessageLimit`] reads each message's 5-byte frame header as the
//!   body arrives and refuses the message before buffering it.
//!
//! The generated code uses [`ForgeCodec`] (`build.rs`: `codec_path`), the client's too, where a
//! reply that does not decode is reported the same way.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::Frame;
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::{http, Bytes, Service};
use tonic::server::NamedService;
use tonic::Status;
use tonic_prost::ProstEncoder;

/// gRPC's usual limit on a received message (4 MiB), unless `serve --max-message-mb` says.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

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
    Status::invalid_argument(format!("the message is not a valid {name}: {e}"))
}

/// `RESOURCE_EXHAUSTED`: a message of `len` bytes is over the limit.
pub fn too_large(len: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "the message is {len} bytes, over this server's limit of {limit} bytes (serve --max-message-mb)"
    ))
}

/// A gRPC service whose request messages may be at most `limit` bytes: a longer one ends the
/// call with [`too_large`] as soon as its frame header arrives.
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> MessageLimit<S> {
    pub fn new(inner: S, limit: usize) -> MessageLimit<S> {
        MessageLimit { inner, limit }
    }
}

impl<S: NamedService> NamedService for MessageLimit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S: Service<http::Request<Body>>> Service<http::Request<Body>> for MessageLimit<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> S::Future {
        let limit = self.limit;
        self.inner.call(req.map(|body| Body::new(Frames { inner: body, limit, header: [0; 5], have: 0, left: 0, failed: false })))
    }
}

/// A request body read through: every gRPC frame's header (1 byte flag, 4 bytes big-endian
/// length) is checked against the limit; the bytes pass unchanged.
struct Frames {
    inner: Body,
    limit: usize,
    /// The header being read, `have` bytes of it so far.
    header: [u8; 5],
    have: usize,
    /// Bytes of the current message still to come.
    left: usize,
    failed: bool,
}

impl Frames {
    fn scan(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                self.left -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                let len = u32::from_be_bytes([self.header[1], self.header[2], self.header[3], self.header[4]]) as usize;
                if len > self.limit {
                    return Err(too_large(len, self.limit));
                }
                (self.left, self.have) = (len, 0);
            }
        }
        Ok(())
    }
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()).and_then(Frame::data_ref) {
            if let Err(status) = this.scan(data) {
                this.failed = true;
                return Poll::Ready(Some(Err(status)));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
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

    #[test]
    fn frame_headers_are_read_across_chunks() {
        let mut f = Frames { inner: Body::empty(), limit: 10, header: [0; 5], have: 0, left: 0, failed: false };
        // A 10-byte message, its header split over two chunks, then the next header.
        assert!(f.scan(&[0, 0, 0]).is_ok());
        assert!(f.scan(&[0, 10, 1, 2, 3]).is_ok());
        assert!(f.scan(&[4, 5, 6, 7, 8, 9, 10, 0, 0]).is_ok());
        assert_eq!((f.left, f.have), (0, 2));
        let s = f.scan(&[0, 0, 11]).expect_err("11 bytes > 10");
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("11 bytes") && s.message().contains("10 bytes"), "{}", s.message());
    }
}
