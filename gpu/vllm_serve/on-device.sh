#!/usr/bin/env bash
# The real-vLLM run on the GPU machine, one step per device call (the machine stays warm, with /tmp, for
# 30 s after each call; the payload is two parts because one call carries at most 64 MiB):
#   call 1: bash gpu/vllm_serve/on-device.sh part1   carry .gpu-payload/part-aa: stash it, make the models
#   call 2: bash gpu/vllm_serve/on-device.sh run     carry .gpu-payload/part-ab and .gpu-payload/overlay:
#           unpack, then serve each model in turn and run the scenarios (about 6 minutes)
# Build the parts first, here: bash gpu/vllm_serve/payload.sh. What the run printed lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d /tmp/vllm-serve.XXXXXX)}
stash=/tmp/lanectl-payload
case "${1:-}" in
  part1)
    mkdir -p "$stash" && cp .gpu-payload/part-aa "$stash"/ && ls -l "$stash"
    {
      date -u +%Y-%m-%dT%H:%M:%SZ
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c 'import sys, torch, triton, transformers, tokenizers; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
    } 2>&1 | tee "$OUT/env.log"
    [ -d /tmp/models/llama-tiny ] || python3 gpu/vllm_serve/make_models.py /tmp/models 2>&1 | tail -5 | tee "$OUT/make_models.log"
    ls /tmp/models/*
    ;;
  run)
    shift
    if [ ! -d /tmp/site/vllm ]; then
      [ -f "$stash/part-aa" ] || { echo "part-aa is gone: the machine went cold; run part1 again" >&2; exit 3; }
      cp .gpu-payload/part-ab "$stash"/ 2>/dev/null || true
      mkdir -p /tmp/site && cat "$stash"/part-* | xz -d | tar -x -C /tmp/site || exit 3
    fi
    # Wheels in .gpu-payload/overlay replace their packages in the unpacked tree: a fix that needs no new parts.
    if ls .gpu-payload/overlay/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu-payload/overlay/*.whl 2>&1 | grep -v WARNING
    fi
    export PYTHONPATH=/tmp/site
    python3 -c 'import vllm, pydantic; print("vllm", vllm.__version__, "pydantic", pydantic.__version__)' 2>&1 | tail -1 | tee -a "$OUT/env.log"
    # The 8B shape for the standby's real sizes, every scenario; then the tiny model, whose random weights on a
    # real tokenizer show teacher forcing by text going wrong. The tool parser lets the gauntlet's tool items reach
    # the model (hermes: the ChatML template's tool-call convention).
    tools=(--vllm-arg=--enable-auto-tool-choice --vllm-arg=--tool-call-parser --vllm-arg=hermes)
    # RUN_MODELS="8b tiny" by default; one of them to repeat a run (a call brings back a limited number of files);
    # RUN_MODELS=guard: the exit guard's two cases on the tiny model; aa: the A/A arms (issue 32); drain: SIGTERM and
    # sleep with requests in flight (issue 31); aa64, ab, ab33 and ab31: the A/A and A/B sets of issue 42.
    for model in ${RUN_MODELS:-8b tiny}; do
      case $model in
        8b) python3 gpu/vllm_serve/run.py --engine vllm --dummy --model /tmp/models/llama-8b-shape "${tools[@]}" \
              --out "$OUT/llama-8b-dummy" "$@" 2>&1 | tee "$OUT/llama-8b-dummy.log" ;;
        tiny) python3 gpu/vllm_serve/run.py --engine vllm --model /tmp/models/llama-tiny "${tools[@]}" \
                --out "$OUT/llama-tiny" --only startup,probe,teacher_forcing,loadgen,probes,engine_kill "$@" 2>&1 |
                tee "$OUT/llama-tiny.log" ;;
        # The tiny model under lanectl's exit guard, as a lane image runs it: a stop (SIGTERM to the guard),
        # then, on a second start, an engine-core kill (eager: no compile, a quicker start; the exits are the same).
        guard) for scenario in stop engine_kill; do
                 python3 gpu/vllm_serve/run.py --engine vllm --exit-guard --model /tmp/models/llama-tiny --vllm-arg=--enforce-eager \
                   --out "$OUT/exit-guard-$scenario" --only "startup,$scenario" "$@" 2>&1 | tee "$OUT/exit-guard-$scenario.log"
               done ;;
        # Issue 32: identical arms of the unchanged 8B-shaped engine (aa_arms.json: every request of every arm).
        aa) python3 gpu/vllm_serve/run.py --engine vllm --dummy --model /tmp/models/llama-8b-shape \
              --out "$OUT/aa-8b" --only startup,aa_arms --aa-arms "${AA_ARMS:-14}" "$@" 2>&1 | tee "$OUT/aa-8b.log" ;;
        # Issue 42: the A/A arms at 1, 8, 32 and 64 streams, kept inside one call's 10 minutes by --aa-seconds.
        aa64) python3 gpu/vllm_serve/run.py --engine vllm --dummy --model /tmp/models/llama-8b-shape \
                --out "$OUT/aa64-8b" --only startup,aa_arms --aa-arms "${AA_ARMS:-14}" --aa-streams 1,8,32,64 \
                --aa-seconds "${AA_SECONDS:-390}" "$@" 2>&1 | tee "$OUT/aa64-8b.log" ;;
        # Issue 42: a real A/B set. A is the engine of aa64 at --max-num-seqs 32 (run.py's), B the same with 30:
        # both up on the one GPU at once (0.45 of its memory each), arms alternating A, B, ..., A.
        ab) python3 gpu/vllm_serve/run.py --engine vllm --dummy --model /tmp/models/llama-8b-shape \
              --vllm-arg=--gpu-memory-utilization --vllm-arg=0.45 --b-arg=--max-num-seqs --b-arg=30 \
              --out "$OUT/ab-8b" --only startup,ab_arms --aa-arms "${AA_ARMS:-14}" --aa-streams 1,8,32,64 \
              --aa-seconds "${AA_SECONDS:-330}" "$@" 2>&1 | tee "$OUT/ab-8b.log" ;;
        # Issue 42: A/B sets at a known few percent. B is A with one decoder layer more (ab33: 33 of 32) or one
        # less (ab31), through --hf-overrides on the dummy-weight model: about 3 % more or fewer weights read per
        # token, at every concurrency.
        ab33|ab31) python3 gpu/vllm_serve/run.py --engine vllm --dummy --model /tmp/models/llama-8b-shape \
                --vllm-arg=--gpu-memory-utilization --vllm-arg=0.45 \
                --b-arg=--hf-overrides "--b-arg={\"num_hidden_layers\": ${model#ab}}" \
                --out "$OUT/$model-8b" --only startup,ab_arms --aa-arms "${AA_ARMS:-30}" --aa-streams 1,8,32 \
                --aa-seconds "${AA_SECONDS:-270}" "$@" 2>&1 | tee "$OUT/$model-8b.log" ;;
        # Issue 31: SIGTERM with 8 streams in flight, under the exit guard as a lane runs, at --shutdown-timeout
        # 30 (after the sleep modes with streams in flight), 0 (vLLM's default) and 5 (a drain that cannot fit).
        # Three launches make more files than one call brings back: they come back as one archive.
        drain) work=/tmp/drain-record && rm -rf "$work" && mkdir -p "$work"
               for timeout in 30 0 5; do
                 only=startup,drain_stop; [ "$timeout" = 30 ] && only=startup,sleep_modes,drain_stop
                 flag=(); [ "$timeout" != 0 ] && flag=(--vllm-arg=--shutdown-timeout "--vllm-arg=$timeout")
                 python3 gpu/vllm_serve/run.py --engine vllm --dummy --exit-guard --model /tmp/models/llama-8b-shape \
                   "${flag[@]}" --out "$work/drain-$timeout" --only "$only" "$@" 2>&1 | tee "$work/drain-$timeout.log"
               done
               tar -C "$work" -czf "$OUT/drain-record.tgz" . ;;
      esac
    done
    ;;
  *) echo "usage: $0 part1|run [run.py args]" >&2; exit 2 ;;
esac
