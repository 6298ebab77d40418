// Multi-granularity masking with axial positional embeddings on the CPU (ATen + at::parallel_for / OpenMP).
//
// Same contract as masking_ref in kernels/masking.py: the mask bit uses the reference's comparisons and the
// output the reference's fp32 additions in the same order, so the forward is bit-identical. The backward keeps
// per-position fp32 sums over the batch (one writer per position: deterministic, no atomics) and reduces them to
// the positional-table gradients with ATen sums.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS  // per-operator headers build much faster than <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

namespace procap {
namespace {

// Elements per parallel task, ATen's own default (at::internal::GRAIN_SIZE, not exported by these headers).
constexpr int64_t kGrainSize = 32768;

// Scheme indices: must equal ENTIRE..OUT_OF_BLOCK in kernels/masking.py (procap.config.MASKING_SCHEMES order;
// tests compare every scheme with the reference). Any other value masks every position ("entire").
constexpr int64_t kRandomPatch = 1;
constexpr int64_t kInBlock = 2;
constexpr int64_t kOutOfBlock = 3;

int64_t row_grain(int64_t dim) { return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(dim, 1)); }

bool masked_at(int64_t scheme, float prob, float u, const int64_t* block, int64_t h, int64_t w) {
  const bool inside = h >= block[0] && h < block[0] + block[2] && w >= block[1] && w < block[1] + block[3];
  switch (scheme) {
    case kRandomPatch: return u < prob;
    case kInBlock: return inside;
    case kOutOfBlock: return !inside;
    default: return true;
  }
}

// (B, N) bool mask from the MaskParams tensors.
at::Tensor build_mask(const at::Tensor& scheme, const at::Tensor& patch_prob, const at::Tensor& uniform,
                      const at::Tensor& block, int64_t grid_h, int64_t grid_w) {
  const auto sch = scheme.to(at::kLong).contiguous();
  const auto prob = patch_prob.to(at::kFloat).contiguous();
  const auto uni = uniform.to(at::kFloat).contiguous();
  const auto blk = block.to(at::kLong).contiguous();
  const int64_t batch = uni.size(0), n_pos = uni.size(1);
  auto mask = at::empty({batch, n_pos}, uni.options().dtype(at::kBool));
  const int64_t* s = sch.data_ptr<int64_t>();
  const float* p = prob.data_ptr<float>();
  const float* u = uni.data_ptr<float>();
  const int64_t* bl = blk.data_ptr<int64_t>();
  bool* m = mask.data_ptr<bool>();
  at::parallel_for(0, batch * n_pos, kGrainSize, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / n_pos, n = r % n_pos;
      m[r] = masked_at(s[b], p[b], u[r], bl + 4 * b, (n / grid_w) % grid_h, n % grid_w);
    }
  });
  return mask;
}

// (N, D) fp32 table pos[(t*H + h)*W + w] = (pos_frame[t] + pos_row[h]) + pos_col[w], the reference's order.
at::Tensor axial_table(const at::Tensor& pos_frame, const at::Tensor& pos_row, const at::Tensor& pos_col) {
  const auto pf = pos_frame.to(at::kFloat).contiguous();
  const auto pr = pos_row.to(at::kFloat).contiguous();
  const auto pc = pos_col.to(at::kFloat).contiguous();
  const int64_t frames = pf.size(0), grid_h = pr.size(0), grid_w = pc.size(0), dim = pf.size(1);
  auto pos = at::empty({frames * grid_h * grid_w, dim}, pf.options());
  const float *f = pf.data_ptr<float>(), *hr = pr.data_ptr<float>(), *wc = pc.data_ptr<float>();
  float* out = pos.data_ptr<float>();
  at::parallel_for(0, frames * grid_h * grid_w, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* fr = f + (n / (grid_h * grid_w)) * dim;
      const float* rr = hr + ((n / grid_w) % grid_h) * dim;
      const float* cr = wc + (n % grid_w) * dim;
      float* o = out + n * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = (fr[d] + rr[d]) + cr[d];
    }
  });
  return pos;
}

template <typename scalar_t>
void fwd_rows(const scalar_t* x, const bool* mask, const float* em, const float* pos, scalar_t* out, int64_t rows,
              int64_t n_pos, int64_t dim) {
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* p = pos + (r % n_pos) * dim;
      const scalar_t* xr = x + r * dim;
      scalar_t* o = out + r * dim;
      if (mask[r]) {
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<scalar_t>(em[d] + p[d]);
      } else {
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<scalar_t>(static_cast<float>(xr[d]) + p[d]);
      }
    }
  });
}

