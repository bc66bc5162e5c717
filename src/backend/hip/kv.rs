//! [`HipKv`]: one sequence's keys and values for the layers of a [`super::HipLayers`] segment, in
//! two device buffers `[layers, n_kv_head, capacity, head_dim]` of f16 (the CPU cache's layout per
//! layer). The engine keeps the sequence's length; copying a prefix is one kernel per buffer.

use std::sync::Arc;

use super::runtime::{DevBuf, DevPtr};
use super::{HipContext, HipError};
use crate::backend::offload::{DeviceKv, OffloadError, OffloadKv};

pub struct HipKv {
    ctx: Arc<HipContext>,
    /// the segment this cache belongs to
    pub(super) owner: u64,
    /// positions the cache holds per layer and KV head
    pub(super) capacity: usize,
    n_layers: usize,
    n_kv: usize,
    head_dim: usize,
    /// [n_layers, n_kv, capacity, head_dim] f16
    k: DevBuf,
    /// [n_layers, n_kv, capacity, head_dim] f16
    v: DevBuf,
}

impl HipKv {
    pub(super) fn new(ctx: Arc<HipContext>, owner: u64, n_layers: usize, n_kv: usize, head_dim: usize, capacity: usize) -> Result<HipKv, HipError> {
        let bytes = n_layers * n_kv * capacity * head_dim * 2;
        let (k, v) = {
            let _stream = ctx.lock();
            let k = DevBuf::new(ctx.runtime(), bytes)?;
            let v = DevBuf::new(ctx.runtime(), bytes)?;
            // zeroed: attention never reads past a token's position, but a copy of a prefix may
            // copy positions nobody wrote
            ctx.runtime().memset(k.ptr(), 0, bytes)?;
            ctx.runtime().memset(v.ptr(), 0, bytes)?;
            (k, v)
        };
        Ok(HipKv { ctx, owner, capacity, n_layers, n_kv, head_dim, k, v })
    }

    /// Device addresses of the K and V buffers.
    pub(super) fn ptrs(&self) -> (DevPtr, DevPtr) {
        (self.k.ptr(), self.v.ptr())
    }

    /// Makes positions 0..n equal to those of `src` (a cache of the same segment).
    pub fn copy_prefix(&mut self, src: &HipKv, n: usize) -> Result<(), HipError> {
        if src.owner != self.owner {
            return Err(HipError::Unsupported("copying KV between caches of different layer segments".into()));
        }
        if n > src.capacity || n > self.capacity {
            return Err(HipError::ContextFull { needed: n, capacity: src.capacity.min(self.capacity) });
        }
        if n == 0 {
            return Ok(());
        }
        let (rt, k) = (self.ctx.runtime(), self.ctx.kernels());
        let _stream = self.ctx.lock();
        let lh = self.n_layers * self.n_kv;
        k.kv_copy(&**rt, self.k.ptr(), src.k.ptr(), self.capacity, src.capacity, n, self.head_dim, lh)?;
        k.kv_copy(&**rt, self.v.ptr(), src.v.ptr(), self.capacity, src.capacity, n, self.head_dim, lh)?;
        Ok(())
    }

    /// Keys and values of layer `li` (of the segment), positions 0..n, as f16 bits
    /// `[n_kv, n, head_dim]` each (tests).
    pub fn read_layer(&self, li: usize, n: usize) -> Result<(Vec<u16>, Vec<u16>), HipError> {
        let rt = self.ctx.runtime();
        let _stream = self.ctx.lock();
        let row = self.head_dim * 2;
        let mut out = (vec![0u16; self.n_kv * n * self.head_dim], vec![0u16; self.n_kv * n * self.head_dim]);
        for (buf, dst) in [(&self.k, &mut out.0), (&self.v, &mut out.1)] {
            for h in 0..self.n_kv {
                let at = ((li * self.n_kv + h) * self.capacity) * row;
                let d = &mut dst[h * n * self.head_dim..(h + 1) * n * self.head_dim];
                rt.download(bytemuck::cast_slice_mut(d), buf.at(at))?;
            }
        }
        Ok(out)
    }
}

impl DeviceKv for HipKv {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn bytes(&self) -> u64 {
        (self.k.bytes() + self.v.bytes()) as u64
    }

    fn empty_like(&self, capacity: usize) -> Result<OffloadKv, OffloadError> {
        Ok(OffloadKv::new(HipKv::new(self.ctx.clone(), self.owner, self.n_layers, self.n_kv, self.head_dim, capacity)?))
    }

    fn copy_prefix_from(&mut self, src: &OffloadKv, n: usize) -> Result<(), OffloadError> {
        let src = src.get::<HipKv>().ok_or_else(|| HipError::Unsupported("copying KV from another backend's cache".into()))?;
        Ok(self.copy_prefix(src, n)?)
    }
}
