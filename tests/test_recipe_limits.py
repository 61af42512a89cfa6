"""Numbers in range, secrets kept out of the image, and fields that do what they say: exact located messages."""

from __future__ import annotations

import pytest

from lanectl.recipe.model import looks_like_secret
from tests.test_recipe_validation import GOOD, problems

LANE_B = '  b:\n    engine:\n      env: {X: "1"}\n'
HEALTH_END = "    served_model_name: m\n"
SECRET_HINT = ("looks like a secret; list it under 'secret_env' so it comes from the environment at start and "
               "never lands in the image")
FLAG_HINT = ("would bake a secret into the image and the container's config; drop its value, list the variable "
             "the engine reads (e.g. VLLM_API_KEY, HF_TOKEN) under 'secret_env' and set it in lanectl's environment")


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param((HEALTH_END, HEALTH_END + "  watchdog: {restart: {backoff_max_seconds: 1.0e+308}}\n"),
                 "recipes/r.yaml:16:45: defaults.watchdog.restart.backoff_max_seconds: Input should be less than or "
                 "equal to 86400, got 1e+308", id="backoff-1e308"),
    pytest.param((HEALTH_END, HEALTH_END + "  watchdog: {restart: {max_restarts: " + "9" * 400 + "}}\n"),
                 "recipes/r.yaml:16:38: defaults.watchdog.restart.max_restarts: Input should be less than or equal "
                 "to 100, got an integer of 400 digits", id="400-digit-integer"),
    pytest.param((HEALTH_END, HEALTH_END + "  watchdog: {restart: {window_minutes: .inf}}\n"),
                 "recipes/r.yaml:16:40: defaults.watchdog.restart.window_minutes: Input should be a finite number, "
                 "got inf", id="window-inf"),
    pytest.param((HEALTH_END, HEALTH_END + "  watchdog: {restart: {backoff_initial_seconds: 60, "
                                           "backoff_max_seconds: 10}}\n"),
                 "recipes/r.yaml:16:23: defaults.watchdog.restart: backoff_max_seconds (10) is below "
                 "backoff_initial_seconds (60); the backoff only grows", id="backoff-shrinks"),
    pytest.param((HEALTH_END, HEALTH_END + "    generation_probe: {timeout_seconds: 0}\n"),
                 "recipes/r.yaml:16:41: defaults.health.generation_probe.timeout_seconds: Input should be greater "
                 "than 0, got 0", id="probe-timeout-zero"),
    pytest.param((HEALTH_END, HEALTH_END + "  watchdog: {gpu_memory_release_timeout_seconds: 1.0e+12}\n"),
                 "recipes/r.yaml:16:50: defaults.watchdog.gpu_memory_release_timeout_seconds: Input should be less "
                 "than or equal to 3600, got 1000000000000.0", id="release-timeout-huge"),
    pytest.param((LANE_B, "  b:\n    engine:\n      gpus: {count: 100000}\n"),
                 "recipes/r.yaml:20:21: lanes.b.engine.gpus.count: Input should be less than or equal to 1024, got "
                 "100000 or Input should be 'all', got 100000", id="gpu-count-huge"),
    pytest.param((LANE_B, "  b:\n    engine:\n      shm_size: 99999999g\n"),
                 "recipes/r.yaml:20:17: lanes.b.engine.shm_size: '99999999g' must be between 1m and 4096g",
                 id="shm-size-huge"),
    pytest.param((HEALTH_END, HEALTH_END + "  watchdog: {xid: {hardware_codes: [-1]}}\n"),
                 "recipes/r.yaml:16:37: defaults.watchdog.xid.hardware_codes[0]: Input should be greater than or "
                 "equal to 1, got -1", id="xid-negative"),
    pytest.param((LANE_B, '  b:\n    engine:\n      env: {GITHUB_PAT: x}\n'),
                 f"recipes/r.yaml:20:13: lanes.b.engine.env.GITHUB_PAT: 'GITHUB_PAT' {SECRET_HINT}",
                 id="secret-pat"),
    pytest.param((LANE_B, '  b:\n    engine:\n      env: {DB_PASSWORD_PROD: x}\n'),
                 f"recipes/r.yaml:20:13: lanes.b.engine.env.DB_PASSWORD_PROD: 'DB_PASSWORD_PROD' {SECRET_HINT}",
                 id="secret-word-mid-name"),
    pytest.param((LANE_B, "  b:\n    engine:\n      args: [/model, --api-key, sk-123]\n"),
                 f"recipes/r.yaml:20:13: lanes.b.engine.args: --api-key {FLAG_HINT}", id="api-key-flag"),
    pytest.param((LANE_B, "  b:\n    engine:\n      args: [/model, --hf-token=hf_x]\n"),
                 f"recipes/r.yaml:20:13: lanes.b.engine.args: --hf-token {FLAG_HINT}", id="hf-token-equals"),
    pytest.param((LANE_B, "  b:\n    engine:\n      args: [/model, --api-ke, sk-123]\n"),
                 f"recipes/r.yaml:20:13: lanes.b.engine.args: --api-ke {FLAG_HINT}", id="api-key-abbreviated"),
    pytest.param((LANE_B, "  b:\n    engine:\n      args: [/model, --hf-tok=hf_x]\n"),
                 f"recipes/r.yaml:20:13: lanes.b.engine.args: --hf-tok {FLAG_HINT}", id="hf-token-abbreviated"),
    pytest.param((LANE_B, "  b:\n    companions:\n      rtx:\n        engine: {args: [--db-password, pw]}\n"),
                 f"recipes/r.yaml:21:24: lanes.b.companions.rtx.engine.args: --db-password {FLAG_HINT}",
                 id="companion-password-flag"),
    pytest.param((LANE_B, "  b:\n    engine:\n      volumes: [{source: /m, target: /a}, {source: /m, target: /b}]\n"),
                 "recipes/r.yaml:20:7: lanes.b.engine: volumes mount the host path '/m' twice; mount each once",
                 id="duplicate-volume-source"),
    pytest.param((LANE_B, "  b:\n    engine:\n      volumes: [{volume: c, target: /a}, {volume: c, target: /b}]\n"),
                 "recipes/r.yaml:20:7: lanes.b.engine: volumes mount the volume 'c' twice; mount each once",
                 id="duplicate-named-volume"),
    pytest.param((LANE_B, '  b:\n    engine:\n      volumes: [{volume: "a/b", target: /a}]\n'),
                 "recipes/r.yaml:20:26: lanes.b.engine.volumes[0].volume: 'a/b' is not a Docker volume name "
                 "([a-zA-Z0-9][a-zA-Z0-9_.-]*)", id="bad-volume-name"),
    pytest.param(("      - {container: 8000, host: 18000}\n", "      - {container: 8000, host: 18000, host_ip: x}\n"),
                 "recipes/r.yaml:12:49: defaults.engine.ports[0].host_ip: 'x' is not an IP address (e.g. 127.0.0.1, "
                 "0.0.0.0 or ::1)", id="bad-host-ip"),
    pytest.param((LANE_B, '  b:\n    engine:\n      user: "root; rm"\n'),
                 "recipes/r.yaml:20:13: lanes.b.engine.user: 'root; rm' is not a user: give name, uid, name:group "
                 "or uid:gid", id="bad-user"),
    pytest.param(("id: t\n", 'id: t\nnaming: {container: "my {lane}"}\n'),
                 "recipes/r.yaml:3:21: naming.container: 'my {lane}' does not expand to a Docker container name "
                 "([a-zA-Z0-9][a-zA-Z0-9_.-]* with the placeholders {lane}, {container}, {role})",
                 id="container-name"),
    pytest.param(("    python_site: /opt/stub\n", "    python_site: /opt/stub\n    build_args: {A: b}\n"),
                 "recipes/r.yaml:9:5: defaults.image.build_args: unknown key; expected one of: template, base, "
                 "local_base, python_site, registry, vllm, download_kernels", id="build-args-removed"),
    pytest.param(("    python_site: /opt/stub\n", "    python_site: /opt/$HOME\n"),
                 "recipes/r.yaml:8:18: defaults.image.python_site: '/opt/$HOME' must be an absolute path of letters, "
                 "digits and . _ + - (no spaces, quotes, '$', '..' or control characters)", id="python-site-dollar"),
    pytest.param(("    base: lanectl/base-python:bookworm\n", "    base: \"lanectl/base-python:bookworm AS x\"\n"),
                 "recipes/r.yaml:6:11: defaults.image.base: 'lanectl/base-python:bookworm AS x' is not a Docker "
                 "image reference ([registry/]name[:tag][@sha256:<64 hex>])", id="base-with-stage"),
])
def test_out_of_range_secret_and_unusable_values_are_reported(project, write_recipe, change, expected):
    old, new = change
    assert old in GOOD
    write_recipe(GOOD.replace(old, new, 1))
    assert problems(project) == [expected]


