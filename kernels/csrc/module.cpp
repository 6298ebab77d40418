// Operator schemas of the `procap` namespace, compiled with the CPU/CUDA files into one shared library.
//
// procap.kernels._ext compiles it on first use (torch.utils.cpp_extension.load) and loads it with
// torch.ops.load_library: loading runs the static registrations (TORCH_LIBRARY here, TORCH_LIBRARY_IMPL in the
// CPU/CUDA files) and the ops become torch.ops.procap.*. It is a plain library, not a Python module: no module
// init symbol, no pybind11, so the build stays small and fast.
#include <torch/library.h>

TORCH_LIBRARY(procap, m) {
  // out = where(mask, e_m, x) + ((pos_frame[t] + pos_row[h]) + pos_col[w]) in fp32, and the bool mask.
  m.def(
      "masking_fwd(Tensor x, Tensor scheme, Tensor patch_prob, Tensor uniform, Tensor block, "
      "Tensor mask_embedding, Tensor pos_frame, Tensor pos_row, Tensor pos_col) -> (Tensor, Tensor)");
  // (grad_x or an empty tensor, grad_e_m, grad_pos_frame, grad_pos_row, grad_pos_col); the last four in fp32.
  m.def(
      "masking_bwd(Tensor grad, Tensor mask, int num_frames, int grid_h, int grid_w, bool need_grad_x) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // int64 index of the nearest code for every row of z (ties: lowest index).
  m.def("vq_nearest(Tensor z, Tensor codebook) -> Tensor");
}
