# Rendered by lanectl from lanectl's built-in template vllm/Dockerfile.j2: lane h2-REF of recipe dsv41-flash-uva-dspark-sidecar.
# The pinned vLLM image, plus side-built kernels and backported patches; the engine stays the image's `vllm serve`.
# Kernel side extension flashmla-splitkv: built in its own stage, installed beside the shipped module.
FROM vllm/vllm-openai:deepseekv41-flash-0909@sha256:00d577a6a63281e15336029d5bcee4e9a2cf182214a4f20ba6111b1c8e79893d AS kernel-flashmla-splitkv
ENV LANECTL_KERNEL_MODULE="_flashmla_splitkv_C"
ENV LANECTL_KERNEL_OUT="/lanectl/kernel-out"
ENV MAX_JOBS="8"
ENV NVCC_THREADS="4"
COPY kernels/flashmla-splitkv/ /lanectl/kernel-src/
WORKDIR /lanectl/kernel-src
RUN ["/bin/sh", "-euc", "command -v nvcc >/dev/null 2>&1 || { echo \"kernel flashmla-splitkv: the builder image has no nvcc (CUDA toolkit); set builder.image to an image that ships it\" >&2; exit 1; }\npython3 -c 'import os, torch.utils.cpp_extension as e; raise SystemExit(not any(os.path.isfile(os.path.join(p, \"torch\", \"extension.h\")) for p in e.include_paths()))' 2>/dev/null || { echo \"kernel flashmla-splitkv: the builder image has no torch with C++ headers (torch/extension.h); set builder.image to one that has them\" >&2; exit 1; }\nmkdir -p \"$LANECTL_KERNEL_OUT\"\ngrep -rl _flashmla_C csrc setup.py | xargs sed -i 's/_flashmla_C/_flashmla_splitkv_C/g'\nif grep -rn _flashmla_C csrc setup.py; then echo \"_flashmla_C left after the rename\" >&2; exit 1; fi\npython3 setup.py build_ext --inplace\ncp flash_mla/_flashmla_splitkv_C*.so \"$LANECTL_KERNEL_OUT/\"\nfor f in \"$LANECTL_KERNEL_OUT\"/*; do case \"${f##*/}\" in \"$LANECTL_KERNEL_MODULE\".*) ;; *) echo \"kernel flashmla-splitkv: build left ${f##*/} in its output; only $LANECTL_KERNEL_MODULE.* may be installed\" >&2; exit 1;; esac; done\nls \"$LANECTL_KERNEL_OUT\"/\"$LANECTL_KERNEL_MODULE\".* >/dev/null 2>&1 || { echo \"kernel flashmla-splitkv: build produced no $LANECTL_KERNEL_MODULE module\" >&2; exit 1; }"]

FROM vllm/vllm-openai:deepseekv41-flash-0909@sha256:00d577a6a63281e15336029d5bcee4e9a2cf182214a4f20ba6111b1c8e79893d
RUN ["/bin/sh", "-euc", "if [ -f /usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/download_kernels.py ]; then vllm download-kernels; else echo 'lanectl: this vLLM has no download-kernels command (before 0.32.0): nothing to install'; fi"]
COPY lanectl-build/kernel_smoke.py /lanectl/kernel_smoke.py
COPY --from=kernel-flashmla-splitkv /lanectl/kernel-out/ /usr/local/lib/python3.12/dist-packages/vllm/
RUN ["python3", "/lanectl/kernel_smoke.py", "{\"argument\": \"mega_num_splits\", \"beside\": \"_flashmla_C\", \"dir\": \"/usr/local/lib/python3.12/dist-packages/vllm\", \"module\": \"_flashmla_splitkv_C\", \"op\": \"torch.ops._flashmla_splitkv_C.fused_norm_rope_attn_rope_cast_decode\"}"]
COPY lanectl-build/patching.py /lanectl/patching.py
COPY patches/ /lanectl/patches/
RUN ["python3", "/lanectl/patching.py", "apply", "--root", "/usr/local/lib/python3.12/dist-packages", "/lanectl/patches/vllm/60945-rejection-sampler-guard.patch", "/lanectl/patches/vllm/57711-splitkv-overlay.patch"]
ENV FLASHINFER_AUTOTUNE_CACHE_DIR="/root/.cache/vllm/flashinfer-autotune"
ENV VLLM_DSV41_MEGA_SPLITKV="4"
ENV VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS="6"
ENV VLLM_LOGGING_LEVEL="INFO"
COPY lanectl-run/exit_guard.py /lanectl/exit_guard.py
ENTRYPOINT ["python3", "-S", "/lanectl/exit_guard.py", "vllm", "serve"]
CMD ["/model", "--served-model-name", "dsv41-flash-uva", "--trust-remote-code", "--tensor-parallel-size", "1", "--offload-backend", "uva", "--cpu-offload-gb", "60", "--cpu-offload-params", "routed_experts.w13_weight", "routed_experts.w2_weight", "--engram-config", "{\"cpu_offload\": true}", "--max-model-len", "1048576", "--max-num-seqs", "16", "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.97", "--speculative-config", "{\"method\":\"dspark\",\"num_speculative_tokens\":5,\"num_speculative_tokens_per_batch_size\":[[1,8,5],[9,32,3]]}", "--tool-call-parser", "deepseek_v41", "--reasoning-parser", "deepseek_v41", "--enable-auto-tool-choice", "--long-prefill-token-threshold", "6144", "--host", "0.0.0.0", "--port", "30006", "--shutdown-timeout", "105"]
