//! One step of [`GpuLayers`]: inputs and parameters written, dispatches recorded and submitted,
//! the result read back; and the command buffers of the next step recorded ahead.
//!
//! Recording is a large part of a decode step: wgpu validates and encodes every dispatch on the
//! CPU (measured on the H100 device machine with the 1.1B model: 1.75 ms of CPU to record and
//! submit a decode step's 176 dispatches as one command buffer, 1.15 ms of GPU to run them; in
//! parts of three layers about 0.8 ms). Nothing a step records depends on the step's data: the
//! hidden state, the positions and every parameter live in buffers written with
//! `Queue::write_buffer`, which lands before the next submission. So once a step is submitted,
//! the same step is recorded again while the GPU runs it ([`Ahead`]), and the next step of the
//! same shape (tokens, sequences and their caches, logit rows) submits those command buffers at
//! once: the GPU starts without waiting for the recording. A step of another shape drops them
//! and records as it goes, submitting every `submit_layers` layers.

use std::time::Instant;

use super::*;

/// What a step measures: nothing, each dispatch in its own timed pass, or the step as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::wgpu) enum Prof {
    Off,
    Dispatches,
    Span,
}

/// Command buffers of a whole step, recorded ahead for a step of `shape` (both vectors reused
/// from step to step).
#[derive(Default)]
pub(crate) struct Ahead {
    shape: Shape,
    bufs: Vec<wgpu::CommandBuffer>,
}

/// What a step's command buffers depend on.
#[derive(Debug, Default, PartialEq)]
struct Shape {
    n: usize,
    /// (cache id, tokens) per sequence
    seqs: Vec<(u64, usize)>,
    /// the logit rows, `None` when the hidden state is read back instead
    rows: Option<Vec<u32>>,
}

