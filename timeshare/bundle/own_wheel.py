"""The wheel of timeshare itself, from the code this process runs: built with
setuptools from a source tree, or packed again from an installed copy (a
server install has no source tree, and timeshare is not on a package index)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import shutil
import subprocess
import tempfile
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import timeshare
from timeshare.bundle.errors import BundleError
from timeshare.self_command import python_module_command

DISTRIBUTION = "timeshare"
# What a source tree's build reads besides the package (pyproject's readme and,
# where present, the licence files setuptools adds by default).
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "LICENSE.txt", "NOTICE")
# Written by the installer, not part of the wheel.
INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def package_root() -> Path:
    return Path(timeshare.__file__).resolve().parent


def source_tree() -> Path | None:
    """The checkout this process's timeshare comes from, if it comes from one."""
    root = package_root().parent
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    return root if project.get("name") == DISTRIBUTION else None


def own_version() -> str:
    tree = source_tree()
    if tree is not None:
        return str(tomllib.loads((tree / "pyproject.toml").read_text())["project"]["version"])
    return importlib.metadata.version(DISTRIBUTION)


def mapped_folders(tree: Path) -> list[str]:
    """The top-level folders pyproject.toml maps into the package
    (workflows/, activities/, workers/ as timeshare.workflows, ...)."""
    setuptools = tomllib.loads((tree / "pyproject.toml").read_text()).get("tool", {})
    mapping: dict[str, str] = setuptools.get("setuptools", {}).get("package-dir", {})
    return sorted({folder.split("/")[0] for folder in mapping.values() if folder})


def build_own_wheel(out: Path, say: Callable[[str], None]) -> Path:
    """timeshare-VERSION-py3-none-any.whl in ``out``, of the code this process runs."""
    tree = source_tree()
    if tree is not None:
        say(f"building the timeshare {own_version()} wheel from {tree}")
        return _build_from_source(tree, out)
    say(f"packing the installed timeshare {own_version()} into a wheel")
    return pack_installed(out)


def _build_from_source(tree: Path, out: Path) -> Path:
    # A copy, so that the build's build/ and egg-info never land in the checkout.
    with tempfile.TemporaryDirectory(prefix="timeshare-source-") as scratch:
        copy = Path(scratch) / "timeshare"
        copy.mkdir()
        for name in BUILD_INPUTS:
            if (tree / name).is_file():
                shutil.copy2(tree / name, copy / name)
        for folder in ["timeshare", *mapped_folders(tree)]:
            shutil.copytree(
                tree / folder,
                copy / folder,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        built = subprocess.run(
            [*python_module_command("pip"), "wheel", "--no-deps", "--wheel-dir", str(out),
             str(copy)],
            capture_output=True, text=True,
        )  # fmt: skip
    if built.returncode != 0:
        raise BundleError(
            f"building the timeshare wheel failed (pip exit {built.returncode}): "
            f"{last_error(built.stdout + built.stderr)}; pip needs setuptools from the "
            "package index to build it: check `pip config list` and the network"
        )
    wheels = sorted(out.glob(f"{DISTRIBUTION}-*.whl"))
    if not wheels:
        raise BundleError(f"pip built no timeshare wheel in {out}")
    return wheels[-1]


def pack_installed(out: Path) -> Path:
    """The installed distribution's files (from its RECORD) as a wheel again."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise BundleError(
            f"timeshare at {package_root()} is neither a source checkout nor an installed "
            "distribution: run `timeshare bundle` from a checkout or a pip-installed timeshare"
        ) from None
    info_dir = f"{DISTRIBUTION}-{dist.version}.dist-info"
    kept = [
        path
        for path in dist.files or []
        if path.parts[0] in (DISTRIBUTION, info_dir)
        and "__pycache__" not in path.parts
        and path.suffix != ".pyc"
        and not (path.parts[0] == info_dir and path.name in INSTALLER_FILES)
    ]
    if Path(str(dist.locate_file(f"{DISTRIBUTION}/__init__.py"))).resolve() != (
        package_root() / "__init__.py"
    ) or not any(path.parts[0] == DISTRIBUTION for path in kept):
        raise BundleError(
            f"the installed timeshare distribution does not hold the code at {package_root()} "
            "(an editable install?): run `timeshare bundle` from the source checkout"
        )
    wheel = out / f"{DISTRIBUTION}-{dist.version}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        for path in sorted(kept, key=str):
            data = Path(str(dist.locate_file(path))).read_bytes()
            packed.writestr(path.as_posix(), data)
            records.append(f"{path.as_posix()},sha256={record_digest(data)},{len(data)}")
        records.append(f"{info_dir}/RECORD,,")
        packed.writestr(f"{info_dir}/RECORD", "\n".join(records) + "\n")
    return wheel


def record_digest(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def last_error(output: str) -> str:
    """pip's last ERROR line, or its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]
