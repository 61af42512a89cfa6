"""The switch's promises, stated once and checked where the action happens, against a fresh look at the engine.

A plan is made from one snapshot; between the snapshot and a step, a killed run, a watchdog pass, another
operator or the engine itself may have changed what runs. So the executor (`lanes/execute.py`) does not trust
the plan for what matters most: before every start and every wake it lists the engine's containers again and
asks each engine that could be in the way whether it sleeps, and before every stop it reads the container's own
stop timeout from the engine, and before every removal whether it still is stopped.

1. **One lane awake per GPU set and host port.** Before a start or a wake, no container of another lane is
   awake (running and not asleep) on the lane's GPUs, and none is live on its host ports (a sleeping vLLM keeps
   its port). A step that would break this is refused, naming what holds them, and the plan takes its way back.
2. **A stop gives a container its own drain.** The stop timeout a container was created with
   (`Config.StopTimeout`; its `--shutdown-timeout` was rendered from it) is what its stop allows, never a
   shorter or longer one from a recipe edited since.
3. **A lane is healthy only when every container of it is awake**: vLLM answers `/health` and `/v1/models` with
   200 while it sleeps (`lanes/snapshot.py` asks `/is_sleeping` of each, and a gate that passed asks each
   engine again, where it publishes: a companion's readiness is its /health alone).
4. **A removal removes only what is stopped**: a container the plan chose to prune or drop is inspected first,
   and one that runs now (started by hand since the snapshot, or by another state folder) is kept.
5. **A continuation converges, it does not replay**: finishing a killed switch first stops every other lane that
   is live on the target's GPUs or ports (`plan_reconcile`), as the switch itself would have.

docs/switching.md quotes this list; tests/test_switch_fuzz.py checks the promises after every move of a
stateful fuzzer, and shows that removing one of the executor's checks fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from lanectl.dockerapi.containers import ListedContainer
from lanectl.lanes.inventory import LANE_LABEL, RECIPE_LABEL, ROLE_LABEL, host_ports
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane

# Whether a running container's engine sleeps: True, False, or None when it does not say (no published port, no
# dev-mode routes, or no answer); None counts as awake, since the GPU memory it holds is unknown.
Asleep = Callable[[ListedContainer], bool | None]


def gpus_overlap(a: Lane, b: Lane) -> bool:
    if not (a.spec.uses_gpus() and b.spec.uses_gpus()):
        return False
    ids_a, ids_b = a.spec.gpu_ids(), b.spec.gpu_ids()
    return ids_a is None or ids_b is None or bool(ids_a & ids_b)


def awake_beside(catalog: Catalog, lane: Lane, listed: Iterable[ListedContainer], asleep: Asleep) -> list[str]:
    """Containers of other lanes that hold `lane`'s host ports (live) or are awake on its GPUs, described for
    the refusal. `listed` is a fresh listing of the engine; `asleep` is asked only of running containers that
    share a GPU with `lane`, on the host port each publishes (an orphan of a role its recipe no longer has, or
    a container renamed by hand, answers there as well as one under its lane's name)."""
    ports = host_ports(lane)
    holding = []
    for container in listed:
        other = catalog.lanes.get(container.labels.get(LANE_LABEL, ""))
        if other is None or other.name == lane.name or not container.live:
            continue
        if container.labels.get(RECIPE_LABEL) != other.recipe.id:
            continue  # a lane of the same name in a recipe these recipes do not hold: its GPUs are not known here
        role = container.labels.get(ROLE_LABEL, ROLE_PRIMARY)
        shared = sorted(set(container.host_ports) & ports)
        if shared:
            holding.append(f"{container.name} ({role} of {other.name}) holds host port {shared[0][1]}")
        elif gpus_overlap(other, lane) and not (container.running and asleep(container) is True):
            holding.append(f"{container.name} ({role} of {other.name}) is awake on the same GPUs")
    return holding


def own_stop_timeout(engine_says: int | None, planned: float) -> int:
    """What a stop allows: the container's own stop timeout as the engine reports it, else the plan's (a
    container the engine no longer has needs no stop)."""
    return int(planned) if engine_says is None else engine_says
