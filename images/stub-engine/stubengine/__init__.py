"""stubengine: a stdlib-only stand-in for vLLM's OpenAI server, for lanectl's demo lanes and tests.

It speaks vLLM's command line, HTTP API, metrics and startup log, generates deterministic tokens at a
configured rate on a batched step loop, and reproduces the h2-REF lane's two changes: a split-KV
decode kernel shipped as a side extension (`stubengine._stub_splitkv_C`, beside `attention.py`) and
the rejection-sampler out-of-bounds read that vLLM #60945 fixed (`rejection_sampler.py` ships
unpatched; patches/stub-engine/0001-rejection-sampler-guard.patch fixes it).

Command line (vLLM's)::

    python3 -m stubengine serve MODEL_PATH [--served-model-name NAME ...] [--host 0.0.0.0]
        [--port 8000] [--max-model-len 32768] [--max-num-seqs 256]
        [--cpu-offload-gb GB] [--cpu-offload-params NAME ...] [--engram-config JSON] [--enable-sleep-mode]
        [--shutdown-timeout N] [any other vLLM flag ...]

Any other `--flag`, `--flag value ...` or `--flag=value` is accepted and listed once at startup.
`--port 0` binds a free port; the "Uvicorn running on" line names it.

Environment (stub knobs; all optional):

    STUB_LOAD_SECONDS=2            load delay; the port is bound only once loading is done
    STUB_DECODE_TOKENS_PER_S=100   single-stream decode rate in tokens/s; one step = (mean tokens per
                                   step) / rate seconds: 2.9 tokens at k=5
    STUB_STEP_MS=                  step time in ms; overrides STUB_DECODE_TOKENS_PER_S
    STUB_NUM_SPECULATIVE_TOKENS=5  configured draft steps k (3 run while 9-32 requests are running);
                                   each step's stream chunk carries 1 + the drafts it accepted (a fixed
                                   cycle 2,0,3,2,1,5,2,1,2,1 capped at the draft steps run: mean acceptance
                                   length 2.9 at k=5), up to k + 1 tokens; 0: one token per chunk;
                                   query tokens per step = 1 + draft steps
    STUB_KV_CACHE_TOKENS=4400013   reported in "GPU KV cache size" and used for kv_cache_usage_perc
    STUB_AUTOTUNE_CONFIGS=210      N in "[Autotuner]: Loaded N configs from ..."
    STUB_AUTOTUNE_STALL=0          1: log "Autotuning process starts ..." and never finish loading
    STUB_VLLM_VERSION=0.31.0       0.26.0: the lines the GPU record's vLLM printed differently (two KV lines)
    STUB_TOKEN_SEED=0              changes every token (a candidate whose outputs differ)
    STUB_FLIP_EVERY=0              N > 0: at every Nth position (1-based) where the model is
                                   confident, emit the runner-up token instead (a "confident flip")
    STUB_FAULT=                    crash | crash_on_start | hang | unhealthy | fatal_log | slow_start
                                   | wake_fail | wake_altered | die_asleep | sleep_fail (sleep mode:
                                   see sleep.py)
                                   | prefix_cache_held (POST /reset_prefix_cache answers {"success": false})
                                   | broken_tool_json | leak_reasoning | loop | miss_needle (output
                                   faults, each failing one of lanectl's probes: see faults.py, answers.py)
    STUB_FAULT_AFTER_S=0           crash/hang/unhealthy/fatal_log fire this long after ready (crash: the
                                   engine core dies, the process exits 0 a second later, as vLLM's does);
                                   die_asleep this long after falling asleep
    STUB_SLOW_START_SECONDS=30     load time under STUB_FAULT=slow_start
    STUB_ADMIN=0                   1: enable POST /admin/fault {"fault": crash|hang|unhealthy|fatal_log|clear}
    STUB_OOB_LOG_EVERY=100         log the first stray sampler read, then one per this many
    STUB_SLEEP_SECONDS=0.5         how long POST /sleep takes (sleep mode)
    STUB_WAKE_SECONDS=1            how long POST /wake_up takes
    STUB_SLEEP_REFUSES=0           1: a request sent while asleep is refused at once (503 EngineSleepingError);
                                   by default it is queued and served once woken, as vLLM does
    STUB_ABORT_LOST=0              1: with --shutdown-timeout 0 the engine core is killed before its abort
                                   outputs leave (shutdown.py): requests in flight never end
    VLLM_SERVER_DEV_MODE=0         1: mount /sleep, /wake_up, /is_sleeping, /reset_prefix_cache (vLLM's
                                   development routes; sleep itself also needs --enable-sleep-mode)
    STUB_STATS_INTERVAL_S=10       period of the "Engine 000: Avg ..." stats line (0: never)
    VLLM_DSV41_MEGA_SPLITKV=0      split-KV max splits (0/1: off), as in vLLM #57711
    VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS=8   split only at <= this many query tokens per step

Split-KV engages when the extension imports and its `decode` has a `mega_num_splits` argument,
VLLM_DSV41_MEGA_SPLITKV > 1, exactly one request is running and 1 + k == MAX_TOKENS; the step time is
then multiplied by the extension's factor (4 splits: 0.96, 8 splits: 0.975); beyond 4 splits every unsplit step pays
1.5% per extra split (8 splits: 1.06 at 2+ requests).

Log lines are vLLM 0.31.0's (SHAPE.md; where each message comes from is `logs.SITES`). Every line starts
with the writing process's prefix, `(APIServer pid=P) ` or `(EngineCore pid=P+1) ` (tracebacks and uvicorn's
lines too), then vLLM's format "LEVEL MM-DD HH:MM:SS [file.py:line] message", flashinfer's
"YYYY-MM-DD HH:MM:SS,mmm - INFO - autotuner.py:N - flashinfer.jit: message" or uvicorn's "INFO:     message".
Startup, in order ([..] lines are conditional):

    (APIServer)  INFO [api_server.py] Starting vLLM API server (stub engine) pid=P model=MODEL served_model_name=NAME
    [(APIServer) WARNING SECURITY WARNING: Development endpoints are enabled! ...  (VLLM_SERVER_DEV_MODE=1)]
    [(APIServer) INFO Ignoring vLLM flags the stub engine does not model: --flag value, ...]
    (APIServer)  INFO split-KV overlay: on, S splits ... | split-KV overlay: off (REASON); ...
    [(APIServer) WARNING split-KV overlay: will never engage: ...]
    (EngineCore) INFO [gpu_model_runner.py] Starting to load model MODEL...
    (EngineCore) INFO [default_loader.py] Loading weights took 1.00 seconds
    [(EngineCore) INFO [uva.py] Total CPU offloaded parameters: 60.0          (--cpu-offload-gb 60)]
    [(EngineCore) INFO [engram.py] Engram table offloaded to pinned host memory: 48002473 rows x 256, 11.80 GiB
                  per rank                               (--engram-config '{"cpu_offload": true}')]
    (EngineCore) INFO [gpu_model_runner.py] Model loading took 12.3000 GiB memory and 1.100000 seconds
    (EngineCore) INFO [kv_cache_utils.py] GPU KV cache size: 4,400,013 tokens, Maximum concurrency for 32,768
                  tokens per request: 134.28x   (STUB_VLLM_VERSION=0.26.0: two lines, "GPU KV cache size: ..."
                  and "Maximum concurrency for ...", as the GPU record shows)
    (EngineCore) flashinfer [Autotuner]: Loaded 210 configs from /root/.cache/vllm/flashinfer_autotune_cache/...
    (EngineCore) flashinfer [Autotuner]: Autotuning process starts ...
    (EngineCore) flashinfer [Autotuner]: Autotuning process ends     (STUB_AUTOTUNE_STALL=1: never; the log stops)
    (EngineCore) INFO [core.py] init engine (profile, create kv cache, warmup model) took 2.00 s
    (APIServer)  INFO:     Started server process [P]
    (APIServer)  INFO:     Waiting for application startup.
    (APIServer)  INFO:     Application startup complete.
    (APIServer)  INFO:     Uvicorn running on http://HOST:PORT (Press CTRL+C to quit)

Fault lines: crash (and die_asleep) -> "(EngineCore) ERROR [core.py] EngineCore encountered a fatal error." +
traceback; "(APIServer) WARNING [core_client.py] [shutdown] MPClient: engine core exited unexpectedly; starting
cleanup"; "(APIServer) ERROR [async_llm.py] AsyncLLM output_handler failed." + a traceback ending in
"vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the
root cause."; for CORE_DEATH_SECONDS /health answers 200 and completions 500 with that message
(InternalServerError); then uvicorn's shutdown lines and **exit 0**, as vLLM's API server exits. crash_on_start
-> after "Starting to load model", "ERROR ... EngineCore failed to start." + traceback, exit 1; fatal_log ->
"ERROR ... CUDA error: an illegal memory access was encountered", keeps serving; unhealthy -> "WARNING ... Stub
engine marked unhealthy (...)"; nothing at all for hang. The unpatched sampler logs "WARNING ... rejection
sampler read past draft buffer (...)". SIGTERM/SIGINT: "INFO:     Shutting down", "INFO:     Finished server
process [P]", exit 0 while loading; once serving, vLLM 0.31.0's shutdown with --shutdown-timeout N (shutdown.py):
0 aborts the requests in flight, N > 0 lets them finish while each new request fails at once (500 "cannot schedule
new futures after shutdown" for text, aborted for token ids), and a drain past its deadline leaves its requests
unanswered and the process waiting for their clients; exit 0.
Request lines uvicorn would refuse (any byte but visible ASCII in the target) get its 400 and no access line.
"""

__version__ = "0.31.0+stub"
