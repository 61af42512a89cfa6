"""`lanectl pin check VERSION`: what moving each lane's vLLM pin to VERSION would break, from the released source.

For every lane that names its vLLM release (`image.vllm`), against VERSION's sdist and the flashinfer it pins:
patches (applies, already upstream, conflicts), startup-log rules no log call of the release can print, serve flags
its parser does not know, the flashinfer autotune cache (where it lives, whether the first start finds the pin's),
build steps the release needs; and for the release: development routes lanectl does not name, answers that changed,
the torch.compile cache key. Each finding says where it comes from.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from lanectl.image.in_image.patching import Patch, PatchStatus, apply, check, parse_patch_file
from lanectl.image.patch_check import PypiBase, check_against_sdist, parse_base
from lanectl.image.upstream import Progress, extract_files, released_versions
from lanectl.pin.facts import WARM_LEGACY_FUNCTION, WARM_MANAGED_FUNCTION
from lanectl.pin.log_calls import LogCall, messages_of_patched_file
from lanectl.pin.report import Finding, LaneReport, PinReport, Verdict
from lanectl.pin.rule_match import printing_calls
from lanectl.pin.sources import Release, load_release
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.recipe.locate import lane_field_location, shown_path
from lanectl.recipe.model import DEV_MODE_ROUTES, Engine, StartupStall, flag_value
from lanectl.recipe.yaml_source import PathKey
from lanectl.records import frozen

RELEASE_NUMBER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
AUTOTUNE_STARTS = "Autotuning process starts"
CONTAINER_HOME = "/root"  # vLLM's images run as root


@frozen
class _Lane:
    """A lane as the checks need it, with where its values are written."""

    lane: Lane
    recipe: str
    where: Callable[[PathKey], str]

    @property
    def engine(self) -> Engine:
        return self.lane.spec.engine

    def single_rank(self) -> bool:
        args = self.engine.args
        sizes = [flag_value(args, flag) for flag in ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size",
                                                     "-pp", "--data-parallel-size", "-dp")]
        return all(size in (None, "1") for size in sizes)

    def home(self) -> str | None:
        return CONTAINER_HOME if self.engine.user in (None, "root", "0", "root:root", "0:0") else None


def release_key(version: str) -> tuple[int, int, int] | None:
    found = RELEASE_NUMBER.match(version)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


# --- patches --------------------------------------------------------------------------------------------------------

def _patches(lane: _Lane, patches_dir: Path) -> list[tuple[int, Patch]]:
    out = []
    for index, ref in enumerate(lane.lane.spec.patches):
        patch = parse_patch_file(patches_dir / ref.path, ref.path)
        base = parse_base(patch)
        if isinstance(base, PypiBase) and base.project.lower() == "vllm":
            out.append((index, patch))
    return out


def _upstream_since(patch: Patch, pinned: str, target: str, cache_dir: Path, progress: Progress | None) -> str | None:
    """The first release between the pin and `target` that already carries the patch, if any."""
    low, high = release_key(pinned), release_key(target)
    if low is None or high is None:
        return None
    between = sorted((key, version) for version in released_versions("vllm")
                     if (key := release_key(version)) is not None and low < key < high)
    for _, version in between:
        (report,) = check_against_sdist([patch], load_release(version, cache_dir, progress).sdist)
        if report.status == PatchStatus.ALREADY_UPSTREAM:
            return version
    return None


def patch_findings(lane: _Lane, release: Release, patches: list[tuple[int, Patch]], pristine: Path,
                   cache_dir: Path, progress: Progress | None) -> list[Finding]:
    """Each of the lane's vLLM patches against the release's files (extracted under `pristine`)."""
    findings = []
    for index, patch in patches:
        report = check(patch, pristine)
        where = lane.where(("patches", index))
        name = patch.name
        if report.status == PatchStatus.ALREADY_UPSTREAM:
            findings.append(Finding("patch", Verdict.BREAKS, f"{name} is already upstream in vLLM {release.version}: "
                                    "drop it (applying it changes nothing)", where))
        elif report.status == PatchStatus.CONFLICTS:
            failing = next(f for f in report.files if f.status == PatchStatus.CONFLICTS)
            reason = failing.conflict.reason if failing.conflict else failing.message
            hunk = f"{failing.path}: {reason}"
            since = _upstream_since(patch, lane.lane.spec.image.vllm or "", release.version, cache_dir, progress)
            if since is not None:
                findings.append(Finding("patch", Verdict.BREAKS, f"{name} conflicts with vLLM {release.version} "
                                        f"({hunk}), which changed that code again; it is upstream since vLLM {since}: "
                                        "drop it", where))
            else:
                findings.append(Finding("patch", Verdict.BREAKS, f"{name} conflicts with vLLM {release.version}: "
                                        f"{hunk}", where))
        else:
            findings.append(Finding("patch", Verdict.OK, f"{name} applies to vLLM {release.version}", where))
    return findings


def _patched_log_calls(patches: list[tuple[int, Patch]], pristine: Path) -> tuple[set[str], list[LogCall]]:
    """The files the lane's applying patches change or create, and the messages in them once patched."""
    calls: list[LogCall] = []
    with tempfile.TemporaryDirectory(prefix="lanectl-pin-patched-") as scratch:
        root = Path(scratch) / "tree"
        shutil.copytree(pristine, root)
        changed = {f.path for _, patch in patches if (report := apply(patch, root)).written for f in report.files}
        for relpath in sorted(changed):
            path = root / relpath
            if path.is_file():
                calls += messages_of_patched_file(path.read_text(encoding="utf-8", errors="replace"), relpath)
    return changed, calls