void check_fwd(const at::Tensor& x, const at::Tensor& uniform, const at::Tensor& mask_embedding,
               const at::Tensor& pos_frame, const at::Tensor& pos_row, const at::Tensor& pos_col) {
  TORCH_CHECK(x.dim() == 3, "masking: x must be (B, N, D), got ", x.sizes());
  const int64_t dim = x.size(2);
  TORCH_CHECK(pos_frame.dim() == 2 && pos_row.dim() == 2 && pos_col.dim() == 2 && pos_frame.size(1) == dim &&
                  pos_row.size(1) == dim && pos_col.size(1) == dim && mask_embedding.numel() == dim,
              "masking: positional tables must be (T, D), (H, D), (W, D) and mask_embedding (D,) with D = ", dim);
  TORCH_CHECK(x.size(1) == pos_frame.size(0) * pos_row.size(0) * pos_col.size(0), "masking: x has ", x.size(1),
              " positions, expected T*H*W = ", pos_frame.size(0) * pos_row.size(0) * pos_col.size(0));
  TORCH_CHECK(uniform.dim() == 2 && uniform.size(0) == x.size(0) && uniform.size(1) == x.size(1),
              "masking: uniform must be (B, N) = (", x.size(0), ", ", x.size(1), "), got ", uniform.sizes());
}

std::tuple<at::Tensor, at::Tensor> masking_fwd_cpu(const at::Tensor& x, const at::Tensor& scheme,
                                                   const at::Tensor& patch_prob, const at::Tensor& uniform,
                                                   const at::Tensor& block, const at::Tensor& mask_embedding,
                                                   const at::Tensor& pos_frame, const at::Tensor& pos_row,
                                                   const at::Tensor& pos_col) {
  check_fwd(x, uniform, mask_embedding, pos_frame, pos_row, pos_col);
  const auto xc = x.contiguous();
  const int64_t n_pos = xc.size(1), dim = xc.size(2);
  const auto mask = build_mask(scheme, patch_prob, uniform, block, pos_row.size(0), pos_col.size(0));
  const auto pos = axial_table(pos_frame, pos_row, pos_col);
  const auto em = mask_embedding.to(at::kFloat).contiguous();
  auto out = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "masking_fwd_cpu", [&] {
    fwd_rows<scalar_t>(xc.data_ptr<scalar_t>(), mask.data_ptr<bool>(), em.data_ptr<float>(), pos.data_ptr<float>(),
                       out.data_ptr<scalar_t>(), xc.size(0) * n_pos, n_pos, dim);
  });
  return {out, mask};
}

// For each position n (one writer): grad_x rows, sums[n] = sum_b g and masked_sums[n] = sum_{b masked} g.
template <typename scalar_t>
void bwd_positions(const scalar_t* g, const bool* mask, scalar_t* grad_x, float* sums, float* masked_sums,
                   int64_t batch, int64_t n_pos, int64_t dim) {
  at::parallel_for(0, n_pos, row_grain(dim * batch), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* s = sums + n * dim;
      float* e = masked_sums + n * dim;
      std::fill(s, s + dim, 0.f);
      std::fill(e, e + dim, 0.f);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t r = b * n_pos + n;
        const scalar_t* gr = g + r * dim;
        const bool m = mask[r];
        for (int64_t d = 0; d < dim; ++d) s[d] += static_cast<float>(gr[d]);
        if (m) {
          for (int64_t d = 0; d < dim; ++d) e[d] += static_cast<float>(gr[d]);
        }
        if (grad_x != nullptr) {
          scalar_t* gx = grad_x + r * dim;
          if (m) {
            std::fill(gx, gx + dim, static_cast<scalar_t>(0));
          } else {
            std::copy(gr, gr + dim, gx);
          }
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> masking_bwd_cpu(
    const at::Tensor& grad, const at::Tensor& mask, int64_t num_frames, int64_t grid_h, int64_t grid_w,
    bool need_grad_x) {
  TORCH_CHECK(grad.dim() == 3 && grad.size(1) == num_frames * grid_h * grid_w, "masking_bwd: grad must be (B, ",
              num_frames * grid_h * grid_w, ", D), got ", grad.sizes());
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 2 && mask.size(0) == grad.size(0) &&
                  mask.size(1) == grad.size(1),
              "masking_bwd: mask must be a (B, N) bool tensor");
  const auto gc = grad.contiguous();
  const auto mc = mask.contiguous();
  const int64_t batch = gc.size(0), n_pos = gc.size(1), dim = gc.size(2);
  auto grad_x = need_grad_x ? at::empty_like(gc) : at::empty({0}, gc.options());
  auto sums = at::empty({n_pos, dim}, gc.options().dtype(at::kFloat));
  auto masked_sums = at::empty({n_pos, dim}, gc.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gc.scalar_type(), "masking_bwd_cpu", [&] {
    bwd_positions<scalar_t>(gc.data_ptr<scalar_t>(), mc.data_ptr<bool>(),
                            need_grad_x ? grad_x.data_ptr<scalar_t>() : nullptr, sums.data_ptr<float>(),
                            masked_sums.data_ptr<float>(), batch, n_pos, dim);
  });
  const auto grid = sums.view({num_frames, grid_h, grid_w, dim});
  return {grad_x, masked_sums.sum(0), grid.sum(at::IntArrayRef{1, 2}), grid.sum(at::IntArrayRef{0, 2}),
          grid.sum(at::IntArrayRef{0, 1})};
}

}  // namespace

TORCH_LIBRARY_IMPL(procap, CPU, m) {
  m.impl("masking_fwd", &masking_fwd_cpu);
  m.impl("masking_bwd", &masking_bwd_cpu);
}

}  // namespace procap
