//! A small client for the service: connects, adds the tenant / API-key headers to every call,
//! and collects a Generate stream (text, tokens, outcome). The CLI and the tests use it.

use std::time::{Duration, Instant};

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::proto::{self, forge_client::ForgeClient};
use super::tenants::{API_KEY_HEADER, TENANT_HEADER};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server address {0:?}")]
    Address(String),
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    #[error("header value {0:?} is not valid ASCII")]
    Header(String),
    #[error("the stream ended without an outcome")]
    NoOutcome,
    #[error("the server is not serving after {0:?}")]
    NotHealthy(Duration),
}

/// A finished Generate call.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The streamed text, joined.
    pub text: String,
    /// The streamed token ids, in order.
    pub tokens: Vec<u32>,
    /// The server's outcome message (tier, counts, timings).
    pub outcome: proto::Outcome,
    /// Call start to outcome, measured by the client.
    pub client_latency: Duration,
}

impl Generated {
    pub fn served_from(&self) -> proto::ServedFrom {
        proto::ServedFrom::try_from(self.outcome.served_from).unwrap_or(proto::ServedFrom::Unspecified)
    }

    /// The tier's name as the store and the stats print it (`MODEL`, `EXACT`, ...), or
    /// `UNSPECIFIED` when the server sent none.
    pub fn served_from_name(&self) -> &'static str {
        crate::vocab::ServedFrom::try_from(self.served_from()).map_or("UNSPECIFIED", |s| s.as_str())
    }
}

#[derive(Clone)]
pub struct Client {
    inner: ForgeClient<Channel>,
    tenant: Option<String>,
    api_key: Option<String>,
}

/// `http://HOST:PORT` for a bare `HOST:PORT` (what `serve` prints as its address, and what
/// grpcurl takes); a URL with a scheme is kept.
pub fn normalize_url(url: &str) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

async fn channel(url: &str) -> Result<Channel, ClientError> {
    let url = &normalize_url(url);
    let endpoint = Channel::from_shared(url.to_string()).map_err(|_| ClientError::Address(url.to_string()))?;
    endpoint.connect().await.map_err(|source| ClientError::Connect { url: url.to_string(), source })
}

impl Client {
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        // Answers can be large (a whole context of text); allow up to 64 MiB per message.
        let inner = ForgeClient::new(channel(url).await?).max_decoding_message_size(64 << 20);
        Ok(Client { inner, tenant: None, api_key: None })
    }

    /// Sends `x-forge-tenant: TENANT` with every call.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Client {
        self.tenant = Some(tenant.into());
        self
    }

    /// Sends `x-forge-api-key: KEY` with every call.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Client {
        self.api_key = Some(key.into());
        self
    }

    fn request<T>(&self, msg: T) -> Result<Request<T>, ClientError> {
        let mut r = Request::new(msg);
        for (name, value) in [(TENANT_HEADER, &self.tenant), (API_KEY_HEADER, &self.api_key)] {
            if let Some(v) = value {
                let v: MetadataValue<_> = v.parse().map_err(|_| ClientError::Header(v.clone()))?;
                r.metadata_mut().insert(name, v);
            }
        }
        Ok(r)
    }

    /// The raw response stream (drop it to cancel).
    pub async fn generate_stream(&mut self, req: proto::GenerateRequest) -> Result<tonic::Streaming<proto::GenerateResponse>, ClientError> {
        let r = self.request(req)?;
        Ok(self.inner.generate(r).await?.into_inner())
    }

    /// Runs Generate to the end; `on_text` sees each piece of text as it arrives.
    pub async fn generate_with(&mut self, req: proto::GenerateRequest, mut on_text: impl FnMut(&str)) -> Result<Generated, ClientError> {
        let t0 = Instant::now();
        let mut stream = self.generate_stream(req).await?;
        let (mut text, mut tokens) = (String::new(), Vec::new());
        while let Some(msg) = stream.message().await? {
            on_text(&msg.text);
            text.push_str(&msg.text);
            tokens.extend_from_slice(&msg.token_ids);
            if let Some(outcome) = msg.outcome {
                return Ok(Generated { text, tokens, outcome, client_latency: t0.elapsed() });
            }
        }
        Err(ClientError::NoOutcome)
    }

    pub async fn generate(&mut self, req: proto::GenerateRequest) -> Result<Generated, ClientError> {
        self.generate_with(req, |_| {}).await
    }

    pub async fn get_stats(&mut self, since_seconds: u64) -> Result<proto::GetStatsResponse, ClientError> {
        let r = self.request(proto::GetStatsRequest { since_seconds, tenant: String::new() })?;
        Ok(self.inner.get_stats(r).await?.into_inner())
    }

    pub async fn search_facts(&mut self, query: &str, include_degraded: bool) -> Result<Vec<proto::Fact>, ClientError> {
        let r = self.request(proto::SearchFactsRequest { query: query.into(), limit: 0, include_degraded, tenant: String::new() })?;
        Ok(self.inner.search_facts(r).await?.into_inner().facts)
    }

    pub async fn put_fact(&mut self, req: proto::PutFactRequest) -> Result<proto::PutFactResponse, ClientError> {
        let r = self.request(req)?;
        Ok(self.inner.put_fact(r).await?.into_inner())
    }

    pub async fn invalidate_facts(&mut self, req: proto::InvalidateFactsRequest) -> Result<Vec<i64>, ClientError> {
        let r = self.request(req)?;
        Ok(self.inner.invalidate_facts(r).await?.into_inner().invalidated_ids)
    }
}

/// Polls `grpc.health.v1.Health/Check` until the server reports SERVING or `timeout` passes.
pub async fn wait_healthy(url: &str, timeout: Duration) -> Result<(), ClientError> {
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(ch) = channel(url).await {
            let mut health = HealthClient::new(ch);
            if let Ok(r) = health.check(HealthCheckRequest { service: String::new() }).await {
                if r.into_inner().status == ServingStatus::Serving as i32 {
                    return Ok(());
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(ClientError::NotHealthy(timeout));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_host_port_gets_a_scheme() {
        assert_eq!(normalize_url("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(normalize_url(" localhost:1 "), "http://localhost:1");
        assert_eq!(normalize_url("https://example.com:443"), "https://example.com:443");
    }
}
