//! Compiling one WGSL kernel: its bind group layout from the binding kinds, the shader module
//! (naga's bounds checks kept or dropped) and the compute pipeline, with validation errors
//! returned rather than raised. Depends on nothing else of the backend but its error type.

use super::WgpuError;

/// Threads per workgroup of the element-wise kernels (embed, rope, kv_store, silu_mul, add).
pub const WG: u32 = 256;

/// A compute pipeline and the layout of its one bind group.
#[derive(Clone)]
pub(crate) struct Kernel {
    /// the compiled compute pipeline
    pub pipeline: wgpu::ComputePipeline,
    /// layout of its bind group 0
    pub layout: wgpu::BindGroupLayout,
    /// Binding 0 (the parameters) takes a dynamic offset in `set_bind_group`.
    pub dynamic: bool,
}

/// Binding kinds of a kernel's bind group, in binding order.
#[derive(Clone, Copy)]
pub(crate) enum B {
    Uniform,
    /// a uniform bound with a dynamic offset
    UniformDyn,
    Read,
    Rw,
}

/// Compiles kernel `name`; `checks`: keep naga's bounds checks ([`WgpuOptions::shader_checks`](super::WgpuOptions::shader_checks)).
pub(crate) fn kernel(device: &wgpu::Device, name: &str, src: &str, binds: &[B], checks: bool) -> Result<Kernel, WgpuError> {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = binds
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match b {
                    B::Uniform | B::UniformDyn => wgpu::BufferBindingType::Uniform,
                    B::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    B::Rw => wgpu::BufferBindingType::Storage { read_only: false },
                },
                has_dynamic_offset: matches!(b, B::UniformDyn),
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(name), entries: &entries });
    kernel_on(device, name, src, layout, matches!(binds.first(), Some(B::UniformDyn)), checks)
}

/// The shader module of `src`; `checks`: keep naga's bounds checks (else dropped, see the SAFETY
/// note). Also the cooperative-matrix probes' (coop_probe.rs).
pub(crate) fn shader_module(device: &wgpu::Device, label: Option<&str>, src: &str, checks: bool) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor { label, source: wgpu::ShaderSource::Wgsl(src.into()) };
    if checks {
        return device.create_shader_module(desc);
    }
    let mut checks = wgpu::ShaderRuntimeChecks::checked();
    checks.bounds_checks = false;
    // SAFETY: only naga's injected index clamps are dropped (the Vulkan / Metal / DX12 robust
    // buffer access of the platform stays on, as does loop bounding). Every index in these
    // kernels is derived from parameters the host validated against the buffer sizes, and
    // every kernel is tested against the CPU reference on each adapter. The clamps cost ALU
    // on every storage access of the matmul inner loops. `WgpuOptions::shader_checks` restores them.
    unsafe { device.create_shader_module_trusted(desc, checks) }
}

/// Compiles kernel `name` on an existing bind group layout (a kernel that takes another's bind
/// groups); `dynamic`: binding 0 takes a dynamic offset.
pub(crate) fn kernel_on(device: &wgpu::Device, name: &str, src: &str, layout: wgpu::BindGroupLayout, dynamic: bool, checks: bool) -> Result<Kernel, WgpuError> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = shader_module(device, Some(name), src, checks);
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(name),
        layout: Some(&pl),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(WgpuError::Shader { kernel: name.to_string(), msg: e.to_string() });
    }
    Ok(Kernel { pipeline, layout, dynamic })
}