# --- startup rules --------------------------------------------------------------------------------------------------

def _uses_managed_store(lane: _Lane, release: Release) -> bool:
    managed = release.vllm.autotune.managed
    return managed is not None and (not managed.single_rank_only or lane.single_rank())


def lane_log_calls(lane: _Lane, release: Release, patches: list[tuple[int, Patch]], pristine: Path
                   ) -> list[LogCall]:
    """What this lane's engine can print on its start with `release`: vLLM's and flashinfer's logger calls, the
    patched files' instead of the originals, without the warm-cache line of the autotune path the lane does not
    take (0.33.0's managed store never calls the JSON file's loader, and the other way round), and without debug
    lines unless the lane logs at DEBUG (VLLM_LOGGING_LEVEL; vLLM's default is INFO)."""
    changed, patched = _patched_log_calls(patches, pristine)
    calls = [call for call in release.vllm.log_calls if call.file not in changed] + patched
    if release.flashinfer is not None:
        skipped = WARM_LEGACY_FUNCTION if _uses_managed_store(lane, release) else WARM_MANAGED_FUNCTION
        calls += [call for call in release.flashinfer.log_calls if call.function != skipped]
    if lane.engine.env.get("VLLM_LOGGING_LEVEL", "INFO").upper() != "DEBUG":
        calls = [call for call in calls if call.level != "DEBUG"]
    return calls


def _rules(lane: _Lane) -> list[tuple[str, str, PathKey]]:
    """(what, regex, where) of every rule a start must print a line for."""
    log = lane.lane.spec.health.startup_log
    rules: list[tuple[str, str, PathKey]] = [
        ("expect", pattern, ("health", "startup_log", "expect", i)) for i, pattern in enumerate(log.expect)]
    for i, stall in enumerate(log.stall):
        at: PathKey = ("health", "startup_log", "stall", i)
        rules += [("stall after", stall.after, at), ("stall until", stall.until, at)]
        if stall.warm is not None:
            rules.append(("stall warm", stall.warm, at))
    return rules


