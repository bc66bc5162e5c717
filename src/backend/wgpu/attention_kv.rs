//! The prefill attention grouped by KV head (kernels/wgsl/attention_kv.wgsl): when it is built
//! and which sequences take it. It gives `attention`'s bits (tested), so the choice by batch size
//! cannot make a token's bits depend on its batch.

use super::pipeline::{kernel_on, Kernel};
use super::WgpuError;

/// Query rows of one workgroup (attention_kv.wgsl's RMAX): tokens × the query heads of one KV
/// head.
const ROWS: usize = 16;
/// Largest head_dim the kernel takes (its HD_MAX).
const MAX_HEAD_DIM: usize = 128;
/// Workgroup memory the kernel declares, bytes (its own arrays, q8_act.wgsl's and
/// attention_part.wgsl's: about 23 KiB), rounded up.
const WORKGROUP_BYTES: u32 = 24 * 1024;

/// The kernel on `attention`'s bind group layout (it takes the same bind groups), from `prefix`:
/// the sources attention.wgsl is built after, with attention_part.wgsl. `None` where the device's
/// workgroup memory is too small.
pub(super) fn build(device: &wgpu::Device, attention: &Kernel, prefix: &str, checks: bool) -> Result<Option<Kernel>, WgpuError> {
    if device.limits().max_compute_workgroup_storage_size < WORKGROUP_BYTES {
        return Ok(None);
    }
    let src = format!("{prefix}\n{}", include_str!("../../../kernels/wgsl/attention_kv.wgsl"));
    kernel_on(device, "attention_kv", &src, attention.layout.clone(), attention.dynamic, checks).map(Some)
}

/// Tokens per workgroup for `group` query heads per KV head: the largest power of two with
/// tokens × group <= [`ROWS`]. H200, SmolLM2-shaped pp512 (group 3, t/s, two rounds): 4 tokens
/// (12 rows) 45142-45329, 5 (15 rows) 39429-39743, 3 and 2 slower still (a first build); the
/// 1.1B (group 8): 2 tokens (16 rows) 14764-14995, 1 token 9575-9592 (a first build; docs/perf.md).
fn tokens_per_group(group: usize) -> usize {
    let most = ROWS / group;
    1 << most.ilog2()
}

/// The grid of attention_kv.wgsl for a sequence of `n_tok` tokens (n_kv_head, blocks of tokens)
/// when the sequence takes it: `from` ([`WgpuOptions::attention_kv`](super::WgpuOptions::attention_kv),
/// 0: never) tokens or more, head_dim and the query heads per KV head within the kernel's limits.
/// Whether the kernel was built is the caller's (`WgpuContext::attention_kv`).
pub(crate) fn grid(from: usize, n_head: usize, n_kv_head: usize, head_dim: usize, n_tok: usize) -> Option<(u32, u32)> {
    let group = n_head.checked_div(n_kv_head)?;
    let on = from > 0 && n_tok >= from;
    if !on || group == 0 || group > ROWS || head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(8) {
        return None;
    }
    Some((n_kv_head as u32, n_tok.div_ceil(tokens_per_group(group)) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_per_workgroup_fill_at_most_16_rows() {
        assert_eq!([1, 2, 3, 4, 5, 6, 8, 9, 16].map(tokens_per_group), [16, 8, 4, 4, 2, 2, 2, 1, 1]);
    }
}
