# Rendered by lanectl from images/stub-engine/Dockerfile.j2: lane demo-h2 of recipe demo-stub.
# The CPU stub engine that imitates vLLM, for the demo and the tests.
# Kernel side extension stub-splitkv: built in its own stage, installed beside the shipped module.
FROM lanectl/base-build:bookworm AS kernel-stub-splitkv
ENV LANECTL_KERNEL_MODULE="_stub_splitkv_C"
ENV LANECTL_KERNEL_OUT="/lanectl/kernel-out"
COPY kernels/stub-splitkv/ /lanectl/kernel-src/
WORKDIR /lanectl/kernel-src
RUN ["/bin/sh", "-euc", "mkdir -p \"$LANECTL_KERNEL_OUT\"\ngcc -O2 -shared -fPIC -I/usr/include/python3.11 -DLANECTL_MODULE_NAME=$LANECTL_KERNEL_MODULE stub_splitkv.c -o \"$LANECTL_KERNEL_OUT/$LANECTL_KERNEL_MODULE$(python3 -c 'import sysconfig;print(sysconfig.get_config_var(\"EXT_SUFFIX\"))')\"\nfor f in \"$LANECTL_KERNEL_OUT\"/*; do case \"${f##*/}\" in \"$LANECTL_KERNEL_MODULE\".*) ;; *) echo \"kernel stub-splitkv: build left ${f##*/} in its output; only $LANECTL_KERNEL_MODULE.* may be installed\" >&2; exit 1;; esac; done\nls \"$LANECTL_KERNEL_OUT\"/\"$LANECTL_KERNEL_MODULE\".* >/dev/null 2>&1 || { echo \"kernel stub-splitkv: build produced no $LANECTL_KERNEL_MODULE module\" >&2; exit 1; }"]

FROM lanectl/base-python:bookworm
ENV PYTHONPATH="/opt/stub" PYTHONUNBUFFERED="1"
COPY image/stubengine/ /opt/stub/stubengine/
RUN ["python3", "-m", "compileall", "-q", "/opt/stub/stubengine"]
COPY lanectl-build/kernel_smoke.py /lanectl/kernel_smoke.py
COPY --from=kernel-stub-splitkv /lanectl/kernel-out/ /opt/stub/stubengine/
RUN ["python3", "/lanectl/kernel_smoke.py", "{\"argument\": \"mega_num_splits\", \"beside\": \"attention\", \"dir\": \"/opt/stub/stubengine\", \"module\": \"_stub_splitkv_C\", \"op\": \"stubengine._stub_splitkv_C.decode\"}"]
COPY lanectl-build/patching.py /lanectl/patching.py
COPY patches/ /lanectl/patches/
RUN ["python3", "/lanectl/patching.py", "apply", "--root", "/opt/stub", "/lanectl/patches/stub-engine/0001-rejection-sampler-guard.patch"]
ENV STUB_DECODE_TOKENS_PER_S="100"
ENV STUB_LOAD_SECONDS="2"
ENV VLLM_DSV41_MEGA_SPLITKV="4"
ENV VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS="6"
ENV VLLM_SERVER_DEV_MODE="1"
COPY lanectl-run/exit_guard.py /lanectl/exit_guard.py
ENTRYPOINT ["python3", "-S", "/lanectl/exit_guard.py", "python3", "-m", "stubengine", "serve"]
CMD ["/model", "--served-model-name", "demo-model", "--max-num-seqs", "32", "--speculative-config", "{\"method\":\"dspark\",\"num_speculative_tokens\":5}", "--host", "0.0.0.0", "--port", "8000", "--enable-sleep-mode", "--shutdown-timeout", "15"]
