//! [`Runtime`] on NVIDIA GPUs through the CUDA driver API, `libcuda.so.1` opened at run time
//! (nothing links CUDA at build time). The kernels are the same `.hip` sources, compiled by
//! `nvcc` on first use (module.rs). One primary context and one stream on device 0.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use libloading::Library;

use super::runtime::{DevPtr, Func, Platform, Runtime};
use super::HipError;

type CuResult = c_int;
type CuDevice = c_int;
type Handle = *mut c_void;

const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;
const STREAM_NON_BLOCKING: c_uint = 1;
/// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
const FUNC_MAX_DYNAMIC_SHARED: c_int = 8;
/// CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
const CAPTURE_THREAD_LOCAL: c_int = 1;

/// The driver functions used, resolved once.
struct Api {
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(Handle) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CuResult,
    func_set_attribute: unsafe extern "C" fn(Handle, c_int, c_int) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut DevPtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(DevPtr) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(DevPtr, *const c_void, usize, Handle) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, DevPtr, usize, Handle) -> CuResult,
    memcpy_dtod: unsafe extern "C" fn(DevPtr, DevPtr, usize, Handle) -> CuResult,
    memset_d8: unsafe extern "C" fn(DevPtr, u8, usize, Handle) -> CuResult,
    #[allow(clippy::type_complexity)]
    launch_kernel:
        unsafe extern "C" fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void) -> CuResult,
    stream_begin_capture: unsafe extern "C" fn(Handle, c_int) -> CuResult,
    stream_end_capture: unsafe extern "C" fn(Handle, *mut Handle) -> CuResult,
    graph_instantiate: unsafe extern "C" fn(*mut Handle, Handle, u64) -> CuResult,
    graph_launch: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    graph_exec_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    graph_destroy: unsafe extern "C" fn(Handle) -> CuResult,
}

pub struct CudaRuntime {
    api: Api,
    ctx: Handle,
    stream: Handle,
    name: String,
    /// compute capability, e.g. (9, 0)
    cc: (i32, i32),
    total: u64,
    /// keeps the library mapped while `api` points into it
    _lib: Library,
}

// SAFETY: the handles are CUDA driver objects, usable from any thread once the context is made
// current there (`enter` does that before every call); the driver API is thread-safe.
unsafe impl Send for CudaRuntime {}
// SAFETY: as above; nothing here is mutated after construction.
unsafe impl Sync for CudaRuntime {}

thread_local! {
    /// The context this thread made current last (so `enter` calls the driver once per thread).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Resolves `name` from `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the symbol's real signature.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, HipError> {
    let cname = format!("{name}\0");
    // SAFETY: the caller guarantees the signature; the library outlives the copy (kept in the runtime).
    unsafe { lib.get::<T>(cname.as_bytes()).map(|s| *s).map_err(|e| HipError::Unavailable(format!("libcuda has no {name}: {e}"))) }
}

