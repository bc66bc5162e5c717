//! BLEND's store: each document chunk's KV kept as computed on its own — the chunk after the
//! prompt's lead (everything before the first chunk: the attention sink, the system prompt and
//! the template up to the documents), so that its stored KV has seen the context a document
//! first sees in a real prompt; the lead's own blocks are shared by every chunk — in the same
//! block index as prefix reuse, under a key chain of its own per tenant and model
//! ([`chunk_tenant`]: its blocks never match a prompt's prefix). The engine sees a
//! [`BlendPlan`]: a [`PrefixCache`] that loads no prefix and publishes nothing of the blended
//! (lossy) sequence, but offers an [`engine::blend::Blend`](crate::engine::blend::Blend) whose
//! spans each carry a [`super::KvPlan`] over one chunk's sequence.

use std::any::Any;

use super::KvWorkload;
use crate::engine::blend::{Blend, BlendReport, ReusedSpan};
use crate::engine::{KvCache, PrefixCache};

/// The tenant name under which a tenant's chunks are keyed (a separate key chain: the chunk
/// sequences are not prompts).
pub fn chunk_tenant(tenant: &str) -> String {
    format!("{tenant}\u{1f}blend-chunks")
}

/// A BLEND request's plan: its chunks' KV plans, and what the engine did with them.
#[derive(Debug)]
pub struct BlendPlan {
    blend: Blend,
    /// Chunk tokens whose KV the block index held when the plan was made.
    planned: usize,
}

/// What BLEND did for one request (after the engine gave the plan back).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlendData {
    /// The engine's numbers (tokens reused, recomputed, loaded, computed for the chunks).
    pub engine: BlendReport,
    /// Chunks in the request.
    pub chunks: usize,
    /// Chunk tokens whose KV the block index held before the engine ran.
    pub planned_tokens: usize,
}

impl KvWorkload {
    /// The plan of a BLEND request: for each chunk `(start, len)` of `prompt` (in order, not
    /// overlapping, after position 0), the stored KV of the chunk's own sequence (the prompt
    /// before the first chunk, then the chunk), memory first, then disk. `recompute`: the fraction of chunk
    /// tokens the engine recomputes (0 ..= 1). Blocking (disk).
    pub fn prepare_blend(&self, tenant: &str, prompt: &[u32], chunks: &[(usize, usize)], recompute: f32) -> BlendPlan {
        let owner = chunk_tenant(tenant);
        // The prompt before its first chunk (system prompt, the template up to the documents):
        // each chunk's KV is computed after it, as the chunk would see it first in a prompt.
        let lead = &prompt[..chunks.first().map_or(1, |c| c.0).max(1).min(prompt.len())];
        let mut planned = 0;
        let spans = chunks
            .iter()
            .filter_map(|&(at, len)| {
                let chunk = prompt.get(at..at + len)?;
                let tokens: Vec<u32> = lead.iter().chain(chunk).copied().collect();
                let plan = self.prepare(&owner, &tokens);
                planned += plan.report().reused_tokens.saturating_sub(lead.len());
                Some(ReusedSpan { at, base: lead.len(), tokens, cache: Box::new(plan) as Box<dyn PrefixCache> })
            })
            .collect();
        BlendPlan { blend: Blend { spans, recompute, report: BlendReport::default() }, planned }
    }
}

impl BlendPlan {
    /// What the request reused and recomputed.
    pub fn data(&self) -> BlendData {
        BlendData { engine: self.blend.report.clone(), chunks: self.blend.spans.len(), planned_tokens: self.planned }
    }
}

impl PrefixCache for BlendPlan {
    fn load(&mut self, _kv: &mut KvCache, _prompt: &[u32]) -> usize {
        0
    }

    /// The blended sequence's KV is not the model's for this prompt: never stored.
    fn publish(&mut self, _kv: &KvCache, _prompt: &[u32], _generated: &[u32]) {}

    fn blend(&mut self) -> Option<&mut Blend> {
        Some(&mut self.blend)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}
