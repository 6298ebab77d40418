// The extension module procap.kernels._C: operator schemas of the `procap` namespace.
//
// Importing the shared library runs the static registrations (TORCH_LIBRARY here, TORCH_LIBRARY_IMPL in the
// CPU/CUDA files); afterwards the ops are torch.ops.procap.*. Python needs a module init symbol to import the
// library at all, so PyInit__C creates an empty module (no pybind11: keeps the build small and fast).
#include <Python.h>
#include <torch/library.h>

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "ProCap C++/CUDA ops, see torch.ops.procap", -1,
                                   nullptr};
  return PyModule_Create(&module_def);
}

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
