"""The layout is the architecture: imports point one way, CLI → commands → domain → adapters → base.

Every `lanectl` import in every module (at top level or inside a function) is read with `ast`, so a lazy
import that points the wrong way fails here too. A layer may import itself and any layer below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lanectl"

# Top to bottom. Each entry is one layer; a module belongs to the first layer whose package holds it.
LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("commands",),
    ("fleet",),
    ("watchdog",),
    ("bench",),
    ("lanes",),
    ("health",),
    ("pin",),
    ("image",),
    ("recipe",),
    ("state",),
    ("host",),
    ("dockerapi",),
    ("errors", "project", "output", "records", "environment"),  # the base every layer may use
]
# The scripts copied into images run there with the standard library only.
STDLIB_ONLY = ("image.in_image",)


def layer_of(module: str) -> int:
    parts = module.split(".")
    assert parts[0] == "lanectl", module
    top = parts[1] if len(parts) > 1 else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"lanectl.{top} is in no layer: add it to LAYERS in {__file__}")


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def lanectl_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("lanectl"):
            if node.module == "lanectl":
                found += [(node.lineno, f"lanectl.{alias.name}") for alias in node.names if alias.name != "__version__"]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("lanectl.")]
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.stem not in {"__init__", "__main__"})


def test_every_import_points_down_the_layers():
    wrong = []
    for path in modules():
        here = module_name(path)
        for line, target in lanectl_imports(path):
            if layer_of(target) < layer_of(here):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {target} (a layer above it)")
    assert not wrong, "\n".join(wrong)


def test_scripts_copied_into_images_import_nothing_of_lanectl():
    for path in modules():
        if module_name(path).removeprefix("lanectl.").startswith(STDLIB_ONLY):
            assert not lanectl_imports(path), f"{path} runs inside an image without lanectl"


def test_no_module_is_left_flat_beside_the_packages():
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(flat) <= {"__init__", "__main__", "errors", "output", "project", "records", "environment"}, flat


def test_the_architecture_page_names_every_package():
    page = (PACKAGE.parent / "docs" / "design" / "architecture.md").read_text()
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    missing = [name for name in packages if f"`{name}/`" not in page]
    assert not missing, f"docs/design/architecture.md does not say where {missing} live"
