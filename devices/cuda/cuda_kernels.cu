// The built-in kernels on CUDA devices (see cuda_kernels.hpp). Every kernel
// is a grid-stride loop with 64-bit indices, so any `n` works whatever the
// grid. Arithmetic uses the explicitly rounded intrinsics (__fmul_rn,
// __fadd_rn, __dadd_rn, __double2float_rn), which nvcc never contracts into
// a fused multiply-add: the results match the CPU's bit for bit.
#include "devices/cuda/cuda_kernels.hpp"

#include <cuda_runtime.h>

namespace multidev::detail::cuda::kernels {

namespace {

constexpr unsigned threads_per_block = 256;
/// Enough blocks to fill any current GPU many times over; larger ranges are
/// covered by the grid-stride loops.
constexpr std::size_t max_blocks = 65535;

unsigned blocks_for(std::size_t n) {
  std::size_t b = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(b < max_blocks ? b : max_blocks);
}

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

__global__ void fill_kernel(float* dst, std::size_t n, float value) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    dst[i] = value;
}

__global__ void iota_kernel(float* dst, std::size_t n, double start) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    dst[i] = __double2float_rn(__dadd_rn(start, static_cast<double>(i)));
}

__global__ void scale_kernel(float* dst, std::size_t n, float factor) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    dst[i] = __fmul_rn(dst[i], factor);
}

__global__ void axpy_kernel(float* y, float a, const float* x, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}

__global__ void add_kernel(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    dst[i] = __fadd_rn(dst[i], src[i]);
}

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

int launched() {
  return static_cast<int>(cudaGetLastError());
}

} // namespace

int fill(float* dst, std::size_t n, float value, void* stream) {
  if (n == 0)
    return 0;
  fill_kernel<<<blocks_for(n), threads_per_block, 0, as_stream(stream)>>>(dst, n, value);
  return launched();
}

int iota(float* dst, std::size_t n, double start, void* stream) {
  if (n == 0)
    return 0;
  iota_kernel<<<blocks_for(n), threads_per_block, 0, as_stream(stream)>>>(dst, n, start);
  return launched();
}

int scale(float* dst, std::size_t n, float factor, void* stream) {
  if (n == 0)
    return 0;
  scale_kernel<<<blocks_for(n), threads_per_block, 0, as_stream(stream)>>>(dst, n, factor);
  return launched();
}

int axpy(float* y, float a, const float* x, std::size_t n, void* stream) {
  if (n == 0)
    return 0;
  axpy_kernel<<<blocks_for(n), threads_per_block, 0, as_stream(stream)>>>(y, a, x, n);
  return launched();
}

int add(float* dst, const float* src, std::size_t n, void* stream) {
  if (n == 0)
    return 0;
  add_kernel<<<blocks_for(n), threads_per_block, 0, as_stream(stream)>>>(dst, src, n);
  return launched();
}

int spin(int64_t ns, void* stream) {
  if (ns <= 0)
    return 0;
  spin_kernel<<<1, 1, 0, as_stream(stream)>>>(static_cast<unsigned long long>(ns));
  return launched();
}

} // namespace multidev::detail::cuda::kernels
