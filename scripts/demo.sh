#!/usr/bin/env bash
# The demo: the job lanectl does, on the embedded CPU stub-engine lanes (recipes/demo/stub.yaml).
# Run through `make demo`, which has already done the host set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
lanectl=.venv/bin/lanectl
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say lanectl validate
$lanectl validate

say lanectl patches check
$lanectl patches check

say lanectl build demo-h1 demo-h2
$lanectl build demo-h1 demo-h2

say "lanectl build demo-h1 demo-h2   # again: inputs unchanged, nothing is built"
$lanectl build demo-h1 demo-h2

say lanectl lanes
$lanectl lanes

# Until `lanectl up` exists, show the built demo-h2 image serving with plain Docker.
image=$($lanectl lanes --json | .venv/bin/python -c 'import json,sys; print(next(r["image"] for r in json.load(sys.stdin)["data"]["lanes"] if r["lane"]=="demo-h2"))')
say "docker run $image   # the demo-h2 lane's primary, briefly"
name=lanectl-demo-preview-$$
docker run -d --rm --init --name "$name" -p 127.0.0.1:18099:8000 "$image" >/dev/null
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
.venv/bin/python - <<'PY'
import time, httpx
base = "http://127.0.0.1:18099"
for _ in range(100):
    try:
        if httpx.get(base + "/health", timeout=1).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.2)
print("models:", [m["id"] for m in httpx.get(base + "/v1/models").json()["data"]])
reply = httpx.post(base + "/v1/completions", json={"model": "demo-model", "prompt": "Hello", "max_tokens": 8}).json()
print("completion:", repr(reply["choices"][0]["text"]))
PY
docker logs "$name" 2>&1 | grep -E "split-KV|KV cache size|Loaded" || true
