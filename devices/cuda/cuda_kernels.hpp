#pragma once
/// \file
/// Launchers of the built-in kernels on CUDA devices (cuda_kernels.cu). No
/// CUDA header is included: streams are `cudaStream_t` passed as `void*`.
/// Each launcher enqueues its kernel on `stream` and returns the launch's
/// status (`cudaGetLastError()` after the launch, a `cudaError_t` as `int`;
/// 0 is success). An empty range (`n == 0`, or `ns <= 0` for `spin`)
/// launches nothing and returns 0. The results are bit-identical to the CPU
/// kernels in devices/kernels.cpp (no fused multiply-add; `iota` in double).

#include <cstddef>
#include <cstdint>

namespace multidev::detail::cuda::kernels {

/// `dst[i] = value`.
int fill(float* dst, std::size_t n, float value, void* stream);
/// `dst[i] = (float)(start + (double)i)`.
int iota(float* dst, std::size_t n, double start, void* stream);
/// `dst[i] *= factor`.
int scale(float* dst, std::size_t n, float factor, void* stream);
/// `y[i] += a * x[i]` (rounded after the product and after the sum).
int axpy(float* y, float a, const float* x, std::size_t n, void* stream);
/// `dst[i] += src[i]`.
int add(float* dst, const float* src, std::size_t n, void* stream);
/// One device thread busy-waits `ns` nanoseconds (by `%globaltimer`).
int spin(int64_t ns, void* stream);

} // namespace multidev::detail::cuda::kernels
