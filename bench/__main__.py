"""`python -m bench NAME [ARGS...]` runs one benchmark (`python -m bench NAME
--help` for its options); `python -m bench --list` says what each measures,
from the first line of its module's docstring."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).parent
USAGE = "usage: python -m bench NAME [ARGS...] | python -m bench --list"


def names() -> list[str]:
    """Every benchmark: each module at bench/'s top level."""
    return sorted(path.stem for path in HERE.glob("*.py") if not path.stem.startswith("_"))


def summary(name: str) -> str:
    """The first line of the benchmark's docstring, read without importing it
    (a benchmark's imports take seconds: the Temporal SDK, torch)."""
    docstring = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text())) or ""
    return docstring.splitlines()[0] if docstring else "(no docstring)"


def listing() -> str:
    width = max(len(name) for name in names())
    return "\n".join(f"{name:<{width}}  {summary(name)}" for name in names())


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{listing()}")
        return 0 if argv else 2
    if argv[0] == "--list":
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in names():
        print(
            f"python -m bench: no benchmark {name!r}; choose one of: {', '.join(names())}",
            file=sys.stderr,
        )
        return 2
    # The benchmark parses sys.argv itself; its usage line names the command run.
    sys.argv = [f"python -m bench {name}", *rest]
    importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
