// The one translation unit: every op family's kernels (hipcc --genco at build time for AMD,
// nvcc --cubin at run time for NVIDIA; see src/backend/hip/module.rs).
#include "common.h"
#include "quants.hip"
#include "matmul.hip"
#include "norm.hip"
#include "rope.hip"
#include "attention.hip"
#include "elementwise.hip"
