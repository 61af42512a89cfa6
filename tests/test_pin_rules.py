"""Reading a release's logger calls, and deciding whether one can print a line a startup rule matches (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanectl.errors import EXIT_FAILED
from lanectl.pin.facts import SourceChanged, autotune_facts, dev_routes
from lanectl.pin.log_calls import LogCall, log_calls, messages_of_patched_file
from lanectl.pin.release import ReleaseSource
from lanectl.pin.rule_match import can_print

SOURCE = '''
import logging
logger = logging.getLogger(__name__)
PREFIX = "split-KV overlay:"


class AutoTuner:
    def load_configs(self, path):
        logger.info(f"[Autotuner]: Loaded {len(configs) - skipped} configs from {path}")


def hydrate(entries, total, skipped):
    logger.info(f"[Autotuner]: Preloaded {len(entries)}/{total} managed cache entries into memory"
                + (f" ({skipped} not preloadable)" if skipped else ""))


def start(value):
    logger.info("Total CPU offloaded parameters: %s", value)
    logger.info_once("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx", 1, 2, 3, 4)
    logger.info("%s", value)
    logger.debug("Loaded %d configs for kernel '%s'", 1, "k")
    logger.warning(f"{PREFIX} off ({value})")
    text = f"{PREFIX} on, {value} splits at 1 request x {value} query tokens"
    print(text)
'''


def calls() -> dict[str, LogCall]:
    return {call.template: call for call in log_calls(SOURCE, "pkg/mod.py")}


def test_every_logger_call_is_read_with_its_function_level_and_template() -> None:
    found = log_calls(SOURCE, "pkg/mod.py")
    assert [(c.function, c.level, c.template, c.line) for c in found] == [
        ("AutoTuner.load_configs", "INFO", "[Autotuner]: Loaded {…} configs from {…}", 9),
        ("hydrate", "INFO", "[Autotuner]: Preloaded {…}/{…} managed cache entries into memory{…}", 13),
        ("start", "INFO", "Total CPU offloaded parameters: %s", 18),
        ("start", "INFO", "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx", 19),
        ("start", "INFO", "%s", 20),
        ("start", "DEBUG", "Loaded %d configs for kernel '%s'", 21),
        # A module's string constant in an f-string is its text: the overlay's prefix, not a value.
        ("start", "WARNING", "split-KV overlay: off ({…})", 22),
    ]


def test_a_patched_file_counts_every_string_it_formats_as_a_message() -> None:
    templates = [call.template for call in messages_of_patched_file(SOURCE, "pkg/mod.py")]
    assert "split-KV overlay: on, {…} splits at 1 request x {…} query tokens" in templates
    assert "split-KV overlay: on, {…} splits at 1 request x {…} query tokens" not in calls()


@pytest.mark.parametrize(("rule", "template"), [
    ("Loaded 210 configs", "[Autotuner]: Loaded {…} configs from {…}"),
    ("^Total CPU offloaded parameters: 60(\\.0+)?$", "Total CPU offloaded parameters: %s"),
    ("KV cache size: [0-9,]+ tokens",
     "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"),
    ("^GPU KV cache size", "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"),
    ("Loaded 210 configs|Preloaded 210/[0-9]+ managed cache entries",
     "[Autotuner]: Preloaded {…}/{…} managed cache entries into memory{…}"),
    ("^split-KV overlay: off", "split-KV overlay: off ({…})"),
])
def test_a_rule_can_be_printed_when_the_literal_text_and_values_fit(rule: str, template: str) -> None:
    assert can_print(rule, calls()[template])


@pytest.mark.parametrize(("rule", "template", "why"), [
    ("Loaded 210 configs", "[Autotuner]: Preloaded {…}/{…} managed cache entries into memory{…}", "other text"),
    ("^Total CPU offloaded parameters: 60(\\.0+)?$", "%s KV cache size: %s tokens, Maximum concurrency for %s tokens "
     "per request: %.2fx", "other text"),
    ("Autotuning process starts", "%s", "a bare hole is a value, not a sentence"),
    ("EngineDeadError", "%s", "a bare hole gives no literal character of the rule"),
    ("^KV cache size", "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
     "anchored: the message starts with the device's name"),
    ("configs from x y", "[Autotuner]: Loaded {…} configs from {…}", "a value holds no space"),
    ("Total CPU offloaded parameters: 60$", "[Autotuner]: Loaded {…} configs from {…}", "other text"),
])
def test_a_rule_cannot_be_printed_by_a_call_that_cannot_produce_its_text(rule: str, template: str, why: str) -> None:
    assert not can_print(rule, calls()[template]), why


def test_a_release_whose_source_moved_on_is_said_to_be_unreadable_never_read_as_fine() -> None:
    """A reader that cannot find what it reads (a renamed module, a dropped function) fails the check (exit 1)
    and says what it looked for: a release lanectl cannot read is not a release that breaks nothing."""
    source = ReleaseSource("vllm", "9.0.0", Path("vllm-9.0.0.tar.gz"), {
        "vllm/model_executor/warmup/flashinfer_autotune_cache.py": "def other():\n    pass\n",
        "vllm/entrypoints/launchers/api_server/routers.py": "def build(app):\n    return app\n"})
    with pytest.raises(SourceChanged, match="9.0.0's vllm/model_executor/warmup/flashinfer_autotune_cache.py has no "
                                            r"function resolve_flashinfer_autotune_file\(\)") as caught:
        autotune_facts(source, [])
    assert caught.value.exit_code == EXIT_FAILED
    with pytest.raises(SourceChanged, match="no `if envs.VLLM_SERVER_DEV_MODE:` block"):
        dev_routes(source)


def test_the_docs_name_every_development_route_lanectl_warns_about() -> None:
    """`pin check` and the contract suite hold a release's development routes to DEV_MODE_ROUTES, and the standby
    page's exposed-routes warning is where an operator reads them: each route must be in both."""
    from lanectl.recipe.model import DEV_MODE_ROUTES
    from tests.conftest import REPO

    page = (REPO / "docs" / "standby.md").read_text()
    missing = [path for paths in DEV_MODE_ROUTES.values() for path in paths if f"`{path}`" not in page]
    assert not missing, f"docs/standby.md's exposed-routes warning does not name {missing}"
