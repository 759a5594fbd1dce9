"""Which wheels fit the host a bundle is for: its Python as X.Y, and the
platform tags pip should accept for it."""

from __future__ import annotations

import re
import sys

# Python's oldest minor version that timeshare runs on (pyproject's requires-python).
OLDEST_MINOR = 11
# The legacy manylinux names and the glibc each stands for (PEP 600).
LEGACY_MANYLINUX = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
OLDEST_GLIBC_MINOR = 5
_TAG = re.compile(r"[a-z0-9]+(_[a-z0-9.]+)*")


def parse_python_version(text: str) -> str:
    """'3.12' stays '3.12'; anything that is not 3.Y with Y >= 11 is refused."""
    found = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    if not found:
        raise ValueError(f"{text!r} is not X.Y (3.12, say)")
    major, minor = int(found[1]), int(found[2])
    if major != 3 or minor < OLDEST_MINOR:
        raise ValueError(f"timeshare needs Python >= 3.{OLDEST_MINOR}, not {major}.{minor}")
    return f"{major}.{minor}"


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def parse_platform(text: str) -> str:
    tag = text.strip()
    if not _TAG.fullmatch(tag):
        raise ValueError(
            f"{text!r} is not a wheel platform tag (manylinux_2_28_x86_64, "
            "manylinux2014_x86_64, musllinux_1_2_aarch64, linux_x86_64, say)"
        )
    return tag


def compatible_platforms(tag: str) -> list[str]:
    """Every tag a host of this tag installs, newest first.

    pip's --platform takes only the tags it is given (it widens manylinux2014 to
    the two older legacy names, nothing more), while a host whose glibc is 2.28
    installs any manylinux_2_Y wheel with Y <= 28. Given only
    manylinux_2_28_x86_64, pip finds no grpcio (its wheels say manylinux_2_17);
    given only manylinux2014_x86_64, it settles for cuda-bindings 12.9 (its 13.x
    wheels say manylinux_2_24 and later).
    """
    legacy = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(.+)", tag)
    modern = re.fullmatch(r"manylinux_2_(\d+)_(.+)", tag)
    musl = re.fullmatch(r"musllinux_1_(\d+)_(.+)", tag)
    if legacy:
        glibc, arch = LEGACY_MANYLINUX[legacy[1]], legacy[2]
    elif modern:
        glibc, arch = int(modern[1]), modern[2]
    elif musl:
        newest, arch = int(musl[1]), musl[2]
        return [f"musllinux_1_{minor}_{arch}" for minor in range(newest, -1, -1)]
    else:
        return [tag]
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, OLDEST_GLIBC_MINOR - 1, -1)]
    older = sorted(LEGACY_MANYLINUX.items(), key=lambda item: -item[1])
    return tags + [f"{name}_{arch}" for name, minor in older if minor <= glibc]
