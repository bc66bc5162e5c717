//! [`Runtime`] on AMD GPUs through HIP: `hip-sys`'s types for the API, `libamdhip64.so` opened at
//! run time, so a binary built with the `hip` feature still starts (and says why there is no
//! dGPU) where ROCm is not installed. Return codes are read as integers, not as `hip-sys`'s
//! `hipError_t` enum: a runtime newer than its bindings may return codes the enum lacks.
//! The code objects come from build.rs (`hipcc --genco` for every target listed there).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use hip_sys::hiprt::{hipDeviceptr_t, hipError_t, hipFunction_t, hipGraphExec_t, hipGraph_t, hipModule_t, hipStream_t};
use libloading::Library;

use super::runtime::{DevPtr, Func, Platform, Runtime};
use super::HipError;

type HipResult = c_int;
const STREAM_NON_BLOCKING: c_uint = 1;
/// hipStreamCaptureModeThreadLocal
const CAPTURE_THREAD_LOCAL: c_int = 1;

struct Api {
    get_error_string: unsafe extern "C" fn(HipResult) -> *const c_char,
    stream_synchronize: unsafe extern "C" fn(hipStream_t) -> HipResult,
    module_load_data: unsafe extern "C" fn(*mut hipModule_t, *const c_void) -> HipResult,
    module_get_function: unsafe extern "C" fn(*mut hipFunction_t, hipModule_t, *const c_char) -> HipResult,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipResult,
    free: unsafe extern "C" fn(*mut c_void) -> HipResult,
    memcpy_htod: unsafe extern "C" fn(hipDeviceptr_t, *mut c_void, usize, hipStream_t) -> HipResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, hipDeviceptr_t, usize, hipStream_t) -> HipResult,
    memcpy_dtod: unsafe extern "C" fn(hipDeviceptr_t, hipDeviceptr_t, usize, hipStream_t) -> HipResult,
    memset_d8: unsafe extern "C" fn(hipDeviceptr_t, u8, usize, hipStream_t) -> HipResult,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        hipFunction_t,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        hipStream_t,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipResult,
    stream_begin_capture: unsafe extern "C" fn(hipStream_t, c_int) -> HipResult,
    stream_end_capture: unsafe extern "C" fn(hipStream_t, *mut hipGraph_t) -> HipResult,
    graph_instantiate: unsafe extern "C" fn(*mut hipGraphExec_t, hipGraph_t, *mut c_void, *mut c_char, usize) -> HipResult,
    graph_launch: unsafe extern "C" fn(hipGraphExec_t, hipStream_t) -> HipResult,
    graph_exec_destroy: unsafe extern "C" fn(hipGraphExec_t) -> HipResult,
    graph_destroy: unsafe extern "C" fn(hipGraph_t) -> HipResult,
}

pub struct AmdRuntime {
    api: Api,
    stream: hipStream_t,
    name: String,
    total: u64,
    _lib: Library,
}

// SAFETY: HIP's API is thread-safe and every thread's current device defaults to device 0, the one
// used; the stream handle is only passed to HIP.
unsafe impl Send for AmdRuntime {}
// SAFETY: as above; nothing is mutated after construction.
unsafe impl Sync for AmdRuntime {}

/// # Safety
/// `T` must be the symbol's real signature.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, HipError> {
    let cname = format!("{name}\0");
    // SAFETY: the caller guarantees the signature; the library is kept alive by the runtime.
    unsafe { lib.get::<T>(cname.as_bytes()).map(|s| *s).map_err(|e| HipError::Unavailable(format!("libamdhip64 has no {name}: {e}"))) }
}

