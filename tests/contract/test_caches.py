"""caches: where the vLLM release's own autotune code keeps a lane's flashinfer autotune results, held against the
lane's volumes.

A cache outside every volume is lost with the container, so every start retunes (74 minutes on the production box).
vLLM 0.33.0 moved a single-rank lane's results into flashinfer's managed store, under flashinfer's own cache folder
unless the lane's environment places it. The files are the ones vLLM's `flashinfer_autotune()` left after a start that
tuned, run for real in the lane's environment (vllm_oracle.flashinfer_autotune_start); failures name the recipe's
volumes and environment.
"""

from __future__ import annotations

import pytest
import vllm_oracle as oracle
from lanes import lanes, where
from start_sequence import autotune_start

from lanectl.recipe.catalog import Lane

VLLM_IMAGE_LANES = [lane for lane in lanes() if lane.spec.image.template == "vllm"]


def _inside(path: str, target: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


@pytest.mark.parametrize("lane", VLLM_IMAGE_LANES, ids=lambda lane: lane.name)
def test_the_autotune_cache_stays_in_the_lanes_volumes(lane: Lane) -> None:
    files = autotune_start(lane).cache_files
    assert files, f"{oracle.RELEASE}'s flashinfer_autotune() left no autotune cache file for {lane.name}"
    targets = [volume.target for volume in lane.spec.engine.volumes]
    outside = [path for path in files if not any(_inside(path, target) for target in targets)]
    assert not outside, (
        f"{where(lane, ('engine', 'volumes'))}: {oracle.RELEASE} keeps {lane.name}'s flashinfer autotune results in "
        f"{outside}, outside its volumes {targets}: every new container retunes. Place the cache in a volume through "
        f"the environment ({where(lane, ('engine', 'env'))}), e.g. FLASHINFER_AUTOTUNE_CACHE_DIR for flashinfer's "
        "managed store")
