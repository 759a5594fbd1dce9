"""`timeshare bundle`: timeshare[server,cuda] and everything it needs, as
wheels for one Python and platform, with an offline installer, in one folder
that a host without a network can install from."""

from __future__ import annotations

import importlib.resources
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from timeshare.bundle.errors import BundleError
from timeshare.bundle.manifest import (
    MANIFEST,
    WHEELS,
    Compression,
    Manifest,
    describe_files,
    find_temporal,
    sha256_of,
)
from timeshare.bundle.own_wheel import build_own_wheel, last_error, own_version
from timeshare.bundle.platforms import compatible_platforms, this_python
from timeshare.bundle.repack import MIB, repack_all
from timeshare.self_command import python_module_command

EXTRAS = "server,cuda"
INSTALLER = "install.sh"
# pip's line for each wheel it put in --dest.
SAVED_PREFIXES = ("Saved ", "File was already downloaded ")


@dataclass(frozen=True)
class BundleOptions:
    out: Path
    python_version: str | None = None  # X.Y; None: this interpreter's
    platforms: list[str] = field(default_factory=list)  # empty: this interpreter's
    compression: Compression = "lzma"


def make_bundle(options: BundleOptions, say: Callable[[str], None]) -> Manifest:
    out = options.out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an empty folder: choose a new --out")
    if importlib.util.find_spec("pip") is None:
        raise BundleError(f"{sys.executable} has no pip: `{sys.executable} -m ensurepip`, "
                          "then run again")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built beside --out and renamed into place: a failure leaves no half bundle.
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        manifest = _fill(staging, options, say)
        staging.chmod(0o755)  # mkdtemp's is 0700
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(
        f"wrote {out}: {len(manifest.files)} files, {manifest.total_size / MIB:.1f} MiB; "
        f"install it offline with {out / INSTALLER} (--help)"
    )
    return manifest


def _fill(folder: Path, options: BundleOptions, say: Callable[[str], None]) -> Manifest:
    wheels = folder / WHEELS
    wheels.mkdir()
    with tempfile.TemporaryDirectory(prefix="timeshare-wheel-") as built:
        own = build_own_wheel(Path(built), say)
        download(own, options, wheels, say)
    published = {wheel.name: (wheel.stat().st_size, sha256_of(wheel)) for wheel in
                 wheels.glob("*.whl")}  # fmt: skip
    if options.compression == "lzma":
        repack_all(sorted(wheels.glob("*.whl")), say)
    installer = folder / INSTALLER
    installer.write_bytes((importlib.resources.files("timeshare.bundle") / INSTALLER).read_bytes())
    installer.chmod(0o755)
    version = own_version()
    files = describe_files(folder, published)
    manifest = Manifest(
        timeshare_version=version,
        requirement=f"timeshare[{EXTRAS}]=={version}",
        python_version=options.python_version or this_python(),
        implementation="cp",
        platforms=options.platforms,
        built_on=f"{sysconfig.get_platform()} CPython {sys.version.split()[0]}",
        compression=options.compression,
        temporal=find_temporal(folder),
        files=files,
        total_size=sum(file.size for file in files),
    )
    (folder / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return manifest


def download_command(own: Path, options: BundleOptions, dest: Path) -> list[str]:
    command = [
        *python_module_command("pip"), "download", "--disable-pip-version-check",
        # Wheels only: the host cannot build anything from source.
        "--only-binary=:all:", "--implementation", "cp", "--dest", str(dest),
        f"timeshare[{EXTRAS}] @ {own.as_uri()}",
    ]  # fmt: skip
    if options.python_version:
        command += ["--python-version", options.python_version]
    for tag in options.platforms:
        for compatible in compatible_platforms(tag):
            command += ["--platform", compatible]
    return command


def download(own: Path, options: BundleOptions, dest: Path, say: Callable[[str], None]) -> None:
    target = (
        f"CPython {options.python_version or this_python()} on "
        f"{', '.join(options.platforms) or 'this platform'}"
    )
    say(f"downloading timeshare[{EXTRAS}]'s dependencies for {target} (pip download)")
    output: list[str] = []
    with subprocess.Popen(
        download_command(own, options, dest),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as pip:  # fmt: skip
        assert pip.stdout is not None
        for line in pip.stdout:
            output.append(line)
            if line.startswith(SAVED_PREFIXES):
                say(f"downloaded {Path(line.split()[-1]).name}")
    if pip.returncode != 0:
        raise BundleError(
            f"pip download failed (exit {pip.returncode}): {last_error(''.join(output))}; "
            "if pip found no wheel, check --python-version and --platform (the host's "
            "glibc: `ldd --version`); if it could not connect, check the package index "
            "(`pip config list`) and the network; then run again"
        )
