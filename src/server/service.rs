//! The tonic service: resolves the tenant of every call, translates the request into the
//! pipeline's words and the answer back; `Generate` is [`Pipeline::generate`], nothing more.
//! Store calls run on the blocking pool.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::error::ServiceError;
use super::proto::{self, forge_server::Forge};
use crate::pipeline::Pipeline;
use crate::store::InvalidateRequest;

pub type GenerateStream = Pin<Box<dyn Stream<Item = Result<proto::GenerateResponse, Status>> + Send>>;

/// Facts a search returns when the request does not say, and at most.
const DEFAULT_SEARCH_LIMIT: usize = 20;
const MAX_SEARCH_LIMIT: usize = 1000;

pub struct ForgeService {
    state: Arc<Pipeline>,
}

impl ForgeService {
    pub fn new(state: Arc<Pipeline>) -> ForgeService {
        ForgeService { state }
    }

    /// Runs `f` on the store off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Pipeline) -> Result<T, ServiceError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || f(&state)).await?
    }
}

#[tonic::async_trait]
impl Forge for ForgeService {
    type GenerateStream = GenerateStream;

    async fn generate(&self, request: Request<proto::GenerateRequest>) -> Result<Response<GenerateStream>, Status> {
        let tenant = match self.state.auth.resolve(request.metadata(), &request.get_ref().tenant) {
            Ok(t) => t,
            Err(e) => {
                self.state.metrics.rejected(&e);
                return Err(e.into());
            }
        };
        let r = request.into_inner();
        if let Err(e) = proto::cache_mode(r.cache_mode) {
            self.state.metrics.rejected(&e);
            return Err(e.into());
        }
        let generation = self.state.generate(tenant, r.into()).await?;
        let stream = generation.chunks.map(|c| c.map(proto::GenerateResponse::from).map_err(Status::from));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_stats(&self, request: Request<proto::GetStatsRequest>) -> Result<Response<proto::GetStatsResponse>, Status> {
        let tenant = self.state.auth.resolve(request.metadata(), &request.get_ref().tenant)?;
        let since = Some(request.get_ref().since_seconds).filter(|&s| s > 0);
        let stats = self.blocking(move |s| Ok(s.store.tenant_stats(&tenant, since)?)).await?;
        Ok(Response::new(stats.into()))
    }

    async fn search_facts(&self, request: Request<proto::SearchFactsRequest>) -> Result<Response<proto::SearchFactsResponse>, Status> {
        let tenant = self.state.auth.resolve(request.metadata(), &request.get_ref().tenant)?;
        let r = request.into_inner();
        let limit = match r.limit as usize {
            0 => DEFAULT_SEARCH_LIMIT,
            n if n > MAX_SEARCH_LIMIT => {
                return Err(ServiceError::InvalidArgument(format!("limit is at most {MAX_SEARCH_LIMIT}")).into());
            }
            n => n,
        };
        let facts = self.blocking(move |s| Ok(s.store.search_facts(&tenant, &r.query, limit, r.include_degraded)?)).await?;
        Ok(Response::new(proto::SearchFactsResponse { facts: facts.into_iter().map(Into::into).collect() }))
    }

    async fn put_fact(&self, request: Request<proto::PutFactRequest>) -> Result<Response<proto::PutFactResponse>, Status> {
        let tenant = self.state.auth.resolve(request.metadata(), &request.get_ref().tenant)?;
        let r = request.into_inner();
        let confidence = r.confidence.unwrap_or(1.0);
        let report = self
            .blocking(move |s| {
                let question = Some(r.question.as_str()).filter(|q| !q.trim().is_empty());
                Ok(s.store.put_fact(&tenant, &r.content, question, confidence)?)
            })
            .await?;
        Ok(Response::new(proto::PutFactResponse { fact: Some(report.fact.into()), superseded_ids: report.superseded }))
    }

    async fn invalidate_facts(
        &self,
        request: Request<proto::InvalidateFactsRequest>,
    ) -> Result<Response<proto::InvalidateFactsResponse>, Status> {
        let tenant = self.state.auth.resolve(request.metadata(), &request.get_ref().tenant)?;
        let r = request.into_inner();
        let ids = self
            .blocking(move |s| {
                let req = InvalidateRequest {
                    ids: &r.ids,
                    text_match: Some(r.text_match.as_str()),
                    reason: &r.reason,
                    contradicted_by: Some(r.contradicted_by).filter(|&id| id != 0),
                };
                Ok(s.store.invalidate_facts(&tenant, &req)?)
            })
            .await?;
        Ok(Response::new(proto::InvalidateFactsResponse { invalidated_ids: ids }))
    }
}