impl CudaRuntime {
    /// Opens libcuda and device 0. Every failure is an `Unavailable` reason, never a panic.
    pub fn open() -> Result<CudaRuntime, HipError> {
        // SAFETY: loading the NVIDIA driver library runs its initializers, which is what it is for.
        let lib = unsafe { Library::new("libcuda.so.1").or_else(|_| Library::new("libcuda.so")) }
            .map_err(|e| HipError::Unavailable(format!("no NVIDIA driver (libcuda.so.1: {e})")))?;
        // SAFETY: each signature below is the CUDA driver API's (cuda.h, 64-bit, the _v2 entry points).
        unsafe {
            let init: unsafe extern "C" fn(c_uint) -> CuResult = sym(&lib, "cuInit")?;
            let device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult = sym(&lib, "cuDeviceGetCount")?;
            let device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult = sym(&lib, "cuDeviceGet")?;
            let device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult = sym(&lib, "cuDeviceGetName")?;
            let device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult = sym(&lib, "cuDeviceGetAttribute")?;
            let device_total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult = sym(&lib, "cuDeviceTotalMem_v2")?;
            let primary_ctx_retain: unsafe extern "C" fn(*mut Handle, CuDevice) -> CuResult = sym(&lib, "cuDevicePrimaryCtxRetain")?;
            let stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult = sym(&lib, "cuStreamCreate")?;
            let api = Api {
                get_error_string: sym(&lib, "cuGetErrorString")?,
                ctx_set_current: sym(&lib, "cuCtxSetCurrent")?,
                stream_synchronize: sym(&lib, "cuStreamSynchronize")?,
                module_load_data: sym(&lib, "cuModuleLoadData")?,
                module_get_function: sym(&lib, "cuModuleGetFunction")?,
                func_set_attribute: sym(&lib, "cuFuncSetAttribute")?,
                mem_alloc: sym(&lib, "cuMemAlloc_v2")?,
                mem_free: sym(&lib, "cuMemFree_v2")?,
                memcpy_htod: sym(&lib, "cuMemcpyHtoDAsync_v2")?,
                memcpy_dtoh: sym(&lib, "cuMemcpyDtoHAsync_v2")?,
                memcpy_dtod: sym(&lib, "cuMemcpyDtoDAsync_v2")?,
                memset_d8: sym(&lib, "cuMemsetD8Async")?,
                launch_kernel: sym(&lib, "cuLaunchKernel")?,
                stream_begin_capture: sym(&lib, "cuStreamBeginCapture_v2")?,
                stream_end_capture: sym(&lib, "cuStreamEndCapture")?,
                graph_instantiate: sym(&lib, "cuGraphInstantiateWithFlags")?,
                graph_launch: sym(&lib, "cuGraphLaunch")?,
                graph_exec_destroy: sym(&lib, "cuGraphExecDestroy")?,
                graph_destroy: sym(&lib, "cuGraphDestroy")?,
            };
            let unavailable = |call: &str, r: CuResult| HipError::Unavailable(format!("{call}: {}", error_string(&api, r)));
            let r = init(0);
            if r != 0 {
                return Err(unavailable("cuInit", r));
            }
            let mut count = 0;
            let r = device_get_count(&mut count);
            if r != 0 || count == 0 {
                return Err(HipError::Unavailable(format!("the NVIDIA driver reports no GPU ({})", error_string(&api, r))));
            }
            let mut dev = 0;
            let r = device_get(&mut dev, 0);
            if r != 0 {
                return Err(unavailable("cuDeviceGet", r));
            }
            let mut buf = [0 as c_char; 256];
            device_get_name(buf.as_mut_ptr(), buf.len() as c_int, dev);
            let name = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let (mut major, mut minor) = (0, 0);
            device_get_attribute(&mut major, ATTR_CC_MAJOR, dev);
            device_get_attribute(&mut minor, ATTR_CC_MINOR, dev);
            let mut total = 0usize;
            device_total_mem(&mut total, dev);
            let mut ctx = std::ptr::null_mut();
            let r = primary_ctx_retain(&mut ctx, dev);
            if r != 0 {
                return Err(unavailable("cuDevicePrimaryCtxRetain", r));
            }
            let r = (api.ctx_set_current)(ctx);
            if r != 0 {
                return Err(unavailable("cuCtxSetCurrent", r));
            }
            let mut stream = std::ptr::null_mut();
            let r = stream_create(&mut stream, STREAM_NON_BLOCKING);
            if r != 0 {
                return Err(unavailable("cuStreamCreate", r));
            }
            Ok(CudaRuntime { api, ctx, stream, name, cc: (major, minor), total: total as u64, _lib: lib })
        }
    }

    /// Makes the context current on this thread (once per thread).
    fn enter(&self) -> Result<(), HipError> {
        if CURRENT.with(|c| c.get()) == self.ctx as usize {
            return Ok(());
        }
        // SAFETY: ctx is the retained primary context.
        self.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(self.ctx) })?;
        CURRENT.with(|c| c.set(self.ctx as usize));
        Ok(())
    }

    fn check(&self, call: &'static str, r: CuResult) -> Result<(), HipError> {
        if r == 0 {
            return Ok(());
        }
        Err(HipError::Api { call, code: r, message: error_string(&self.api, r) })
    }
}

fn error_string(api: &Api, r: CuResult) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
    unsafe {
        if (api.get_error_string)(r, &mut p) == 0 && !p.is_null() {
            return format!("{} (CUDA error {r})", CStr::from_ptr(p).to_string_lossy());
        }
    }
    format!("CUDA error {r}")
}