def test_secret_looking_kernel_env_is_refused_in_the_kernel_file(project, write_recipe):
    kernel = project / "kernels" / "stub-splitkv.yaml"
    kernel.write_text(kernel.read_text().replace("builder:\n", "env: {MY_API_KEY: abc}\nbuilder:\n", 1))
    write_recipe(GOOD.replace(LANE_B, "  b:\n    kernels: [stub-splitkv]\n"))
    assert problems(project) == [
        "kernels/stub-splitkv.yaml:8:7: env.MY_API_KEY: 'MY_API_KEY' looks like a secret; a kernel's env is baked "
        "into its build stage and the build cache, so a build that needs a credential cannot get it from here"]


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_API_KEY", "DB_PASSWORD", "GITHUB_PAT", "AUTH_HEADER", "SECRET",
                                  "AWS_SECRET_ACCESS_KEY", "DB_PASS", "GOOGLE_CREDENTIALS", "hfToken", "apiKey",
                                  "LANECTL_ALERT_WEBHOOK", "DB_PASSWORD_PROD"])
def test_names_with_a_credential_part_look_like_secrets(name):
    assert looks_like_secret(name)


@pytest.mark.parametrize("name", ["PATH", "PYTHONPATH", "KEYBOARD", "MONKEY", "PASSTHROUGH", "TOKENIZERS_PARALLELISM",
                                  "MAX_TOKENS", "STUB_DECODE_TOKENS_PER_S", "STUB_TOKEN_SEED", "KEY_SIZE",
                                  "VLLM_LOGGING_LEVEL", "AUTHOR"])
def test_names_that_only_contain_a_credential_word_are_plain(name):
    assert not looks_like_secret(name)
