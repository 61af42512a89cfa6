# Rendered by lanectl from lanectl's built-in template vllm/Dockerfile.j2: lane h1-REF of recipe dsv41-flash-uva-dspark-sidecar.
# The pinned vLLM image, plus side-built kernels and backported patches; the engine stays the image's `vllm serve`.
FROM vllm/vllm-openai:deepseekv41-flash-0909@sha256:00d577a6a63281e15336029d5bcee4e9a2cf182214a4f20ba6111b1c8e79893d
RUN ["/bin/sh", "-euc", "if [ -f /usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/download_kernels.py ]; then vllm download-kernels; else echo 'lanectl: this vLLM has no download-kernels command (before 0.32.0): nothing to install'; fi"]
ENV FLASHINFER_AUTOTUNE_CACHE_DIR="/root/.cache/vllm/flashinfer-autotune"
ENV VLLM_LOGGING_LEVEL="INFO"
COPY lanectl-run/exit_guard.py /lanectl/exit_guard.py
ENTRYPOINT ["python3", "-S", "/lanectl/exit_guard.py", "vllm", "serve"]
CMD ["/model", "--served-model-name", "dsv41-flash-uva", "--trust-remote-code", "--tensor-parallel-size", "1", "--offload-backend", "uva", "--cpu-offload-gb", "60", "--cpu-offload-params", "routed_experts.w13_weight", "routed_experts.w2_weight", "--engram-config", "{\"cpu_offload\": true}", "--max-model-len", "1048576", "--max-num-seqs", "16", "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.97", "--speculative-config", "{\"method\":\"dspark\",\"num_speculative_tokens\":5,\"num_speculative_tokens_per_batch_size\":[[1,8,5],[9,32,3]]}", "--tool-call-parser", "deepseek_v41", "--reasoning-parser", "deepseek_v41", "--enable-auto-tool-choice", "--long-prefill-token-threshold", "6144", "--host", "0.0.0.0", "--port", "30006", "--shutdown-timeout", "105"]