impl AmdRuntime {
    /// Opens libamdhip64 and device 0; every failure is an `Unavailable` reason.
    pub fn open() -> Result<AmdRuntime, HipError> {
        // SAFETY: loading the HIP runtime library runs its initializers, which is what it is for.
        let lib = unsafe { Library::new("libamdhip64.so.5").or_else(|_| Library::new("libamdhip64.so")) }
            .map_err(|e| HipError::Unavailable(format!("no HIP runtime (libamdhip64.so: {e})")))?;
        // SAFETY: the signatures are HIP's (hip_runtime_api.h, as hip-sys declares them), with the
        // return type read as an integer.
        unsafe {
            let init: unsafe extern "C" fn(c_uint) -> HipResult = sym(&lib, "hipInit")?;
            let get_device_count: unsafe extern "C" fn(*mut c_int) -> HipResult = sym(&lib, "hipGetDeviceCount")?;
            let device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipResult = sym(&lib, "hipDeviceGetName")?;
            let device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> HipResult = sym(&lib, "hipDeviceTotalMem")?;
            let stream_create: unsafe extern "C" fn(*mut hipStream_t, c_uint) -> HipResult = sym(&lib, "hipStreamCreateWithFlags")?;
            let api = Api {
                get_error_string: sym(&lib, "hipGetErrorString")?,
                stream_synchronize: sym(&lib, "hipStreamSynchronize")?,
                module_load_data: sym(&lib, "hipModuleLoadData")?,
                module_get_function: sym(&lib, "hipModuleGetFunction")?,
                malloc: sym(&lib, "hipMalloc")?,
                free: sym(&lib, "hipFree")?,
                memcpy_htod: sym(&lib, "hipMemcpyHtoDAsync")?,
                memcpy_dtoh: sym(&lib, "hipMemcpyDtoHAsync")?,
                memcpy_dtod: sym(&lib, "hipMemcpyDtoDAsync")?,
                memset_d8: sym(&lib, "hipMemsetD8Async")?,
                launch_kernel: sym(&lib, "hipModuleLaunchKernel")?,
                stream_begin_capture: sym(&lib, "hipStreamBeginCapture")?,
                stream_end_capture: sym(&lib, "hipStreamEndCapture")?,
                graph_instantiate: sym(&lib, "hipGraphInstantiate")?,
                graph_launch: sym(&lib, "hipGraphLaunch")?,
                graph_exec_destroy: sym(&lib, "hipGraphExecDestroy")?,
                graph_destroy: sym(&lib, "hipGraphDestroy")?,
            };
            let r = init(0);
            let mut count = 0;
            let r = if r == 0 { get_device_count(&mut count) } else { r };
            if r == hipError_t::hipErrorNoDevice as c_int || (r == 0 && count == 0) {
                return Err(HipError::Unavailable("no AMD GPU (the HIP runtime reports none)".into()));
            }
            if r != 0 {
                return Err(HipError::Unavailable(format!("no usable AMD GPU (HIP runtime present: {})", error_string(&api, r))));
            }
            let mut buf = [0 as c_char; 256];
            device_get_name(buf.as_mut_ptr(), buf.len() as c_int, 0);
            let name = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let mut total = 0usize;
            device_total_mem(&mut total, 0);
            let mut stream = std::ptr::null_mut();
            let r = stream_create(&mut stream, STREAM_NON_BLOCKING);
            if r != 0 {
                return Err(HipError::Unavailable(format!("hipStreamCreateWithFlags: {}", error_string(&api, r))));
            }
            Ok(AmdRuntime { api, stream, name, total: total as u64, _lib: lib })
        }
    }

    fn check(&self, call: &'static str, r: HipResult) -> Result<(), HipError> {
        if r == 0 {
            return Ok(());
        }
        Err(HipError::Api { call, code: r, message: error_string(&self.api, r) })
    }
}

