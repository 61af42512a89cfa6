"""stubengine: a stdlib-only stand-in for vLLM's OpenAI server, for lanectl's demo lanes and tests.

It speaks vLLM's command line, HTTP API, metrics and startup log, generates deterministic tokens at a
configured rate on a batched step loop, and reproduces the h2-REF lane's two changes: a split-KV
decode kernel shipped as a side extension (`stubengine._stub_splitkv_C`, beside `attention.py`) and
the rejection-sampler out-of-bounds read that vLLM #60945 fixed (`rejection_sampler.py` ships
unpatched; patches/stub-engine/0001-rejection-sampler-guard.patch fixes it).

Command line (vLLM's)::

    python3 -m stubengine serve MODEL_PATH [--served-model-name NAME ...] [--host 0.0.0.0]
        [--port 8000] [--max-model-len 32768] [--max-num-seqs 256]
        [--cpu-offload-gb GB] [--cpu-offload-params NAME ...] [--enable-sleep-mode]
        [any other vLLM flag ...]

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
    STUB_TOKEN_SEED=0              changes every token (a candidate whose outputs differ)
    STUB_FLIP_EVERY=0              N > 0: at every Nth position (1-based) where the model is
                                   confident, emit the runner-up token instead (a "confident flip")
    STUB_FAULT=                    crash | crash_on_start | hang | unhealthy | fatal_log | slow_start
                                   | wake_fail | wake_altered | die_asleep (sleep mode: see sleep.py)
                                   | prefix_cache_held (POST /reset_prefix_cache answers {"success": false})
                                   | broken_tool_json | leak_reasoning | loop | miss_needle (output
                                   faults, each failing one of lanectl's probes: see faults.py, answers.py)
    STUB_FAULT_AFTER_S=0           crash/hang/unhealthy/fatal_log fire this long after ready;
                                   die_asleep this long after falling asleep
    STUB_SLOW_START_SECONDS=30     load time under STUB_FAULT=slow_start
    STUB_ADMIN=0                   1: enable POST /admin/fault {"fault": crash|hang|unhealthy|fatal_log|clear}
    STUB_OOB_LOG_EVERY=100         log the first stray sampler read, then one per this many
    STUB_SLEEP_SECONDS=0.5         how long POST /sleep takes (sleep mode)
    STUB_WAKE_SECONDS=1            how long POST /wake_up takes
    STUB_SLEEP_REFUSES=0           1: a request sent while asleep is refused at once (503 EngineSleepingError);
                                   by default it is queued and served once woken, as vLLM does
    VLLM_SERVER_DEV_MODE=0         1: mount /sleep, /wake_up, /is_sleeping, /reset_prefix_cache (vLLM's
                                   development routes; sleep itself also needs --enable-sleep-mode)
    STUB_STATS_INTERVAL_S=10       period of the "Engine 000: Avg ..." stats line (0: never)
    VLLM_DSV41_MEGA_SPLITKV=0      split-KV max splits (0/1: off), as in vLLM #57711
    VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS=8   split only at <= this many query tokens per step

Split-KV engages when the extension imports and its `decode` has a `mega_num_splits` argument,
VLLM_DSV41_MEGA_SPLITKV > 1, exactly one request is running and 1 + k == MAX_TOKENS; the step time is
then multiplied by the extension's factor (4 splits: 0.96, 8 splits: 0.975).

Startup log lines, in order (vLLM format "LEVEL MM-DD HH:MM:SS [file.py:line] message", FlashInfer
format "YYYY-MM-DD HH:MM:SS,mmm - INFO - autotuner.py:N - flashinfer.jit: message", uvicorn format
"INFO:     message"); [..] lines are conditional:

    INFO  Starting vLLM API server (stub engine) pid=P model=MODEL served_model_name=NAME
    [WARNING SECURITY WARNING: Development endpoints are enabled! ...  (VLLM_SERVER_DEV_MODE=1)]
    [INFO Ignoring vLLM flags the stub engine does not model: --flag value, ...]
    INFO  split-KV overlay: on, S splits at 1 request x T query tokens via stubengine._stub_splitkv_C; ...
       or split-KV overlay: off (REASON); every call unsplit on stubengine.attention
                                                          (WARNING if splits were requested)
    [WARNING split-KV overlay: will never engage: a single request's step has Q query tokens, ...]
    INFO  Starting to load model MODEL...
    INFO  Loading weights took 1.00 seconds
    [INFO Offloaded 60.0 GiB of parameters to CPU (routed_experts.w13_weight, routed_experts.w2_weight)]
    INFO  Model loading took 12.3 GiB memory and 1.100000 seconds
    INFO  GPU KV cache size: 4,400,013 tokens
    INFO  Maximum concurrency for 32,768 tokens per request: 134.28x
    flashinfer  [Autotuner]: Loaded 210 configs from /root/.cache/vllm/flashinfer_autotune_cache/...
    INFO  init engine (profile, create kv cache, warmup model) took 2.00 seconds
    INFO:     Started server process [P]
    INFO:     Waiting for application startup.
    INFO:     Application startup complete.
    INFO:     Uvicorn running on http://HOST:PORT (Press CTRL+C to quit)

Fault lines: "ERROR ... EngineCore encountered a fatal error." + traceback (crash, exit 1);
"ERROR ... EngineCore failed to start." + traceback (crash_on_start, exit 1, after "Starting to load
model"); "ERROR ... CUDA error: an illegal memory access was encountered" (fatal_log, keeps serving);
"WARNING ... Stub engine marked unhealthy (...)" (unhealthy); nothing at all for hang. The unpatched
sampler logs "WARNING ... rejection sampler read past draft buffer (...)". SIGTERM/SIGINT:
"INFO:     Shutting down", "INFO:     Finished server process [P]", exit 0.
"""

__version__ = "0.31.0+stub"