impl Shape {
    fn set(&mut self, n: usize, seqs: &[SeqSpan<'_>], rows: Option<&[u32]>) {
        self.n = n;
        self.seqs.clear();
        self.seqs.extend(seqs.iter().map(|s| (gpu_kv(s).id, s.n_tok)));
        match rows {
            Some(r) => {
                let v = self.rows.get_or_insert_with(Vec::new);
                v.clear();
                v.extend_from_slice(r);
            }
            None => self.rows = None,
        }
    }

    fn matches(&self, n: usize, seqs: &[SeqSpan<'_>], rows: Option<&[u32]>) -> bool {
        self.n == n
            && self.seqs.len() == seqs.len()
            && self.seqs.iter().zip(seqs).all(|(a, s)| *a == (gpu_kv(s).id, s.n_tok))
            && self.rows.as_deref() == rows
    }
}

impl GpuLayers {
    pub(in crate::backend::wgpu) fn step(
        &self,
        act: &mut GpuActivations,
        hidden: &mut [f32],
        positions: &[u32],
        seqs: &mut [SeqSpan<'_>],
        prof: Prof,
        head: Option<(&[u32], &mut [f32])>,
    ) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        let wall = Instant::now();
        self.check_step(act, hidden, positions, seqs)?;
        let n = positions.len();
        if n == 0 {
            return Ok(None);
        }
        let bufs = self.seq_buffers(act);
        for s in seqs.iter_mut() {
            let kv = s.kv.get_mut::<GpuKv>().ok_or_else(|| WgpuError::Unsupported("a KV cache of another backend".into()))?;
            kv.bind_for(&bufs, |li| (act.qkv_rope(li), act.o_merge(li)))?;
        }
        self.write_inputs(act, hidden, positions, seqs);
        match prof {
            Prof::Off => self.run(act, hidden, seqs, n, head).map(|_| None),
            _ => self.profiled(act, hidden, seqs, n, prof, wall),
        }
    }

    /// Writes the hidden state, the positions and the parameters of a step.
    fn write_inputs(&self, act: &mut GpuActivations, hidden: &[f32], positions: &[u32], seqs: &[SeqSpan<'_>]) {
        let ctx = &self.ctx;
        let n = positions.len();
        ctx.queue.write_buffer(&act.x, 0, bytemuck::cast_slice(hidden));
        ctx.queue.write_buffer(&act.pos, 0, bytemuck::cast_slice(positions));
        let stride = (act.slot_stride / 4) as usize;
        let n_wide = act.n_fixed;
        for (slot, step) in act.slots.iter().enumerate() {
            let p = self.params_of(*step, n);
            act.words[slot * stride..slot * stride + 8].copy_from_slice(&p);
        }
        let mut t0 = 0;
        // sliding-window layers read a second set of sequence slots, `max_tokens` further on
        let window = (0..self.layers.len()).any(|li| self.windowed(li)).then(|| window_param(self.config.sliding_window));
        for (i, s) in seqs.iter().enumerate() {
            let mut p = seq_params(&self.config, self.kv, gpu_kv(s).capacity, t0, s.n_tok, attention_q8(self.ctx.q8, &self.config));
            act.words[(n_wide + i) * stride..(n_wide + i) * stride + p.len()].copy_from_slice(&p);
            if let Some(w) = window {
                p[12] = w;
                let at = (n_wide + act.max_tokens + i) * stride;
                act.words[at..at + p.len()].copy_from_slice(&p);
            }
            t0 += s.n_tok;
        }
        let used = (n_wide + if window.is_some() { act.max_tokens } else { 0 } + seqs.len()) * stride;
        ctx.queue.write_buffer(&act.params, 0, bytemuck::cast_slice(&act.words[..used]));
    }

    /// The step itself: submitted (recorded ahead, or recorded now in parts), the next one
    /// recorded ahead, then the hidden state or the logits read back.
    fn run(&self, act: &mut GpuActivations, hidden: &mut [f32], seqs: &[SeqSpan<'_>], n: usize, head: Option<(&[u32], &mut [f32])>) -> Result<(), WgpuError> {
        let ctx = &self.ctx;
        let rows = head.as_ref().map(|h| h.0);
        let round = match (&act.head, rows) {
            (Some(h), Some(r)) => r.len().min(h.rows),
            (None, Some(_)) => return Err(WgpuError::Unsupported("no head activations".into())),
            _ => 0,
        };
        if round > 0 {
            self.write_head_params(act, round);
        }
        // Logits of more rows than one head round are read in rounds, recorded as they go.
        let whole = rows.is_none_or(|r| r.len() == round);
        let mut ahead = act.ahead.take().unwrap_or_default();
        if !ahead.bufs.is_empty() && ahead.shape.matches(n, seqs, rows) {
            ctx.queue.submit(ahead.bufs.drain(..));
        } else {
            ahead.bufs.clear();
            let mut enc = self.record_layers(act, seqs, n, ctx.submit_layers, None, |cb| {
                ctx.queue.submit([cb]);
            });
            self.record_tail(act, &mut enc, n, rows);
            ctx.queue.submit([enc.finish()]);
        }
        if whole {
            // one part: recorded while the GPU is busy anyway, and one command buffer ran faster
            // than parts of three layers (H100, 1.1B: tg128 638 against 546 tokens/s)
            ahead.shape.set(n, seqs, rows);
            let mut enc = self.record_layers(act, seqs, n, 0, None, |cb| ahead.bufs.push(cb));
            self.record_tail(act, &mut enc, n, rows);
            ahead.bufs.push(enc.finish());
            act.ahead = Some(ahead);
        }
        let e = self.config.n_embd;
        let Some((rows, logits)) = head else {
            return ctx.read_mapped(&act.staging, (n * e * 4) as u64, |b| hidden.copy_from_slice(bytemuck::cast_slice(b)));
        };
        let Some(h) = &act.head else { return Err(WgpuError::Unsupported("no head activations".into())) };
        let v = logits.len() / rows.len().max(1);
        ctx.read_mapped(&h.staging, (round * v * 4) as u64, |b| logits[..round * v].copy_from_slice(bytemuck::cast_slice(b)))?;
        for (ci, chunk) in rows.chunks(h.rows).enumerate().skip(1) {
            self.write_head_params(act, chunk.len());
            let mut enc = ctx.encoder();
            self.record_tail(act, &mut enc, n, Some(chunk));
            ctx.queue.submit([enc.finish()]);
            let off = ci * h.rows * v;
            ctx.read_mapped(&h.staging, (chunk.len() * v * 4) as u64, |b| logits[off..off + chunk.len() * v].copy_from_slice(bytemuck::cast_slice(b)))?;
        }
        Ok(())
    }

    fn write_head_params(&self, act: &GpuActivations, k: usize) {
        if let Some(h) = &act.head {
            for (step, slot) in [(h.norm.step, h.slots[0]), (h.out.step, h.slots[1])] {
                let p = self.params_of(step, k);
                self.ctx.queue.write_buffer(&act.params, slot as u64 * act.slot_stride, bytemuck::cast_slice(&p));
            }
        }
    }

    /// Records what follows the layers: no rows (`rows` None) copies the hidden state to the
    /// staging buffer; logit rows: the first head round over up to `HEAD_ROWS` of them (rows
    /// gathered by buffer copies, normalized, projected, copied to the head's staging buffer);
    /// an empty row list: nothing.
    fn record_tail(&self, act: &GpuActivations, enc: &mut wgpu::CommandEncoder, n: usize, rows: Option<&[u32]>) {
        let e = self.config.n_embd;
        let Some(rows) = rows else {
            enc.copy_buffer_to_buffer(&act.x, 0, &act.staging, 0, (n * e * 4) as u64);
            return;
        };
        let Some(h) = &act.head else { return };
        let chunk = &rows[..rows.len().min(h.rows)];
        if chunk.is_empty() {
            return;
        }
        let k = chunk.len();
        let row_bytes = (e * 4) as u64;
        for (i, &r) in chunk.iter().enumerate() {
            enc.copy_buffer_to_buffer(&act.x, r as u64 * row_bytes, &h.hx, i as u64 * row_bytes, row_bytes);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("head"), timestamp_writes: None });
            dispatch(&mut pass, &h.norm.pipeline, &h.norm.bind, None, self.grid_of(h.norm.step, k));
            dispatch(&mut pass, &h.out.pipeline, &h.out.bind, None, self.grid_of(h.out.step, k));
        }
        let vocab = self.head.as_ref().map_or(0, |g| g.out.rows);
        enc.copy_buffer_to_buffer(&h.logits, 0, &h.staging, 0, (k * vocab * 4) as u64);
    }

    /// Records the layers' dispatches in parts of `every` layers (0: all in one), a
    /// compute pass and a command buffer each; every finished part but the last goes to `done`,
    /// the last one's encoder is returned open. `span`: timestamps 0 and 1 at the start of the
    /// first pass and the end of the last.
    fn record_layers(
        &self,
        act: &GpuActivations,
        seqs: &[SeqSpan<'_>],
        n: usize,
        every: usize,
        span: Option<&wgpu::QuerySet>,
        mut done: impl FnMut(wgpu::CommandBuffer),
    ) -> wgpu::CommandEncoder {
        let ctx = &self.ctx;
        let mut enc = ctx.encoder();
        let nl = act.layers.len();
        let mut l0 = 0;
        loop {
            let l1 = if every == 0 { nl } else { (l0 + every).min(nl) };
            {
                let writes = span.filter(|_| l0 == 0 || l1 >= nl).map(|qs| wgpu::ComputePassTimestampWrites {
                    query_set: qs,
                    beginning_of_pass_write_index: (l0 == 0).then_some(0),
                    end_of_pass_write_index: (l1 >= nl).then_some(1),
                });
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("layers"), timestamp_writes: writes });
                self.record(act, seqs, n, l0..l1, |_, pipeline, bind, offset, grid| dispatch(&mut pass, pipeline, bind, offset, grid));
            }
            l0 = l1;
            if l0 >= nl {
                return enc;
            }
            done(std::mem::replace(&mut enc, ctx.encoder()).finish());
        }
    }

    /// A step recorded now with GPU timestamps: per dispatch (each in its own pass), or around
    /// the whole step (with the CPU's set-up, recording and waiting times), in ms.
    fn profiled(
        &self,
        act: &mut GpuActivations,
        hidden: &mut [f32],
        seqs: &[SeqSpan<'_>],
        n: usize,
        prof: Prof,
        wall: Instant,
    ) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        let ctx = &self.ctx;
        let n_dispatch = act.layers.iter().map(|l| l.lists(n).0.len() + l.lists(n).1.len()).sum::<usize>() + self.gpu.len() * seq_dispatches(seqs, self.attention_one(), self.ctx.attention_split);
        let n_queries = if prof == Prof::Span { 2 } else { 2 * n_dispatch as u32 };
        let qs = ctx.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("profile"), ty: wgpu::QueryType::Timestamp, count: n_queries });
        let mut labels: Vec<&'static str> = Vec::new();
        let t_setup = Instant::now();
        let enc = if prof == Prof::Span {
            self.record_layers(act, seqs, n, ctx.submit_layers, Some(&qs), |cb| {
                ctx.queue.submit([cb]);
            })
        } else {
            let mut enc = ctx.encoder();
            let mut i = 0u32;
            self.record(act, seqs, n, 0..act.layers.len(), |label, pipeline, bind, offset, grid| {
                let writes = wgpu::ComputePassTimestampWrites {
                    query_set: &qs,
                    beginning_of_pass_write_index: Some(2 * i),
                    end_of_pass_write_index: Some(2 * i + 1),
                };
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: Some(writes) });
                dispatch(&mut pass, pipeline, bind, offset, grid);
                labels.push(label);
                i += 1;
            });
            enc
        };
        let mut enc = enc;
        enc.copy_buffer_to_buffer(&act.x, 0, &act.staging, 0, (n * self.config.n_embd * 4) as u64);
        ctx.queue.submit([enc.finish()]);
        let t_submitted = Instant::now();
        ctx.read_mapped(&act.staging, (hidden.len() * 4) as u64, |b| hidden.copy_from_slice(bytemuck::cast_slice(b)))?;
        let t_read = Instant::now();

        let bytes = 8 * n_queries as u64;
        let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = ctx.encoder();
        enc.resolve_query_set(&qs, 0..n_queries, &resolved, 0);
        let mut ticks = vec![0u64; n_queries as usize];
        ctx.map_read(enc, &resolved, 0, &ctx.staging("timestamps", bytes), bytes, |b| ticks.copy_from_slice(bytemuck::cast_slice(b)))?;
        let ns_per_tick = f64::from(ctx.queue.get_timestamp_period());
        let gpu_ms = |t: &[u64]| t[1].saturating_sub(t[0]) as f64 * ns_per_tick / 1e6;
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        if prof == Prof::Span {
            return Ok(Some(vec![
                ("GPU span of the step", gpu_ms(&ticks)),
                ("CPU: set-up", ms(wall, t_setup)),
                ("CPU: recording + submitting", ms(t_setup, t_submitted)),
                ("CPU: waiting + reading back", ms(t_submitted, t_read)),
                ("wall until read back", ms(wall, t_read)),
            ]));
        }
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for (label, t) in labels.iter().zip(ticks.chunks_exact(2)) {
            match out.iter_mut().find(|(l, _)| l == label) {
                Some((_, total)) => *total += gpu_ms(t),
                None => out.push((label, gpu_ms(t))),
            }
        }
        Ok(Some(out))
    }

    /// Hands every dispatch of a step to `emit` in order: (label, pipeline, bind group, dynamic
    /// parameter offset, grid).
    fn record<'a>(
        &'a self,
        act: &'a GpuActivations,
        seqs: &'a [SeqSpan<'_>],
        n: usize,
        layers: Range<usize>,
        mut emit: impl FnMut(&'static str, &'a wgpu::ComputePipeline, &'a wgpu::BindGroup, Option<u32>, (u32, u32)),
    ) {
        for (li, ld) in act.layers.iter().enumerate().take(layers.end).skip(layers.start) {
            // a sliding-window layer's sequences read the second set of slots (write_inputs)
            let set = if self.windowed(li) { act.max_tokens } else { 0 };
            let seq_offset = |i: usize| ((act.n_fixed + set + i) as u64 * act.slot_stride) as u32;
            let (pre, post) = ld.lists(n);
            for d in pre {
                let (pipeline, bind) = self.pick(d, n);
                emit(d.label, pipeline, bind, None, self.grid_of(d.step, n));
            }
            // one token: its sequence's q|k|v matmul does RoPE + KV store (plan.rs, kv.rs)
            let rope = match (n, &ld.qkv_rope) {
                (1, Some(q)) => seqs.iter().enumerate().find(|(_, s)| s.n_tok == 1).and_then(|(i, s)| gpu_kv(s).qkv_rope_bind(li).map(|b| (i, q, b))),
                _ => None,
            };
            if let Some((i, q, bind)) = rope {
                emit("norm + matvec qkv + rope + kv store", &q.kernel.pipeline, bind, Some(seq_offset(i)), self.grid_of(q.step, 1));
            }
            // one token with split attention: the o projection folds the partials (plan.rs), no merge
            let split = self.ctx.attention_split;
            let merge = match (n, &ld.o_merge) {
                (1, Some(m)) => seqs.iter().enumerate().find(|(_, s)| s.n_tok == 1 && split_chunks(split, s) > 1).and_then(|(i, s)| gpu_kv(s).o_merge_bind(li).map(|b| (i, m, b))),
                _ => None,
            };
            record_seqs(self.attention_one(), split, rope.is_some(), merge.is_some(), &self.ctx, &self.config, seqs, li, |label, pipeline, bind, i, grid| emit(label, pipeline, bind, Some(seq_offset(i)), grid));
            for (j, d) in post.iter().enumerate() {
                match merge {
                    Some((i, m, bind)) if j == m.at => emit("matvec o + merge + add", &m.kernel.pipeline, bind, Some(seq_offset(i)), self.grid_of(m.step, 1)),
                    _ => {
                        let (pipeline, bind) = self.pick(d, n);
                        emit(d.label, pipeline, bind, None, self.grid_of(d.step, n))
                    }
                }
            }
        }
    }
}

pub(super) fn dispatch(pass: &mut wgpu::ComputePass<'_>, pipeline: &wgpu::ComputePipeline, bind: &wgpu::BindGroup, offset: Option<u32>, grid: (u32, u32)) {
    pass.set_pipeline(pipeline);
    match offset {
        Some(o) => pass.set_bind_group(0, bind, &[o]),
        None => pass.set_bind_group(0, bind, &[]),
    }
    pass.dispatch_workgroups(grid.0, grid.1, 1);
}