impl Runtime for CudaRuntime {
    fn platform(&self) -> Platform {
        Platform::Nvidia
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn load_module(&self, image: &[u8]) -> Result<usize, HipError> {
        self.enter()?;
        let mut m = std::ptr::null_mut();
        // SAFETY: image is a cubin that lives for the call (the driver copies it).
        self.check("cuModuleLoadData", unsafe { (self.api.module_load_data)(&mut m, image.as_ptr() as *const c_void) })?;
        Ok(m as usize)
    }

    fn function(&self, module: usize, name: &str) -> Result<Func, HipError> {
        self.enter()?;
        let cname = CString::new(name).map_err(|_| HipError::Unsupported(format!("kernel name {name:?}")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: module came from load_module; cname is NUL-terminated.
        self.check("cuModuleGetFunction", unsafe { (self.api.module_get_function)(&mut f, module as Handle, cname.as_ptr()) })
            .map_err(|e| HipError::Unsupported(format!("kernel {name}: {e}")))?;
        Ok(Func(f as usize))
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr, HipError> {
        self.enter()?;
        let mut p = 0;
        // SAFETY: plain device allocation.
        self.check("cuMemAlloc", unsafe { (self.api.mem_alloc)(&mut p, bytes) })?;
        Ok(p)
    }

    fn free(&self, p: DevPtr) {
        if self.enter().is_ok() {
            // SAFETY: p came from alloc and is freed once (DevBuf's drop); no kernel of ours is left
            // using it: buffers outlive the steps that use them, and the driver waits for pending work.
            unsafe { (self.api.mem_free)(p) };
        }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: from pageable memory the driver stages `src` before returning, so it may be reused.
        self.check("cuMemcpyHtoDAsync", unsafe { (self.api.memcpy_htod)(dst, src.as_ptr() as *const c_void, src.len(), self.stream) })
    }

    fn download(&self, dst: &mut [u8], src: DevPtr) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: dst is valid for its length; the stream is synchronized before dst is read.
        self.check("cuMemcpyDtoHAsync", unsafe { (self.api.memcpy_dtoh)(dst.as_mut_ptr() as *mut c_void, src, dst.len(), self.stream) })?;
        self.sync()
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: device addresses of live buffers of at least `bytes`.
        self.check("cuMemcpyDtoDAsync", unsafe { (self.api.memcpy_dtod)(dst, src, bytes, self.stream) })
    }

    fn memset(&self, dst: DevPtr, value: u8, bytes: usize) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: a live device buffer of at least `bytes`.
        self.check("cuMemsetD8Async", unsafe { (self.api.memset_d8)(dst, value, bytes, self.stream) })
    }

    fn launch(&self, f: Func, grid: [u32; 3], block: [u32; 3], shared: u32, params: &mut [*mut c_void]) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: params point at argument slots matching the kernel's parameters (kernels.rs).
        self.check("cuLaunchKernel", unsafe {
            (self.api.launch_kernel)(
                f.0 as Handle,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn set_shared_limit(&self, f: Func, bytes: u32) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: f came from function(); the attribute takes an int.
        self.check("cuFuncSetAttribute", unsafe { (self.api.func_set_attribute)(f.0 as Handle, FUNC_MAX_DYNAMIC_SHARED, bytes as c_int) })
    }

    fn sync(&self) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: our stream.
        self.check("cuStreamSynchronize", unsafe { (self.api.stream_synchronize)(self.stream) })
    }

    fn begin_capture(&self) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: our stream; ended by end_capture.
        self.check("cuStreamBeginCapture", unsafe { (self.api.stream_begin_capture)(self.stream, CAPTURE_THREAD_LOCAL) })
    }

    fn end_capture(&self) -> Result<usize, HipError> {
        self.enter()?;
        let mut g = std::ptr::null_mut();
        // SAFETY: ends the capture begun on our stream; the graph is destroyed once instantiated.
        unsafe {
            self.check("cuStreamEndCapture", (self.api.stream_end_capture)(self.stream, &mut g))?;
            let mut exec = std::ptr::null_mut();
            let r = (self.api.graph_instantiate)(&mut exec, g, 0);
            (self.api.graph_destroy)(g);
            self.check("cuGraphInstantiate", r)?;
            Ok(exec as usize)
        }
    }

    fn launch_graph(&self, graph: usize) -> Result<(), HipError> {
        self.enter()?;
        // SAFETY: an executable graph from end_capture, not yet dropped.
        self.check("cuGraphLaunch", unsafe { (self.api.graph_launch)(graph as Handle, self.stream) })
    }

    fn drop_graph(&self, graph: usize) {
        if self.enter().is_ok() {
            // SAFETY: from end_capture, dropped once.
            unsafe { (self.api.graph_exec_destroy)(graph as Handle) };
        }
    }
}
