"""Workloads: the prompts `bench` and `gate` send, grouped in classes, as `lanectl-workload/v1` YAML.

A workload file lives under `recipes/workloads/` but declares its own schema, so recipe discovery
(which only picks files declaring `schema: lanectl/...`) never reads it as a recipe::

    schema: lanectl-workload/v1
    name: coding
    description: ...
    max_tokens: 128
    temperature: 0
    classes:
      prose: ["prompt", ...]
      code: ["prompt", ...]
      tool_json: ["prompt", ...]
    agent_classes: [tool_json]    # reported on their own line; no confident flip allowed there
    context_lengths: [0, 65536]   # optional: each cell again with the prompt padded to N tokens
    probes: [gauntlet, thinking, soak, needle-4k]   # optional: probes/<name>.yaml beside this file
    calibration_max_age_days: 30  # optional: a gate flags a calibration older than this

`gate` runs each named probe (`lanectl/bench/probes.py`) in every arm; any failure fails the gate.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from lanectl.bench.probes import known_probes, probe_file
from lanectl.errors import BadInput, Problem
from lanectl.recipe.validation import problems_from_validation
from lanectl.recipe.yaml_source import YamlSyntaxError, read_yaml_file

WORKLOAD_SCHEMA = "lanectl-workload/v1"
WORKLOADS_DIR = "workloads"

Prompt = Annotated[str, StringConstraints(min_length=1)]


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["lanectl-workload/v1"] = Field(alias="schema", description="Always lanectl-workload/v1.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="What `--workload` calls it.")
    description: str = ""
    max_tokens: int = Field(ge=1, le=1_000_000, description="Output tokens per request.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature; 0 makes runs comparable.")
    classes: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")],
                  Annotated[list[Prompt], Field(min_length=1)]] = Field(
        min_length=1, description="Prompt class -> its prompts; the gate judges each class on its own."
    )
    probes: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]] | None = Field(
        None, min_length=1, description="Correctness probes `gate` runs in every arm: probes/<name>.yaml."
    )

    agent_classes: list[str] = Field(
        default_factory=list, description="Classes of agent/tool prompts: reported apart, and the gate allows "
        "no confident flip on them.")
    context_lengths: list[Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=lambda: [0], min_length=1,
        description="Context lengths (tokens) to measure each cell at: the prompt is padded to that length; "
                    "0 sends it as written.")
    calibration_max_age_days: float = Field(
        30, gt=0, le=3650, description="A calibration of this workload older than this at a gate is flagged in "
        "the verdict (`calibration old: ...`): the host, its driver or its load may have changed since.")

    def cells_digest(self) -> str:
        """sha256 of what the cells send (prompts, output tokens, temperature, context lengths): a calibration
        of the arm noise holds for this workload only while these are the same."""
        sent = {"classes": self.classes, "max_tokens": self.max_tokens, "temperature": self.temperature,
                "context_lengths": self.context_lengths}
        return hashlib.sha256(json.dumps(sent, sort_keys=True).encode()).hexdigest()

    def prompts(self, class_name: str) -> list[str]:
        try:
            return list(self.classes[class_name])
        except KeyError:
            known = ", ".join(self.classes)
            raise BadInput(f"workload {self.name} has no class {class_name!r}; it has: {known}") from None


class WorkloadInvalid(BadInput):
    """Every problem found in one workload file."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(set(problems))
        super().__init__("\n".join(str(p) for p in self.problems))


# What a prompt is padded with to reach a context length: plain text a model reads past, about four
# bytes per token on a BPE tokenizer (the stub counts exactly four).
PAD_SENTENCE = "This line is background material for the question that follows. "
BYTES_PER_TOKEN = 4


