// A tiny real GPU computation standing in for the attention kernel:
// out = q * scale + kv * kv_mult, so each namespace's op gives a distinct,
// checkable result.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace {
__global__ void scaled_add_kernel(const float* q, const float* kv, float* out, float scale,
                                  float kv_mult, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = q[i] * scale + kv[i] * kv_mult;
}
}  // namespace

at::Tensor scaled_add_cuda(const at::Tensor& q, const at::Tensor& kv, double scale, int64_t kv_mult) {
  TORCH_CHECK(q.is_cuda() && kv.is_cuda(), "q and kv must be CUDA tensors");
  TORCH_CHECK(q.scalar_type() == at::kFloat && kv.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(q.sizes() == kv.sizes(), "q and kv must have the same shape");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor qc = q.contiguous(), kc = kv.contiguous();
  at::Tensor out = at::empty_like(qc);
  const int64_t n = qc.numel();
  if (n > 0) {
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    scaled_add_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        qc.data_ptr<float>(), kc.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(scale),
        static_cast<float>(kv_mult), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}
