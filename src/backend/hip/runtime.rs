//! The HIP tier's one small runtime interface, [`Runtime`]: load a code object, get a function,
//! allocate, copy, launch, synchronize. Two implementations: `hip-sys`'s HIP API on AMD
//! (`amd.rs`, feature `hip`) and the CUDA driver API on NVIDIA (`cuda.rs`); the rest of the
//! backend is the same code on both. Both open their library at run time (`libamdhip64.so`,
//! `libcuda.so.1`), so a binary runs unchanged where neither exists.
//!
//! All work goes to one stream per runtime, in order; [`Runtime::download`] and
//! [`Runtime::sync`] wait for it.

use std::ffi::c_void;
use std::sync::Arc;

use super::HipError;

/// A device address.
pub type DevPtr = u64;

/// A kernel of a loaded module (`hipFunction_t` / `CUfunction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Func(pub(super) usize);

/// Which GPU vendor's API a runtime drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// HIP on an AMD GPU (libamdhip64).
    Amd,
    /// The same kernels on an NVIDIA GPU through the CUDA driver API (libcuda).
    Nvidia,
}

/// What the HIP tier needs from a GPU API.
pub trait Runtime: Send + Sync {
    fn platform(&self) -> Platform;
    /// e.g. "NVIDIA H100 80GB HBM3".
    fn device_name(&self) -> String;
    /// The kernels' target: "sm_90", "gfx90a" (or the device's name where the API gives no arch).
    fn arch(&self) -> String;
    /// Device memory, bytes.
    fn total_memory(&self) -> u64;
    /// Loads a code object (AMD bundle, cubin) and returns its module.
    fn load_module(&self, image: &[u8]) -> Result<usize, HipError>;
    fn function(&self, module: usize, name: &str) -> Result<Func, HipError>;
    fn alloc(&self, bytes: usize) -> Result<DevPtr, HipError>;
    fn free(&self, p: DevPtr);
    /// Host to device, ordered after earlier work; `src` may be reused when this returns.
    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), HipError>;
    /// Device to host after all earlier work; returns when `dst` holds the bytes.
    fn download(&self, dst: &mut [u8], src: DevPtr) -> Result<(), HipError>;
    /// Device to device, ordered.
    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), HipError>;
    fn memset(&self, dst: DevPtr, value: u8, bytes: usize) -> Result<(), HipError>;
    /// Launches `f`; `params[i]` points at the i-th kernel argument.
    fn launch(&self, f: Func, grid: [u32; 3], block: [u32; 3], shared: u32, params: &mut [*mut c_void]) -> Result<(), HipError>;
    /// Lets `f` launch with up to `bytes` of dynamic shared memory (above the default 48 KiB).
    fn set_shared_limit(&self, f: Func, bytes: u32) -> Result<(), HipError>;
    /// Waits for all work and reports an asynchronous error, if any.
    fn sync(&self) -> Result<(), HipError>;
    /// Starts recording this thread's work on the stream into a graph instead of running it.
    fn begin_capture(&self) -> Result<(), HipError>;
    /// Ends the recording; the graph, ready to launch (`hipGraphExec_t` / `CUgraphExec`).
    fn end_capture(&self) -> Result<usize, HipError>;
    /// Runs a recorded graph on the stream.
    fn launch_graph(&self, graph: usize) -> Result<(), HipError>;
    fn drop_graph(&self, graph: usize);
}

/// A kernel argument.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(DevPtr),
    I32(i32),
    F32(f32),
    U64(u64),
}

impl Arg {
    /// The argument's bytes in an 8-byte slot (little-endian: a 4-byte argument is the slot's
    /// first 4 bytes).
    fn slot(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::I32(v) => v as u32 as u64,
            Arg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// Most arguments any kernel of kernels/hip takes.
const MAX_ARGS: usize = 12;

/// Launches `f` with `args` (no allocation: the slots live on the stack).
pub fn launch(rt: &dyn Runtime, f: Func, grid: [u32; 3], block: [u32; 3], shared: u32, args: &[Arg]) -> Result<(), HipError> {
    if args.len() > MAX_ARGS {
        return Err(HipError::Unsupported(format!("{} kernel arguments (at most {MAX_ARGS})", args.len())));
    }
    let mut slots = [0u64; MAX_ARGS];
    for (s, a) in slots.iter_mut().zip(args) {
        *s = a.slot();
    }
    let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
    for (p, s) in ptrs.iter_mut().zip(slots.iter_mut()) {
        *p = s as *mut u64 as *mut c_void;
    }
    rt.launch(f, grid, block, shared, &mut ptrs[..args.len()])
}

/// Device memory, freed on drop.
pub struct DevBuf {
    rt: Arc<dyn Runtime>,
    ptr: DevPtr,
    bytes: usize,
}

impl DevBuf {
    pub fn new(rt: &Arc<dyn Runtime>, bytes: usize) -> Result<DevBuf, HipError> {
        let ptr = rt.alloc(bytes.max(4))?;
        Ok(DevBuf { rt: rt.clone(), ptr, bytes })
    }

    /// A buffer holding `data`.
    pub fn from_bytes(rt: &Arc<dyn Runtime>, data: &[u8]) -> Result<DevBuf, HipError> {
        let b = DevBuf::new(rt, data.len())?;
        rt.upload(b.ptr, data)?;
        Ok(b)
    }

    pub fn from_f32(rt: &Arc<dyn Runtime>, data: &[f32]) -> Result<DevBuf, HipError> {
        DevBuf::from_bytes(rt, bytemuck::cast_slice(data))
    }

    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> DevPtr {
        self.ptr + offset as u64
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn read_f32(&self, out: &mut [f32]) -> Result<(), HipError> {
        if out.len() * 4 > self.bytes {
            return Err(HipError::Unsupported(format!("reading {} floats from a buffer of {} bytes", out.len(), self.bytes)));
        }
        self.rt.download(bytemuck::cast_slice_mut(out), self.ptr)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        self.rt.free(self.ptr);
    }
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}
