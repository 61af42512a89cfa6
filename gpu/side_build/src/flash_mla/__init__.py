# FlashMLA's package imports its extension by the hard-coded name here, outside
# csrc/ and setup.py, so the kernel stage's rename does not reach it; the side
# module is loaded as vllm._flashmla_splitkv_C instead, never through this package.
