from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lanectl.errors import BadInput
from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.output import Result, info
from lanectl.project import leaves
from lanectl.recipe.catalog import Lane


def render_lane(lane: Lane, out_dir: Path | None) -> Result:
    from lanectl.image.kernel_source import cached_source
    from lanectl.project import cache_dir
    from lanectl.state.out_paths import check_output_folder

    if out_dir is not None:
        check_output_folder(out_dir, "--out", empty=True)
    cached = {kernel.name: source.path for kernel in lane.kernels
              if kernel.source.git is not None and (source := cached_source(kernel, cache_dir())) is not None}
    plan = plan_image(lane, cached)
    specs = plan_containers(lane, plan)
    containers = [spec.as_dict() for spec in specs]
    if out_dir is not None:
        _write_context(plan.files, containers, out_dir)
    services = []
    if lane.spec.placement.backend == "swarm":
        from lanectl.fleet.services import plan_service

        # The recipe's nodes, or a placeholder when the lane may go to any node with its labels.
        for node in lane.spec.placement.nodes or ["NODE"]:
            services += [plan_service(lane, spec, node, with_gpus=True, inputs=plan.input_hash) for spec in specs]
    data = {
        "services": services,
        "lane": lane.name,
        "recipe": lane.recipe.id,
        "image": plan.tag,
        "moving_tag": plan.moving_tag,
        "input_hash": plan.input_hash,
        "labels": plan.labels,
        "dockerfile": plan.dockerfile,
        "context": [{"path": f.path, "size": len(f.content), "mode": f"{f.mode:o}",
                     "sha256": hashlib.sha256(f.content).hexdigest()} for f in plan.files],
        "kernel_sources": [{"kernel": tree.kernel, "context": f"{tree.prefix}/", "origin": tree.origin,
                            "fetched": str(tree.path) if tree.path else None} for tree in plan.fetched_trees],
        "containers": containers,
    }
    written = () if out_dir is None else (info(f"wrote the build context and containers.json to {out_dir}"),)
    return Result("render", data, written)


def _write_context(files: Any, containers: list[dict[str, Any]], out_dir: Path) -> None:
    # --out may be any folder the user names, inside the project or not: it is their choice. But it
    # must be new or empty, nothing is written outside it (a context path cannot climb out, and a
    # folder inside it is never a symlink we would write through), and no file is overwritten.
    from lanectl.errors import OperationFailed
    from lanectl.state.out_paths import check_output_folder

    check_output_folder(out_dir, "--out", empty=True)  # again: the folder may have been filled meanwhile
    try:
        _write_files(files, containers, out_dir)
    except OSError as exc:
        raise OperationFailed(f"--out {out_dir}: could not write the build context ({exc.strerror or exc})") \
            from None


def _write_files(files: Any, containers: list[dict[str, Any]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    root = out_dir.resolve()
    for item in files:
        target = root / item.path
        if leaves(target, root) or any(p.is_symlink() for p in target.parents if p.is_relative_to(root)):
            raise BadInput(f"--out: {item.path} would be written outside {out_dir}; nothing more was written")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("xb") as handle:
            handle.write(item.content)
        target.chmod(item.mode)
    with (root / "containers.json").open("x") as handle:
        handle.write(json.dumps(containers, indent=2) + "\n")


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "render": {
        "example": """\
$ lanectl render stub-a | head -3
# lane stub-a  image lanectl/demo:stub-a-8c64cdec2fc2  inputs 8c64cdec2fc2…
# ---- Dockerfile ----
# Rendered by lanectl from lanectl's built-in template stub-engine/Dockerfile.j2: lane stub-a of recipe demo.
$ lanectl render h2-REF --out /tmp/h2-context    # the whole build context, to read or to diff
""",
        "exit": {
            0: "rendered",
            2: "an unknown lane, an invalid recipe or an unusable --out folder",
        },
    },
}