fn error_string(api: &Api, r: HipResult) -> String {
    // SAFETY: hipGetErrorString returns a static string for any code.
    let p = unsafe { (api.get_error_string)(r) };
    if p.is_null() {
        return format!("HIP error {r}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    format!("{} (HIP error {r})", unsafe { CStr::from_ptr(p) }.to_string_lossy())
}

impl Runtime for AmdRuntime {
    fn platform(&self) -> Platform {
        Platform::Amd
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> String {
        self.name.clone()
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn load_module(&self, image: &[u8]) -> Result<usize, HipError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: image is a code object bundle alive for the call.
        self.check("hipModuleLoadData", unsafe { (self.api.module_load_data)(&mut m, image.as_ptr() as *const c_void) })?;
        Ok(m as usize)
    }

    fn function(&self, module: usize, name: &str) -> Result<Func, HipError> {
        let cname = CString::new(name).map_err(|_| HipError::Unsupported(format!("kernel name {name:?}")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: module came from load_module; cname is NUL-terminated.
        self.check("hipModuleGetFunction", unsafe { (self.api.module_get_function)(&mut f, module as hipModule_t, cname.as_ptr()) })
            .map_err(|e| HipError::Unsupported(format!("kernel {name}: {e}")))?;
        Ok(Func(f as usize))
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr, HipError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: plain device allocation.
        self.check("hipMalloc", unsafe { (self.api.malloc)(&mut p, bytes) })?;
        Ok(p as DevPtr)
    }

    fn free(&self, p: DevPtr) {
        // SAFETY: p came from alloc and is freed once (DevBuf's drop).
        unsafe { (self.api.free)(p as *mut c_void) };
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<(), HipError> {
        // SAFETY: src is valid for its length; synchronized below so the caller may reuse it.
        self.check("hipMemcpyHtoDAsync", unsafe { (self.api.memcpy_htod)(dst as hipDeviceptr_t, src.as_ptr() as *mut c_void, src.len(), self.stream) })?;
        self.sync()
    }

    fn download(&self, dst: &mut [u8], src: DevPtr) -> Result<(), HipError> {
        // SAFETY: dst is valid for its length; the stream is synchronized before it is read.
        self.check("hipMemcpyDtoHAsync", unsafe { (self.api.memcpy_dtoh)(dst.as_mut_ptr() as *mut c_void, src as hipDeviceptr_t, dst.len(), self.stream) })?;
        self.sync()
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), HipError> {
        // SAFETY: device addresses of live buffers of at least `bytes`.
        self.check("hipMemcpyDtoDAsync", unsafe { (self.api.memcpy_dtod)(dst as hipDeviceptr_t, src as hipDeviceptr_t, bytes, self.stream) })
    }

    fn memset(&self, dst: DevPtr, value: u8, bytes: usize) -> Result<(), HipError> {
        // SAFETY: a live device buffer of at least `bytes`.
        self.check("hipMemsetD8Async", unsafe { (self.api.memset_d8)(dst as hipDeviceptr_t, value, bytes, self.stream) })
    }

    fn launch(&self, f: Func, grid: [u32; 3], block: [u32; 3], shared: u32, params: &mut [*mut c_void]) -> Result<(), HipError> {
        // SAFETY: params point at argument slots matching the kernel's parameters (kernels.rs).
        self.check("hipModuleLaunchKernel", unsafe {
            (self.api.launch_kernel)(
                f.0 as hipFunction_t,
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

    fn set_shared_limit(&self, _f: Func, bytes: u32) -> Result<(), HipError> {
        // only the NVIDIA tensor-core tiles ask for more than the default (Kernels::load)
        Err(HipError::Unsupported(format!("{bytes} bytes of dynamic shared memory on AMD")))
    }

    fn sync(&self) -> Result<(), HipError> {
        // SAFETY: our stream.
        self.check("hipStreamSynchronize", unsafe { (self.api.stream_synchronize)(self.stream) })
    }

    fn begin_capture(&self) -> Result<(), HipError> {
        // SAFETY: our stream; ended by end_capture.
        self.check("hipStreamBeginCapture", unsafe { (self.api.stream_begin_capture)(self.stream, CAPTURE_THREAD_LOCAL) })
    }

    fn end_capture(&self) -> Result<usize, HipError> {
        let mut g = std::ptr::null_mut();
        // SAFETY: ends the capture begun on our stream; the graph is destroyed once instantiated.
        unsafe {
            self.check("hipStreamEndCapture", (self.api.stream_end_capture)(self.stream, &mut g))?;
            let mut exec = std::ptr::null_mut();
            let r = (self.api.graph_instantiate)(&mut exec, g, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            (self.api.graph_destroy)(g);
            self.check("hipGraphInstantiate", r)?;
            Ok(exec as usize)
        }
    }

    fn launch_graph(&self, graph: usize) -> Result<(), HipError> {
        // SAFETY: an executable graph from end_capture, not yet dropped.
        self.check("hipGraphLaunch", unsafe { (self.api.graph_launch)(graph as hipGraphExec_t, self.stream) })
    }

    fn drop_graph(&self, graph: usize) {
        // SAFETY: from end_capture, dropped once.
        unsafe { (self.api.graph_exec_destroy)(graph as hipGraphExec_t) };
    }
}
