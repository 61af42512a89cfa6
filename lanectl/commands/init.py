"""`lanectl init [DIR]`: a new recipes project whose two stub-engine lanes run without a GPU.

Writes a commented starter recipe (with the editor-schema line), the JSON Schema it points at, and a
workloads folder with a small workload. Refuses, writing nothing, when any of those files exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

from lanectl.errors import BadInput
from lanectl.output import Result
from lanectl.recipe.schema import recipe_json_schema

STARTER_RECIPE = """\
# yaml-language-server: $schema=../lanectl.schema.json
# A lanectl recipe: one serving setup, its lanes, and what keeps them healthy. Check it with `lanectl validate`;
# the format is in lanectl's docs ("Writing recipes", and the field reference). `defaults` holds what every lane
# inherits; each lane under `lanes` overrides what differs (maps merge key by key, lists and scalars replace).
#
# Both lanes run lanectl's CPU stub engine, which imitates vLLM, so this project works without a GPU:
#   lanectl build --all && lanectl up {first} --no-gpu && lanectl status
# The stub engine's base image, lanectl/base-python:bookworm, is built offline from Debian packages by
# `make base-image` in lanectl's source checkout. For a real engine use `template: vllm` with a vLLM
# image pinned by digest (`base: vllm/vllm-openai:<tag>@sha256:<digest>`), or `lanectl import jm` a J-M recipe.
schema: lanectl/v1
id: {id}                          # the image repository: lanectl/{id}
description: Two stub-engine lanes, a starting point.
naming:
  container: "{id}-{{lane}}"       # one container per lane: {id}-{first}, {id}-{second}
keep_stopped_lanes: 3             # stopped lanes kept, so a rollback is a start, not a rebuild

defaults:
  image:
    template: stub-engine         # lanectl's built-in; your own images/stub-engine/Dockerfile.j2 would override it
    base: lanectl/base-python:bookworm
    local_base: true              # built on this host (not pulled), so not pinned by digest
    python_site: /opt/stub
  engine:
    args: [/model, --served-model-name, starter-model, --host, 0.0.0.0, --port, "8000"]
    env:
      STUB_LOAD_SECONDS: "2"       # how long the stub "loads the model"
      STUB_DECODE_TOKENS_PER_S: "100"
    ports:
      # The host port both lanes publish (one serves at a time), as `lanectl init --port` chose it: change it
      # here if another service takes it.
      - {{container: 8000, host: {port}, host_ip: 127.0.0.1}}
    init: true                    # an init as PID 1, so SIGTERM reaches the engine
    stop_timeout_seconds: 30      # a stop: requests in flight get 15 s to finish (--shutdown-timeout), 15 s to exit
  health:                         # the gate a lane must pass before it counts as up
    startup_budget_minutes: 2
    poll_interval_seconds: 0.5
    served_model_name: starter-model   # must match --served-model-name
    startup_log:
      expect: ["KV cache size: [0-9,]+ tokens"]    # engine lines that must appear before the lane is healthy
    generation_probe: {{max_tokens: 3, timeout_seconds: 5, interval_seconds: 10}}
  watchdog:
    gpu_memory_release_timeout_seconds: 0          # no GPU to wait for

lanes:
  {first}:
    description: The control lane.
  {second}:
    # Compare them: lanectl gate {second} --control {first} --workload smoke --concurrency 1,4 --no-gpu
    description: The candidate, decoding faster.
    engine:
      env: {{STUB_DECODE_TOKENS_PER_S: "150"}}   # merges into the default env: 1.5x the control
"""

STARTER_WORKLOAD = """\
# A small workload for `lanectl bench --workload smoke` and `lanectl gate --workload smoke`.
# Keep a workload frozen once you compare figures with it: add a new file rather than edit this one.
schema: lanectl-workload/v1
name: smoke
description: Two short prompts in two classes.
max_tokens: 32
temperature: 0
probes: [quick]   # a gate PASSes only when every arm ran the workload's probes (probes/quick.yaml)
classes:
  prose:
    - "Explain in two sentences why a health check should generate a token, not only answer /health."
  code:
    - "Write a Python function that returns the median of a list of numbers."
