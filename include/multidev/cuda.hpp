#pragma once
/// \file
/// For closures scheduled on a CUDA device (backend `multidev_cuda`): a
/// closure there runs on the host when its turn to be submitted comes, and
/// launches its device work on the device's stream, which the item's
/// completion follows. No CUDA header is needed to include this one.

namespace multidev {

/// The stream (a `cudaStream_t`) of the CUDA item the calling thread is
/// launching, or null outside one (a CPU device, another thread).
void* current_cuda_stream() noexcept;

} // namespace multidev
