//! What the gRPC service answers to bytes that are not a valid request (issue 16, finding 3),
//! over real gRPC on loopback with the real model: a client that sends raw bytes (no prost
//! between the test and the wire) gets INVALID_ARGUMENT naming what was wrong for malformed
//! protobuf and for a string field that is not UTF-8 (tonic-prost answered INTERNAL "failed to
//! decode Protobuf message"), RESOURCE_EXHAUSTED for a 5 MB message (tonic answered
//! OUT_OF_RANGE), and the service keeps serving; `serve --max-message-mb` moves the limit.

mod common;

use common::serve::Serve;
use common::{ask, service, FRANCE};
use forge_cache::server::client::{Client, ClientError};
use forge_cache::server::proto;
use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Sends the bytes as they are; reads replies as bytes.
#[derive(Default)]
struct Raw;

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

/// The status a call of `method` with these request bytes ends with.
async fn call(url: &str, method: &'static str, bytes: Vec<u8>) -> Status {
    let channel = Channel::from_shared(url.to_string()).expect("url").connect().await.expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = PathAndQuery::from_static(method);
    if method.ends_with("/Generate") {
        match grpc.server_streaming(tonic::Request::new(bytes), path, Raw).await {
            Err(s) => s,
            Ok(r) => {
                let mut stream = r.into_inner();
                loop {
                    match stream.message().await {
                        Err(s) => break s,
                        Ok(Some(_)) => {}
                        Ok(None) => panic!("{method}: the call succeeded"),
                    }
                }
            }
        }
    } else {
        grpc.unary(tonic::Request::new(bytes), path, Raw).await.expect_err("the call must fail")
    }
}

const GENERATE: &str = "/forge.v1.Forge/Generate";
const PUT_FACT: &str = "/forge.v1.Forge/PutFact";
const GET_STATS: &str = "/forge.v1.Forge/GetStats";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_oversized_requests_get_the_documented_codes() {
    let (_scratch, server, mut c) = service().await;
    let url = server.url();
    // (what, method, bytes, code, the message must mention)
    let five_mb = proto::GenerateRequest { prompt: "a".repeat(5_000_000), ..ask(FRANCE, 4) }.encode_to_vec();
    let cases: Vec<(&str, &'static str, Vec<u8>, Code, &[&str])> = vec![
        // Field 1 (prompt), length 127, but 3 bytes follow.
        ("a length past the end", GENERATE, b"\x0a\x7fabc".to_vec(), Code::InvalidArgument, &["GenerateRequest", "buffer underflow"]),
        // Field 1 (prompt), 2 bytes that are not UTF-8.
        ("a prompt that is not UTF-8", GENERATE, b"\x0a\x02\xff\xfe".to_vec(), Code::InvalidArgument, &["GenerateRequest", "UTF-8", "prompt"]),
        // Wire type 7 does not exist.
        ("an invalid wire type", GET_STATS, b"\x0f".to_vec(), Code::InvalidArgument, &["GetStatsRequest", "wire type"]),
        // PutFactRequest field 1 (content), not UTF-8.
        ("a fact that is not UTF-8", PUT_FACT, b"\x0a\x03a\xc3\x28".to_vec(), Code::InvalidArgument, &["PutFactRequest", "UTF-8"]),
        // A valid message whose 1 MB field is echoed by no error message (a status message is an
        // HTTP/2 header: a long one would not reach the client).
        ("a 1 MB tenant name", GET_STATS, proto::GetStatsRequest { tenant: "t".repeat(1 << 20), ..Default::default() }.encode_to_vec(), Code::InvalidArgument, &["tenant name", "1048576 bytes"]),
        ("a 1 MB model name", GENERATE, proto::GenerateRequest { model: "m".repeat(1 << 20), ..ask(FRANCE, 2) }.encode_to_vec(), Code::NotFound, &["unknown model", "1048576 bytes"]),
        ("a 5 MB message", GENERATE, five_mb, Code::ResourceExhausted, &["5000", "4194304", "--max-message-mb"]),
    ];
    for (what, method, bytes, code, words) in cases {
        let s = call(&url, method, bytes).await;
        assert_eq!(s.code(), code, "{what}: {}", s.message());
        for w in words {
            assert!(s.message().contains(w), "{what}: {:?} should mention {w:?}", s.message());
        }
        // The service is still up and answers a valid request.
        let ok = c.generate(ask(FRANCE, 2)).await.expect("a valid request after a bad one");
        assert!(!ok.tokens.is_empty(), "{what}");
    }
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_max_message_mb_moves_the_limit() {
    let serve = Serve::spawn(&["--no-semantic", "--max-message-mb", "8"]).ready();
    let mut c = Client::connect(&serve.grpc_url()).await.expect("connect");
    // 5 MB passes the limit of 8 MiB and reaches validation: a stop string of 5 MB is refused there.
    let req = proto::GenerateRequest { stop: vec!["x".repeat(5_000_000)], ..ask(FRANCE, 2) };
    match c.generate(req).await {
        Err(ClientError::Status(s)) => {
            assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
            assert!(s.message().contains("stop"), "{}", s.message());
        }
        other => panic!("expected INVALID_ARGUMENT from validation, got {other:?}"),
    }
    // 9 MB does not.
    let nine_mb = proto::GenerateRequest { prompt: "a".repeat(9 << 20), ..ask(FRANCE, 2) }.encode_to_vec();
    let s = call(&serve.grpc_url(), GENERATE, nine_mb).await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{}", s.message());
    assert!(s.message().contains(&(8usize << 20).to_string()), "{}", s.message());
}