def _other_path(lane: _Lane, release: Release, regex: str) -> str:
    """When the rule matches the warm-cache line of the autotune path this lane does not take: which path it takes,
    and what that one prints instead."""
    managed = release.vllm.autotune.managed
    if release.flashinfer is None or managed is None:
        return ""
    skipped = WARM_LEGACY_FUNCTION if _uses_managed_store(lane, release) else WARM_MANAGED_FUNCTION
    unreached = printing_calls(regex, [c for c in release.flashinfer.log_calls if c.function == skipped])
    if not unreached:
        return ""
    if not _uses_managed_store(lane, release):
        return (f"; {unreached[0].template!r} ({unreached[0].where}) is flashinfer's managed store's, which vLLM "
                f"{release.version} uses for single-rank lanes only ({managed.where})")
    taken = [c for c in release.flashinfer.log_calls if c.function == WARM_MANAGED_FUNCTION]
    instead = f" and flashinfer's {taken[0].template!r} ({taken[0].where})" if taken else ""
    return (f"; on this lane vLLM {release.version} uses flashinfer's managed autotune store ({managed.where}), "
            f"never the JSON cache file whose loader prints {unreached[0].template!r} ({unreached[0].where}); it "
            f"logs {managed.log_line!r} ({managed.log_where}){instead} instead")


def rule_findings(lane: _Lane, release: Release, calls: list[LogCall]) -> list[Finding]:
    findings = []
    for what, regex, at in _rules(lane):
        printers = printing_calls(regex, calls)
        other_path = _other_path(lane, release, regex)
        if not printers:
            findings.append(Finding("startup rule", Verdict.BREAKS, f"{what} {regex!r}: no log call of vLLM "
                                    f"{release.version} (or flashinfer {release.vllm.flashinfer}, or the lane's "
                                    "patches) prints a line it matches on this lane's start" + other_path,
                                    lane.where(at)))
        elif other_path:
            shown = ", ".join(call.where for call in printers[:3])
            findings.append(Finding("startup rule", Verdict.NOTE, f"{what} {regex!r} matches {shown} on this lane's "
                                    "start" + other_path, lane.where(at)))
    return findings


# --- serve flags ----------------------------------------------------------------------------------------------------

_FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9_-]*")


def flag_findings(lane: _Lane, release: Release) -> list[Finding]:
    known = set(release.vllm.serve_flags)
    findings = []
    engines: list[tuple[PathKey, Engine]] = [(("engine", "args"), lane.engine)]
    engines += [(("companions", role, "engine", "args"), companion.engine)
                for role, companion in lane.lane.spec.companions.items()]
    for at, engine in engines:
        if engine.entrypoint is not None:
            continue  # not `vllm serve`
        for arg in engine.args:
            found = _FLAG.match(arg)
            if found is None:
                continue
            flag = found[0].replace("_", "-")
            if flag in known or (flag.startswith("--no-") and "--" + flag[5:] in known):
                continue
            findings.append(Finding("serve flag", Verdict.BREAKS, f"{flag}: vLLM {release.version}'s `vllm serve` "
                                    "has no such option (its parser refuses it)", lane.where(at)))
    return findings


# --- the flashinfer autotune cache ----------------------------------------------------------------------------------

def _expand(path: str, home: str) -> str:
    return home + path[1:] if path.startswith("~") else path


