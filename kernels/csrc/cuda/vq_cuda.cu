// VQ codebook lookup on CUDA: register-tiled fp32 distances with a running argmin (no N x K matrix in memory).
//
// UNTESTED: written and compile-checked without a GPU (see docs/kernels.md). The dispatch prefers the Triton
// kernel on CUDA and uses this op only for impl="cuda" until a GPU benchmark shows it ahead.
//
// A block of 256 threads owns kRows = 64 latent rows and walks the codebook in tiles of kCodes = 64 codes.
// For each tile the z and code chunks (kDim = 32 dims at a time) are staged in shared memory, transposed so the
// micro-kernel reads both operands as float4-free contiguous columns; each thread accumulates a 4 x 4 block of
// dot products in fp32 registers. Distances use the reference's expansion (||z||^2 + ||e||^2) - 2 z.e with the
// norms precomputed by the same ATen expression as the reference. Each thread keeps (best, index) for its four
// rows; the 16 threads sharing a row reduce through shared memory, breaking ties to the lowest index like
// torch.argmin.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cfloat>
#include <cstdint>

namespace procap {
namespace {

constexpr int kRows = 64;
constexpr int kCodes = 64;
constexpr int kDim = 32;
constexpr int kThreads = 256;  // 16 x 16 threads, each a 4 x 4 micro-tile
constexpr int kMicro = 4;

template <typename scalar_t>
__device__ __forceinline__ float load_f32(const scalar_t* ptr, int64_t offset) {
  return static_cast<float>(ptr[offset]);
}

// Lexicographic (distance, index) order: a smaller distance wins, equal distances go to the lower index.
__device__ __forceinline__ bool better(float dist, int64_t idx, float best, int64_t best_idx) {
  return dist < best || (dist == best && idx < best_idx);
}

template <typename scalar_t>
__global__ void vq_nearest_kernel(const scalar_t* __restrict__ z, const scalar_t* __restrict__ codebook,
                                  const float* __restrict__ zz, const float* __restrict__ ee,
                                  int64_t* __restrict__ indices, int64_t n_rows, int64_t n_codes, int64_t dim) {
  __shared__ float z_tile[kDim][kRows + 1];  // +1: avoid bank conflicts on the transposed stores
  __shared__ float e_tile[kDim][kCodes + 1];
  __shared__ float red_val[kRows][16];
  __shared__ int64_t red_idx[kRows][16];

  const int tx = threadIdx.x % 16;  // code direction
  const int ty = threadIdx.x / 16;  // row direction
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;

  float best[kMicro];
  int64_t best_idx[kMicro];
  float row_norm[kMicro];
  for (int i = 0; i < kMicro; ++i) {
    best[i] = FLT_MAX;
    best_idx[i] = 0;
    const int64_t row = row0 + ty * kMicro + i;
    row_norm[i] = row < n_rows ? zz[row] : 0.f;
  }

  for (int64_t code0 = 0; code0 < n_codes; code0 += kCodes) {
    float acc[kMicro][kMicro] = {};
    for (int64_t d0 = 0; d0 < dim; d0 += kDim) {
      // Stage (kRows x kDim) of z and (kCodes x kDim) of the codebook, zero-padded at the edges.
      for (int t = threadIdx.x; t < kRows * kDim; t += kThreads) {
        const int r = t / kDim, d = t % kDim;
        const int64_t row = row0 + r, col = d0 + d;
        z_tile[d][r] = (row < n_rows && col < dim) ? load_f32(z, row * dim + col) : 0.f;
        const int64_t code = code0 + r;
        e_tile[d][r] = (code < n_codes && col < dim) ? load_f32(codebook, code * dim + col) : 0.f;
      }
      __syncthreads();
#pragma unroll 8
      for (int d = 0; d < kDim; ++d) {
        float a[kMicro], b[kMicro];
        for (int i = 0; i < kMicro; ++i) a[i] = z_tile[d][ty * kMicro + i];
        for (int j = 0; j < kMicro; ++j) b[j] = e_tile[d][tx * kMicro + j];
        for (int i = 0; i < kMicro; ++i)
          for (int j = 0; j < kMicro; ++j) acc[i][j] += a[i] * b[j];
      }
      __syncthreads();
    }
    for (int j = 0; j < kMicro; ++j) {
      const int64_t code = code0 + tx * kMicro + j;
      if (code >= n_codes) break;
      const float code_norm = ee[code];
      for (int i = 0; i < kMicro; ++i) {
        const float dist = __fsub_rn(__fadd_rn(row_norm[i], code_norm), 2.f * acc[i][j]);
        if (better(dist, code, best[i], best_idx[i])) {
          best[i] = dist;
          best_idx[i] = code;
        }
      }
    }
  }

  for (int i = 0; i < kMicro; ++i) {
    red_val[ty * kMicro + i][tx] = best[i];
    red_idx[ty * kMicro + i][tx] = best_idx[i];
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float v = red_val[r][0];
    int64_t idx = red_idx[r][0];
    for (int t = 1; t < 16; ++t) {
      if (better(red_val[r][t], red_idx[r][t], v, idx)) {
        v = red_val[r][t];
        idx = red_idx[r][t];
      }
    }
    if (row0 + r < n_rows) indices[row0 + r] = idx;
  }
}

at::Tensor vq_nearest_cuda(const at::Tensor& z_in, const at::Tensor& codebook_in) {
  TORCH_CHECK(z_in.dim() == 2 && codebook_in.dim() == 2 && z_in.size(1) == codebook_in.size(1),
              "vq_nearest: expected z (N, D) and codebook (K, D), got ", z_in.sizes(), " and ", codebook_in.sizes());
  TORCH_CHECK(codebook_in.size(0) > 0, "vq_nearest: the codebook is empty");
  TORCH_CHECK(z_in.device() == codebook_in.device(), "vq_nearest: z and codebook must be on the same device");
  const c10::cuda::CUDAGuard guard(z_in.device());
  const bool same = z_in.scalar_type() == codebook_in.scalar_type();
  const auto z = (same ? z_in : z_in.to(at::kFloat)).contiguous();
  const auto codebook = (same ? codebook_in : codebook_in.to(at::kFloat)).contiguous();
  const auto z32 = z.to(at::kFloat);
  const auto e32 = codebook.to(at::kFloat);
  const auto zz = (z32 * z32).sum(1).contiguous();  // the reference's expression: bit-identical norms
  const auto ee = (e32 * e32).sum(1).contiguous();
  const int64_t n_rows = z.size(0), n_codes = codebook.size(0), dim = z.size(1);
  auto indices = at::empty({n_rows}, z.options().dtype(at::kLong));
  if (n_rows == 0) return indices;
  const dim3 grid(static_cast<unsigned int>((n_rows + kRows - 1) / kRows));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, z.scalar_type(), "vq_nearest_cuda", [&] {
    vq_nearest_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(
        z.data_ptr<scalar_t>(), codebook.data_ptr<scalar_t>(), zz.data_ptr<float>(), ee.data_ptr<float>(),
        indices.data_ptr<int64_t>(), n_rows, n_codes, dim);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return indices;
}

}  // namespace

TORCH_LIBRARY_IMPL(procap, CUDA, m) { m.impl("vq_nearest", &vq_nearest_cuda); }

}  // namespace procap
