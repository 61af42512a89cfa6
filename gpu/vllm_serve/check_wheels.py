"""Every requirement among the carried wheels is met by the carried version (pip download --no-deps checks
none): a wheel that needs a newer sibling than vLLM pins fails at import on the GPU machine, minutes in.
    python3 gpu/vllm_serve/check_wheels.py DIR_OF_WHEELS
"""

from __future__ import annotations

import pathlib
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
       "platform_system": "Linux", "sys_platform": "linux", "implementation_name": "cpython", "os_name": "posix",
       "extra": ""}


def metadata(wheel: pathlib.Path) -> tuple[str, Version, list[Requirement]]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(name).decode().splitlines()
    get = lambda key: next(line.split(": ", 1)[1] for line in lines if line.startswith(key + ": "))  # noqa: E731
    reqs = [Requirement(line.split(": ", 1)[1]) for line in lines if line.startswith("Requires-Dist: ")]
    return canonicalize_name(get("Name")), Version(get("Version")), reqs


def main(folder: pathlib.Path) -> int:
    wheels = {}
    for wheel in sorted(folder.glob("*.whl")):
        name, version, reqs = metadata(wheel)
        wheels[name] = (version, reqs)
    bad = 0
    for name, (_, reqs) in wheels.items():
        for req in reqs:
            if req.marker is not None and not req.marker.evaluate(ENV):
                continue
            carried = wheels.get(canonicalize_name(req.name))
            if carried is not None and not req.specifier.contains(carried[0], prereleases=True):
                print(f"{name} needs {req}, carried {carried[0]}")
                bad += 1
    print(f"{len(wheels)} wheels, {bad} unmet requirements among them")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