def _autotune_root(lane: _Lane, release: Release) -> tuple[str, str] | None:
    """Where the lane's tuned results live with `release` (a container path), and which setting put them there;
    None when that depends on a home the recipe does not say."""
    env = lane.engine.env
    home = lane.home()
    autotune = release.vllm.autotune
    if _uses_managed_store(lane, release) and autotune.managed is not None:
        if autotune.managed.root_env and autotune.managed.root_env in env:
            return env[autotune.managed.root_env], autotune.managed.root_env
        fi = release.flashinfer
        if fi is not None and fi.managed_root_env and fi.managed_root_env in env:
            return env[fi.managed_root_env], fi.managed_root_env
        if fi is not None and fi.workspace_base_env and fi.workspace_base_env in env:
            return f"{env[fi.workspace_base_env]}/.cache/flashinfer/autotune", fi.workspace_base_env
        if home is None or fi is None or fi.managed_root_default is None:
            return None
        return _expand(fi.managed_root_default, home), f"flashinfer {fi.version}'s default"
    if autotune.legacy_root_env and autotune.legacy_root_env in env:
        return env[autotune.legacy_root_env], autotune.legacy_root_env
    if "VLLM_CACHE_ROOT" in env:
        return f"{env['VLLM_CACHE_ROOT']}/flashinfer_autotune_cache", "VLLM_CACHE_ROOT"
    if "XDG_CACHE_HOME" in env:
        return f"{env['XDG_CACHE_HOME']}/vllm/flashinfer_autotune_cache", "XDG_CACHE_HOME"
    if home is None:
        return None
    return _expand(release.vllm.cache_root_default, home) + "/flashinfer_autotune_cache", \
        f"vLLM {release.version}'s default"