def padded(prompt: str, context_tokens: int) -> str:
    """The prompt with filler in front, to about `context_tokens` tokens in all (4 bytes a token); as written
    for 0 or a prompt already that long. The question stays last, as in a long-context request."""
    missing = context_tokens * BYTES_PER_TOKEN - len(prompt.encode("utf-8"))
    if context_tokens == 0 or missing <= 0:
        return prompt
    filler = (PAD_SENTENCE * (missing // len(PAD_SENTENCE) + 1))[:missing]
    return filler + prompt


def prefixed(prompt: str, arm_id: str) -> str:
    """The prompt as arm `arm_id` of a bracket sends it: `[run ARM_ID] ` prepended.

    vLLM's automatic prefix cache keeps the KV blocks of earlier prompts, and a later arm that sends
    the same text skips their prefill: its throughput and first-token times look better for a reason
    that has nothing to do with its configuration (vllm#52884). Each block's cache key chains its
    parent's, so a prefix that differs in the first block makes every block of the prompt a miss.
    The prefix is the same length for arms with ids of the same length, so arms stay comparable.
    Give every arm of every bracket its own id (e.g. the bracket's start time plus A1/B/A2).

    Throughput only: the prefix changes the text the model continues, so a fidelity comparison
    (same tokens for the same prompt) must send the unprefixed prompts to every arm.
    """
    if not arm_id or any(ch in arm_id for ch in "\r\n]"):
        raise ValueError(f"arm id must be non-empty, one line, without ']': {arm_id!r}")
    return f"[run {arm_id}] {prompt}"


def workload_file(recipes_dir: Path, name_or_path: str) -> Path:
    """`--workload coding` -> recipes/workloads/coding.yaml; an existing file path is taken as given."""
    given = Path(name_or_path)
    # exists(), not is_file(): a directory or FIFO named x.yaml is reported by load_workload, not "unknown".
    if given.suffix in (".yaml", ".yml") and given.exists():
        return given
    folder = recipes_dir / WORKLOADS_DIR
    candidate = folder / f"{name_or_path}.yaml"
    if "/" not in name_or_path and candidate.exists():
        return candidate
    known = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    hint = f"; known workloads: {', '.join(known)}" if known else f"; no workloads in {folder}"
    raise BadInput(f"no workload {name_or_path!r}{hint}")


def load_workload(path: Path, shown: str | None = None, *, max_model_len: int | None = None,
                  lane: str = "") -> Workload:
    """Read and validate one workload file; raise `WorkloadInvalid` naming file, line and field of each problem.

    With `max_model_len` (the lane's --max-model-len), a context length that leaves no room for the
    workload's max_tokens within it is refused too, at its line: the engine would refuse every request.
    """
    shown = shown or str(path)
    try:
        doc = read_yaml_file(path, shown)
    except YamlSyntaxError as exc:
        raise WorkloadInvalid([exc.problem]) from None
    if not isinstance(doc.data, dict):
        raise WorkloadInvalid([Problem(shown, 1, 1, "", "a workload is a YAML mapping with schema, name, "
                                                         "max_tokens and classes")])
    try:
        workload = Workload.model_validate(doc.data)
    except ValidationError as exc:
        raise WorkloadInvalid(problems_from_validation(exc, doc, Workload)) from None
    problems = [doc.problem(("agent_classes", i), f"{name!r} is not a class of this workload; it has: "
                            + ", ".join(workload.classes))
                for i, name in enumerate(workload.agent_classes) if name not in workload.classes]
    problems += [doc.problem(("context_lengths", i), f"{tokens} is listed twice")
                 for i, tokens in enumerate(workload.context_lengths) if tokens in workload.context_lengths[:i]]
    if max_model_len is not None:
        problems += [doc.problem(("context_lengths", i),
                                 f"{tokens} tokens + max_tokens {workload.max_tokens} exceed {lane or 'the lane'}'s "
                                 f"--max-model-len {max_model_len}")
                     for i, tokens in enumerate(workload.context_lengths)
                     if tokens + workload.max_tokens > max_model_len]
    problems += [doc.problem(("probes", i), f"no probe {name!r} ({probe_file(path, name)} does not exist); known: "
                                           f"{', '.join(known_probes(path)) or 'none'}")
                 for i, name in enumerate(workload.probes or []) if not probe_file(path, name).is_file()]
    problems += [doc.problem(("probes", i), f"probe {name!r} is named twice")
                 for i, name in enumerate(workload.probes or []) if name in (workload.probes or [])[:i]]
    if problems:
        raise WorkloadInvalid(problems)
    return workload
