"""A shell block's commands, and what can be checked of them without running
them: each `timeshare` subcommand and flag against the CLI's own parser; each
`python -m MODULE` of this repository (its flags against the parser its main
builds); each `make` target; each `pip install` of a local folder or of an
extra."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from timeshare import cli

REPO = Path(__file__).resolve().parents[2]
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
REDIRECTIONS = {">", ">>", "<", "2>", "&>", "2>&1", ">&"}
PREFIXES = {"sudo", "env", "exec", "nohup", "time", "command"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Modules of this repository, whose flags can be read; others are the reader's.
OWN_MODULES = ("timeshare", "examples", "bench", "tests")
PLACEHOLDER = "..."


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block, each as its words, without
    leading variable assignments, prompts and wrappers (sudo, env, exec)."""
    joined = re.sub(r"\\\n", " ", text)
    found: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        words = list(lexer)
        index = 0
        while index < len(words):
            word = words[index]
            if word in OPERATORS:
                found.append(current)
                current = []
            elif word in REDIRECTIONS or word.endswith(">"):
                index += 1  # and its target
            else:
                current.append(word)
            index += 1
        found.append(current)
    return [_bare(command) for command in found if _bare(command)]


def _bare(words: list[str]) -> list[str]:
    index = 0
    while index < len(words) and (ASSIGNMENT.match(words[index]) or words[index] in PREFIXES):
        index += 1
    return words[index:]


def problems_of(command: list[str]) -> list[str]:
    program, args = Path(command[0]).name, command[1:]
    if program == "timeshare":
        return timeshare_problems(args)
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and "-m" in args:
        module, rest = _module_and_args(args)
        if module == "timeshare":
            return timeshare_problems(rest)
        if module == "pip":
            return pip_problems(rest)
        return module_problems(module, rest)
    if re.fullmatch(r"pip3?", program):
        return pip_problems(args)
    if program == "make":
        return make_problems(args)
    return []


def _module_and_args(args: list[str]) -> tuple[str, list[str]]:
    at = args.index("-m")
    return args[at + 1], args[at + 2 :]


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def flag_problems(parser: argparse.ArgumentParser, args: list[str], name: str) -> list[str]:
    """Each --flag of ``args`` is one ``parser`` (or the subcommand it names) knows."""
    problems: list[str] = []
    for index, word in enumerate(args):
        if word == "--":
            break
        below = _subparsers(parser)
        if word in below:
            return problems + flag_problems(below[word], args[index + 1 :], f"{name} {word}")
        if word.startswith("-") and word not in ("-", PLACEHOLDER) and not _number(word):
            flag = word.split("=", 1)[0]
            if flag not in flags_of(parser):
                problems.append(f"`{name}` has no flag {flag}")
    return problems


def _number(word: str) -> bool:
    return re.fullmatch(r"-\d+(\.\d+)?", word) is not None


def timeshare_problems(args: list[str]) -> list[str]:
    parser = cli.build_parser()
    positional = [word for word in args if not word.startswith("-")]
    named = positional[0].split("|") if positional else []
    unknown = [name for name in named if name not in _subparsers(parser) and name != PLACEHOLDER]
    if unknown:
        return [f"`timeshare` has no command {unknown[0]!r}"]
    problems = flag_problems(parser, args, "timeshare")
    if not problems and named == ["gateway"]:
        problems = gateway_problems(parser, args)
    return problems


def gateway_problems(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """What the gateway itself refuses at start, before it serves: a listen
    address beyond loopback without TLS and callers checked, say."""
    from timeshare.cli.server_settings import gateway_security
    from timeshare.workers.common.service import StartupError

    try:
        settings = gateway_security(parser.parse_args(args))
        settings.check()
    except (StartupError, ValueError) as refused:
        return [f"`timeshare gateway` refuses it at start: {refused}"]
    except SystemExit:
        return []  # placeholders where values go; the flags were checked above
    return []


def pip_problems(args: list[str]) -> list[str]:
    if not args or args[0] != "install":
        return []
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    known = set(extras.get("optional-dependencies", {}))
    problems = []
    for word in args[1:]:
        if word.startswith("-"):
            continue
        requirement = re.match(r"^(?P<name>[^\[]+)(?:\[(?P<extras>[^\]]*)\])?", word)
        if requirement is None:
            continue
        name, wanted = requirement["name"], requirement["extras"] or ""
        if name in ("timeshare", "."):
            problems += [f"timeshare has no extra {e!r}" for e in wanted.split(",") if e and
                         e not in known]  # fmt: skip
        local = name.startswith((".", "/")) and not name.endswith((".whl", ".tar.gz"))
        if local and not (REPO / name / "pyproject.toml").is_file():
            problems.append(f"`pip install {word}` from the clone's root: {name} holds "
                            "no pyproject.toml")  # fmt: skip
    return problems


def make_problems(args: list[str]) -> list[str]:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):", makefile, flags=re.MULTILINE))
    return [
        f"the Makefile has no target {word!r}"
        for word in args
        if not word.startswith("-") and "=" not in word and word not in targets
    ]


class ParserCaptured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("captured")
        self.parser = parser


@contextlib.contextmanager
def capturing_parsers() -> Iterator[None]:
    """While inside, the first parse_args of any argparse parser hands the
    parser out instead of parsing."""

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise ParserCaptured(self)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", capture),
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture),
    ):
        yield


def parser_of(module: str) -> argparse.ArgumentParser | None:
    """The parser ``python -m MODULE`` builds, from its main(), unrun."""
    loaded = importlib.import_module(module)
    main = getattr(loaded, "main", None)
    if main is None:
        return None
    saved = sys.argv
    sys.argv = [module]
    try:
        with capturing_parsers():
            if inspect.signature(main).parameters:
                main([])
            else:
                main()
    except ParserCaptured as captured:
        return captured.parser
    finally:
        sys.argv = saved
    return None


def module_problems(module: str, args: list[str]) -> list[str]:
    if not module.startswith(OWN_MODULES) or any(part.isupper() for part in module.split(".")):
        return []  # the reader's module, or a placeholder (examples.NAME)
    if module == "bench":
        return bench_problems(args)
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return [f"there is no module {module}"]
    target = f"{module}.__main__" if _is_package(module) else module
    parser = parser_of(target)
    return flag_problems(parser, args, f"python -m {module}") if parser else []


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def bench_problems(args: list[str]) -> list[str]:
    from bench.__main__ import names

    if not args or args[0].startswith("-") or args[0].isupper():
        return []  # the listing, or a placeholder (NAME)
    name = args[0]
    if name not in names():
        return [f"`python -m bench` has no benchmark {name!r}"]
    parser = parser_of(f"bench.{name}")
    return flag_problems(parser, args[1:], f"python -m bench {name}") if parser else []