def _inside(path: str, target: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(target) or PurePosixPath(target) in PurePosixPath(path).parents


def cache_findings(lane: _Lane, release: Release) -> list[Finding]:
    root = _autotune_root(lane, release)
    store = "flashinfer's managed autotune store" if _uses_managed_store(lane, release) else \
        "the flashinfer autotune cache"
    where = release.vllm.autotune.managed.where if _uses_managed_store(lane, release) and \
        release.vllm.autotune.managed else release.vllm.autotune.legacy_file_where
    if root is None:
        return [Finding("cache", Verdict.NOTE, f"{store} lives under the home of user {lane.engine.user!r}, "
                        "which the recipe does not say: cannot tell whether it stays in a volume", where)]
    path, by = root
    volumes = [volume.target for volume in lane.engine.volumes]
    if any(_inside(path, target) for target in volumes):
        return [Finding("cache", Verdict.OK, f"{store} stays in a volume: {path} ({by}; vLLM {release.version}: "
                        f"{where})", lane.where(("engine", "volumes")))]
    return [Finding("cache", Verdict.BREAKS, f"{store} leaves the recipe's volumes: {path} ({by}; vLLM "
                    f"{release.version}: {where}) is in none of {volumes}, so every new container retunes. Place it "
                    "in a volume through the lane's environment", lane.where(("engine", "env")))]


def _cold_reasons(lane: _Lane, release: Release, pinned: Release) -> list[str]:
    """Why the first start with `release` finds none of the results the pin's starts tuned."""
    reasons = []
    if _uses_managed_store(lane, release) and not _uses_managed_store(lane, pinned):
        managed = release.vllm.autotune.managed
        assert managed is not None
        reasons.append(f"vLLM {release.version} keeps a single-rank lane's results in flashinfer's managed store "
                       f"({managed.where}), which starts empty: nothing vLLM {pinned.version} saved is read")
    elif not _uses_managed_store(lane, release):
        old, new = pinned.vllm.autotune.legacy_file, release.vllm.autotune.legacy_file
        if old != new:
            reasons.append(f"vLLM {release.version} reads {new} ({release.vllm.autotune.legacy_file_where}) where "
                           f"vLLM {pinned.version} wrote {old}, and never the old name")
        if pinned.vllm.flashinfer != release.vllm.flashinfer and release.vllm.autotune.legacy_root_env not in \
                lane.engine.env:
            reasons.append(f"the cache folder holds flashinfer's version, {pinned.vllm.flashinfer} -> "
                           f"{release.vllm.flashinfer}")
    return reasons


def _warm_only(regex: str, calls: list[LogCall]) -> bool:
    printers = printing_calls(regex, calls)
    return bool(printers) and all(call.function in (WARM_LEGACY_FUNCTION, WARM_MANAGED_FUNCTION)
                                  for call in printers)


def first_start_findings(lane: _Lane, release: Release, pinned: Release, calls: list[LogCall]) -> list[Finding]:
    """The first start after the move, when it cannot use what the pin tuned: a retune from scratch. The lane's
    rules must let it happen once: no expect rule that only a warm cache prints, a cold allowance on the autotune
    stall."""
    reasons = _cold_reasons(lane, release, pinned)
    if not reasons:
        return [Finding("first start", Verdict.OK, f"the first start on vLLM {release.version} reads the autotune "
                        f"results vLLM {pinned.version} saved", lane.where(("engine",)))]
    why = "; ".join(reasons)
    findings = []
    log = lane.lane.spec.health.startup_log
    starts = [call for call in calls if AUTOTUNE_STARTS in call.template]
    for i, stall in enumerate(log.stall):
        if not any(printing_calls(stall.after, [call]) for call in starts):
            continue
        findings.append(_cold_stall(stall, release, why, lane.where(("health", "startup_log", "stall", i))))
    for i, pattern in enumerate(log.expect):
        if _warm_only(pattern, calls):
            findings.append(Finding("first start", Verdict.BREAKS, f"expect {pattern!r} matches only the line a "
                                    "warm autotune cache prints, and the first start on vLLM "
                                    f"{release.version} has none ({why}): the gate waits out its budget, on every "
                                    "try. Move it to the stall's `warm`", lane.where(("health", "startup_log",
                                                                                      "expect", i))))
    if not findings:
        findings.append(Finding("first start", Verdict.NOTE, f"the first start on vLLM {release.version} retunes "
                                f"from scratch ({why}); no rule of the lane holds it to a warm cache",
                                lane.where(("health",))))
    return findings


def _cold_stall(stall: StartupStall, release: Release, why: str, where: str) -> Finding:
    if stall.cold_minutes is None:
        return Finding("first start", Verdict.BREAKS, f"the first start on vLLM {release.version} retunes from "
                       f"scratch ({why}): the stall {stall.label} ({stall.minutes:g} min) fails it and the lane rolls "
                       "back, on every try. Give the stall `warm` (the line of a warm cache) and `cold_minutes`",
                       where)
    return Finding("first start", Verdict.NOTE, f"the first start on vLLM {release.version} retunes from scratch "
                   f"({why}); the stall {stall.label} allows that cold run {stall.cold_minutes:g} min, and the "
                   "budget grows by as much", where)


# --- build steps ----------------------------------------------------------------------------------------------------

def build_findings(lane: _Lane, release: Release) -> list[Finding]:
    command = release.vllm.download_kernels
    if command is None:
        return []
    warning = release.vllm.download_kernels_warning
    said = f"; without it the engine warns at start ({warning})" if warning else ""
    if lane.lane.spec.image.download_kernels:
        return [Finding("build", Verdict.OK, f"the image runs `vllm download-kernels` ({command})",
                        lane.where(("image", "download_kernels")))]
    return [Finding("build", Verdict.BREAKS, f"vLLM {release.version} images need `vllm download-kernels` at build "
                    f"({command}){said} and download or compile FlashInfer's kernels at every start: set "
                    "image.download_kernels: true", lane.where(("image",)))]


# --- the release as a whole -----------------------------------------------------------------------------------------

def release_findings(release: Release, pinned: Release) -> list[Finding]:
    findings = []
    named = {path for paths in DEV_MODE_ROUTES.values() for path in paths}
    for path, where in release.vllm.dev_routes.items():
        if path not in named:
            findings.append(Finding("dev routes", Verdict.BREAKS, f"development mode mounts {path}, which lanectl's "
                                    "exposed-routes warning (DEV_MODE_ROUTES, the README) does not name", where))
        elif path not in pinned.vllm.dev_routes:
            findings.append(Finding("dev routes", Verdict.NOTE, f"development mode adds {path} (not in vLLM "
                                    f"{pinned.version}); lanectl's exposed-routes warning names it", where))
    for path, answer in release.vllm.sleep_answers.items():
        before = pinned.vllm.sleep_answers.get(path)
        if before != answer:
            findings.append(Finding("answers", Verdict.NOTE, f"POST {path} answers {answer} (vLLM {pinned.version}: "
                                    f"{before}); lanectl reads the engine's state from /is_sleeping, not this body",
                                    "vllm/entrypoints/serve/dev/sleep/api_router.py"))
    if release.vllm.compile_key_version and release.version != pinned.version:
        findings.append(Finding("compile cache", Verdict.NOTE, "the torch.compile cache key holds vLLM's version: "
                                f"the first start on {release.version} compiles from scratch, once",
                                release.vllm.compile_key_version))
    for name, old, new in (("flashinfer-python", pinned.vllm.flashinfer, release.vllm.flashinfer),
                           ("torch", pinned.vllm.torch, release.vllm.torch)):
        if old != new:
            findings.append(Finding("pins", Verdict.NOTE, f"vLLM {release.version} pins {name} {new} (vLLM "
                                    f"{pinned.version}: {old}): the base image must carry it", "PKG-INFO"))
    return findings


# --- the whole check ------------------------------------------------------------------------------------------------

def check_lane(lane: _Lane, release: Release, pinned: Release, patches_dir: Path, cache_dir: Path,
               progress: Progress | None) -> LaneReport:
    patches = _patches(lane, patches_dir)
    with tempfile.TemporaryDirectory(prefix="lanectl-pin-check-") as scratch:
        pristine = Path(scratch)
        # One pass over the sdist for every file the lane's patches touch; a file the release lacks is a conflict.
        extract_files(release.sdist, [t for _, patch in patches for t in patch.targets], pristine, missing_ok=True)
        calls = lane_log_calls(lane, release, patches, pristine)
        findings = [*patch_findings(lane, release, patches, pristine, cache_dir, progress),
                    *rule_findings(lane, release, calls), *flag_findings(lane, release),
                    *cache_findings(lane, release), *first_start_findings(lane, release, pinned, calls),
                    *build_findings(lane, release)]
    return LaneReport(lane.lane.name, lane.recipe, pinned.version, findings)


def check_pin(catalog: Catalog, version: str, cache_dir: Path, progress: Progress | None = None) -> PinReport:
    """Every lane that names its vLLM release, against `version`. Lanes without `image.vllm` are listed, not
    checked. Raises PatchFormatError for a lane's unreadable patch, UpstreamError when a source cannot be fetched."""
    project = catalog.project
    lanes = sorted(catalog.lanes.values(), key=lambda lane: (str(lane.recipe.file), lane.name))
    checked = [lane for lane in lanes if lane.spec.image.vllm]
    not_checked = [f"{lane.name}: no image.vllm (not a vLLM image, or its release is not named)"
                   for lane in lanes if not lane.spec.image.vllm]
    release = load_release(version, cache_dir, progress)
    pinned_releases: dict[str, Release] = {}
    reports = []
    release_level: list[Finding] = []
    for lane in checked:
        pinned_version = lane.spec.image.vllm or ""
        if pinned_version not in pinned_releases:
            pinned_releases[pinned_version] = load_release(pinned_version, cache_dir, progress)
            release_level += release_findings(release, pinned_releases[pinned_version])
        shown = shown_path(lane.recipe.file, project.root)

        def where(path: PathKey, lane: Lane = lane, shown: str = shown) -> str:
            return lane_field_location(lane, path, shown)

        reports.append(check_lane(_Lane(lane, shown, where), release, pinned_releases[pinned_version],
                                  project.patches_dir, cache_dir, progress))
    return PinReport(version, release.vllm.flashinfer, list(dict.fromkeys(release_level)), reports, not_checked)

