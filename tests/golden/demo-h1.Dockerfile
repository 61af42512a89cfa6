# Rendered by lanectl from images/stub-engine/Dockerfile.j2: lane demo-h1 of recipe demo-stub.
# The CPU stub engine that imitates vLLM, for the demo and the tests.
FROM lanectl/base-python:bookworm
ENV PYTHONPATH="/opt/stub" PYTHONUNBUFFERED="1"
COPY image/stubengine/ /opt/stub/stubengine/
RUN ["python3", "-m", "compileall", "-q", "/opt/stub/stubengine"]
ENV STUB_DECODE_TOKENS_PER_S="100"
ENV STUB_LOAD_SECONDS="2"
ENV VLLM_SERVER_DEV_MODE="1"
COPY lanectl-run/exit_guard.py /lanectl/exit_guard.py
ENTRYPOINT ["python3", "-S", "/lanectl/exit_guard.py", "python3", "-m", "stubengine", "serve"]
CMD ["/model", "--served-model-name", "demo-model", "--max-num-seqs", "32", "--speculative-config", "{\"method\":\"dspark\",\"num_speculative_tokens\":5}", "--host", "0.0.0.0", "--port", "8000", "--enable-sleep-mode", "--shutdown-timeout", "15"]