"""

STARTER_PROBE = """\
# A correctness probe `lanectl gate` runs in every arm of a bracket (the smoke workload names it): the answer
# comes back with its reasoning apart from it, never inside it.
schema: lanectl-probe/v1
name: quick
kind: thinking
description: Reasoning returned apart from the answer, on one prompt.
max_tokens: 64
chat_template_kwargs: {thinking: true}
leak_markers: ["<think>", "</think>"]
prompts:
  - "Which is larger, 9.11 or 9.8?"
"""

FIRST_LANE, SECOND_LANE = "stub-a", "stub-b"
DEFAULT_PORT = 18100


def project_id(folder: Path) -> str:
    """A recipe id from the folder's name (lowercase, other characters as dashes), e.g. `My Lanes` -> `my-lanes`."""
    name = re.sub(r"[^a-z0-9._-]+", "-", folder.resolve().name.lower()).strip("-._")[:64]
    return name or "lanes"


def scaffold(folder: Path, port: int = DEFAULT_PORT) -> list[Path]:
    """Write the starter project into `folder` (created when missing); the paths written, in order.

    All or nothing: on any OS error (a read-only or full disk, a file or a dangling link where a folder
    goes, a name too long) what this call made is removed again and `BadInput` says what failed.
    """
    try:
        return _scaffold(folder, port)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else folder
        raise BadInput(f"lanectl init could not write {where}: {exc.strerror or exc}; nothing was left behind. "
                       "Choose a folder you can write to") from None


def _scaffold(folder: Path, port: int) -> list[Path]:
    files = {
        folder / "recipes" / "starter.yaml": STARTER_RECIPE.format(id=project_id(folder), first=FIRST_LANE,
                                                                  second=SECOND_LANE, port=port),
        folder / "recipes" / "workloads" / "smoke.yaml": STARTER_WORKLOAD,
        folder / "recipes" / "workloads" / "probes" / "quick.yaml": STARTER_PROBE,
        folder / "lanectl.schema.json": json.dumps(recipe_json_schema(), indent=2) + "\n",
    }
    if folder.is_symlink() and not folder.exists():
        raise BadInput(f"{folder} is a link to nothing ({os.readlink(folder)}); give a folder")
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"{folder} is not a folder")
    existing = [str(path) for path in files if path.exists() or path.is_symlink()]
    if existing:
        raise BadInput(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
                       "lanectl init never overwrites a file: choose a new or empty folder")
    made: list[Path] = []  # folders and files this call created, to remove again if a later one fails
    try:
        for path, text in files.items():
            _make_folders(path.parent, made)
            _write_new(path, text.encode())
            made.append(path)
    except BaseException:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        raise
    return list(files)


def _make_folders(folder: Path, made: list[Path]) -> None:
    missing = []
    while not folder.is_dir():
        if folder.exists() or folder.is_symlink():
            raise BadInput(f"{folder} is not a folder, and lanectl init would write inside it")
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
        made.append(path)


def _write_new(path: Path, content: bytes) -> None:
    """`path` whole, and only if it does not exist: a full disk leaves no truncated file that would block
    the next `init`. The temp file is linked to its name (link(2) never replaces), then removed."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)


def init_project(folder: Path, port: int = DEFAULT_PORT) -> Result:
    """`lanectl init`: the files written and the commands that come next."""
    import shlex

    if not 1 <= port <= 65535:
        raise BadInput(f"--port {port}: a host port is a number from 1 to 65535")
    written = scaffold(folder, port)
    where = "" if folder.resolve() == Path.cwd() else f"cd {shlex.quote(str(folder))} && "
    steps = f"lanectl validate && lanectl build --all && lanectl up {FIRST_LANE} --no-gpu"
    return Result("init", {"written": [str(path) for path in written], "next": where + steps})


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "init": {
        "example": """\
$ lanectl init my-lanes
wrote my-lanes/recipes/starter.yaml
wrote my-lanes/recipes/workloads/smoke.yaml
wrote my-lanes/lanectl.schema.json
$ cd my-lanes && lanectl validate && lanectl build --all && lanectl up stub-a --no-gpu
""",
        "exit": {
            0: "the project was written",
            2: ("a file it would write is already there, or the folder cannot be written (nothing is left behind)"),
        },
    },
}
