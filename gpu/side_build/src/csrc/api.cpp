// Op registration laid out like FlashMLA's csrc/api: the namespace and the
// module init symbol are hard-coded as _flashmla_C, so a second copy loaded in
// the same process would collide with the shipped module unless renamed.
// (FlashMLA uses STABLE_TORCH_LIBRARY; plain TORCH_LIBRARY behaves the same
// for namespace registration and is what torch 2.11 offers without the stable
// tensor API.)
#include <Python.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

at::Tensor scaled_add_cuda(const at::Tensor& q, const at::Tensor& kv, double scale, int64_t kv_mult);

// One source stands in for both sides: the stock FlashMLA schema (no
// mega_num_splits, as vLLM 0.31.0 ships it) and the split-KV fork's. Which
// one is compiled follows this module's own name, so the kernel stage's
// rename (_flashmla_C -> _flashmla_splitkv_C) is what turns the fork's
// argument on. Only the renamed name has a definition below; an undefined
// name in #if counts as 0.
#define FLASHMLA_MODULE _flashmla_C
#define SPLITKV_SCHEMA_IN__flashmla_splitkv_C 1
#define FLASHMLA_CAT_(a, b) a##b
#define FLASHMLA_CAT(a, b) FLASHMLA_CAT_(a, b)
#if FLASHMLA_CAT(SPLITKV_SCHEMA_IN_, FLASHMLA_MODULE)
#define FLASHMLA_HAS_SPLITKV 1
#else
#define FLASHMLA_HAS_SPLITKV 0
#endif

namespace {
// Kept as one used array, not a literal passed inline: gcc -O3 may build an
// inlined std::string from overlapping 16-byte pieces of a literal, and then
// the schema is not in the binary verbatim for the CUDA-free smoke check
// (elf_smoke.py) to read.
#if FLASHMLA_HAS_SPLITKV
[[gnu::used]] constexpr char kDecodeSchema[] =
    "fused_norm_rope_attn_rope_cast_decode(Tensor q, Tensor kv, float softmax_scale, int mega_num_splits=1) -> Tensor[]";
#else
[[gnu::used]] constexpr char kDecodeSchema[] =
    "fused_norm_rope_attn_rope_cast_decode(Tensor q, Tensor kv, float softmax_scale) -> Tensor[]";
#endif

#if FLASHMLA_HAS_SPLITKV
std::vector<at::Tensor> fused_decode(const at::Tensor& q, const at::Tensor& kv, double softmax_scale,
                                     int64_t mega_num_splits) {
  TORCH_CHECK(mega_num_splits >= 1, "mega_num_splits must be >= 1");
  return {scaled_add_cuda(q, kv, softmax_scale, mega_num_splits)};
}
#else
std::vector<at::Tensor> fused_decode(const at::Tensor& q, const at::Tensor& kv, double softmax_scale) {
  return {scaled_add_cuda(q, kv, softmax_scale, 1)};
}
#endif
}  // namespace

TORCH_LIBRARY(_flashmla_C, m) {
  m.def(kDecodeSchema);
}

TORCH_LIBRARY_IMPL(_flashmla_C, CUDA, m) {
  m.impl("fused_norm_rope_attn_rope_cast_decode", &fused_decode);
}

// An abi3 module has no pybind11: the init function only has to exist so
// `import vllm._flashmla_C` runs the static registrations above.
PyMODINIT_FUNC PyInit__flashmla_C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_flashmla_C", nullptr, 0, nullptr};
  return PyModule_Create(&module);
}
