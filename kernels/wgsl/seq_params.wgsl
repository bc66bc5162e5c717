// seq_params.wgsl — the parameters of one sequence of a layer-runner step (kv.rs `seq_params`
// writes them into the sequence's slot; bound with a dynamic offset), prepended to attention.wgsl,
// rope_store.wgsl and mv_y_rope.wgsl, which declare the uniform themselves:
//   n_tok, t0        the sequence's rows t0 .. t0 + n_tok of the step
//   n_head, n_kv_head, head_dim
//   capacity         positions per KV head in the cache
//   kv_f16           1: the cache holds f16 pairs, 0: f32 bits
//   q_stride         width of a fused q|k|v row
//   scale            1 / sqrt(head_dim)
//   swizzle, q8_out  attention's output layouts (attention.wgsl)
//   _c               always 0 (attention_one.wgsl ORs it into its f16 round trip)
//   window           attention.wgsl: 0, or the sliding window (a query at position p attends to
//                    keys max(0, p + 1 - window) ..= p only)
//   neox             rope_store.wgsl: 1 rotates the pairs (i, i + head_dim/2) of each q and k head
//                    (GGML's NeoX mode), 0 adjacent pairs

struct SeqP {
    n_tok: u32,
    t0: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    capacity: u32,
    kv_f16: u32,
    q_stride: u32,
    scale: f32,
    swizzle: u32,
    q8_out: u32,
    _c: u32,
    window: u32,
    neox: u32,
}
