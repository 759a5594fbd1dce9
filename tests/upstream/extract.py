"""Write the few facts of an RL framework's source that timeshare's plug-ins
rely on (hooked names, their signatures, the order the framework calls them
in) to tests/upstream/FRAMEWORK.json, read from a copy of the framework's
source at the version the plug-in was checked against. CI has no network and
cannot install these frameworks (GPU-only dependencies), so the tests read
these files: re-run this at a new version and a renamed or reordered hook
fails the tests.

    python -m tests.upstream.extract slime DIR --pin 'aishukamal/slime feat/phase-callbacks ...'
    python -m tests.upstream.extract openrlhf DIR --pin 'openrlhf 0.11.2 (PyPI wheel)'
    python -m tests.upstream.extract skyrl DIR --pin 'skyrl 0.4.0 (PyPI wheel)'

DIR is the framework's source root: a checkout (`git worktree`, or `git
archive` of a fetched mirror) or an unpacked wheel (`pip download --no-deps
NAME==VERSION`, then unzip; OpenRLHF's package lies under
openrlhf-VERSION.data/purelib).
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def parse(root: Path, path: str) -> ast.Module:
    return ast.parse((root / path).read_text(), filename=path)


def find(tree: ast.AST, kind: type[ast.AST], name: str) -> Any:
    for node in ast.walk(tree):
        if isinstance(node, kind) and getattr(node, "name", None) == name:
            return node
    raise SystemExit(f"no {kind.__name__} {name!r}: the upstream source has changed")


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


def methods(cls: ast.ClassDef) -> dict[str, list[str]]:
    return {
        node.name: parameters(node)
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def calls(tree: ast.AST, attribute: str) -> list[ast.Call]:
    """Calls of ``x.attribute(...)`` or ``attribute(...)``, in source order."""
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == attribute)
            or (isinstance(node.func, ast.Name) and node.func.id == attribute)
        )
    ]
    return sorted(found, key=lambda node: (node.lineno, node.col_offset))


def constant(node: ast.AST) -> Any:
    return ast.literal_eval(node)


def keyword(call: ast.Call, name: str) -> Any:
    return next((constant(k.value) for k in call.keywords if k.arg == name), None)


def slime(root: Path) -> dict[str, Any]:
    callback = parse(root, "slime/utils/phase_callback.py")
    loader = find(callback, ast.FunctionDef, "load_phase_callback")
    facts: dict[str, Any] = {
        "PhaseCallback": methods(find(callback, ast.ClassDef, "PhaseCallback")),
        # load_phase_callback makes the class with no arguments: cls().
        "loader_calls": [len(c.args) + len(c.keywords) for c in calls(loader, "cls")],
    }
    for script in ("train.py", "train_async.py"):
        events = []
        for name in ("on_phase_begin", "on_phase_end", "close"):
            for call in calls(parse(root, script), name):
                args = [constant(a) for a in call.args[:2]]
                events.append((call.lineno, [name.removeprefix("on_phase_"), *args]))
        facts[script] = [event for _, event in sorted(events)]
    return facts


def openrlhf(root: Path) -> dict[str, Any]:
    engine = parse(root, "openrlhf/trainer/ray/vllm_engine.py")
    launcher = parse(root, "openrlhf/trainer/ray/launcher.py")
    trainer = parse(root, "openrlhf/trainer/ppo_trainer.py")
    generator = parse(root, "openrlhf/trainer/ppo_utils/samples_generator.py")
    cli = parse(root, "openrlhf/cli/train_ppo_ray.py")
    ppo_train = find(trainer, ast.FunctionDef, "ppo_train")
    broadcast = find(trainer, ast.FunctionDef, "broadcast_to_vllm")
    return {
        "create_vllm_engines": parameters(find(engine, ast.FunctionDef, "create_vllm_engines")),
        "batch_vllm_engine_call": parameters(
            find(engine, ast.FunctionDef, "batch_vllm_engine_call")
        ),
        "RayActorGroup": methods(find(launcher, ast.ClassDef, "RayActorGroup")),
        # The model groups' calls in ppo_train, in source order (with --ds.enable_sleep
        # first: reload, fit, offload per group).
        "ppo_train": [keyword(c, "method_name") for c in calls(ppo_train, "async_run_method")],
        "broadcast_to_vllm": [
            [constant(c.args[1]), keyword(c, "tags")]
            for c in calls(broadcast, "batch_vllm_engine_call")
        ],
        "samples_generator": [
            constant(c.args[1]) for c in calls(generator, "batch_vllm_engine_call")
        ],
        "cli_options": sorted(
            constant(c.args[0])
            for c in calls(cli, "add_argument")
            if c.args and isinstance(c.args[0], ast.Constant) and "sleep" in str(c.args[0].value)
        ),
        "train_ppo_ray_calls": sorted(
            name
            for name in ("create_vllm_engines", "async_init_model_from_pretrained")
            if calls(cli, name)
        ),
    }


def skyrl(root: Path) -> dict[str, Any]:
    remote = parse(root, "skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py")
    dispatch = parse(root, "skyrl/backends/skyrl_train/workers/worker_dispatch.py")
    trainer = parse(root, "skyrl/train/trainer.py")
    entry = parse(root, "skyrl/train/entrypoints/main_base.py")
    client = methods(find(remote, ast.ClassDef, "RemoteInferenceClient"))
    save = find(dispatch, ast.AsyncFunctionDef, "save_weights_for_sampler")
    isinstance_checks = {}
    for path in sorted((root / "skyrl").rglob("*.py")):
        text = path.read_text()
        count = text.count("isinstance(inference_engine_client, RemoteInferenceClient)")
        if count:
            isinstance_checks[str(path.relative_to(root))] = count
    train = find(trainer, ast.AsyncFunctionDef, "train")
    return {
        "RemoteInferenceClient": {name: client[name] for name in ("sleep", "wake_up")},
        "RemoteInferenceClient_serialization": sorted(
            name for name in ("__getstate__", "__setstate__") if name in client
        ),
        "isinstance_checks": isinstance_checks,
        # The colocated weight sync: wake the weights, broadcast, wake the KV cache.
        "save_weights_for_sampler_wake_ups": [keyword(c, "tags") for c in calls(save, "wake_up")],
        "train_sleeps": len(calls(train, "sleep")),
        "BasePPOExp": sorted(
            name
            for name in methods(find(entry, ast.ClassDef, "BasePPOExp"))
            if name in ("get_inference_client", "_setup_trainer", "run", "__init__")
        ),
        "main_base_functions": sorted(
            node.name
            for node in entry.body
            if isinstance(node, ast.FunctionDef) and node.name in ("main", "skyrl_entrypoint")
        ),
        "override_entrypoint": "trainer.override_entrypoint="
        in (root / "skyrl/train/entrypoints/main_base.py").read_text(),
    }


FRAMEWORKS = {"slime": slime, "openrlhf": openrlhf, "skyrl": skyrl}


def load(framework: str) -> dict[str, Any]:
    facts: dict[str, Any] = json.loads((HERE / f"{framework}.json").read_text())
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.upstream.extract")
    parser.add_argument("framework", choices=sorted(FRAMEWORKS))
    parser.add_argument("root", type=Path, help="the framework's source root")
    parser.add_argument("--pin", required=True, help="what DIR is: repository, version, commits")
    args = parser.parse_args()
    facts = {"pinned": args.pin, **FRAMEWORKS[args.framework](args.root)}
    out = HERE / f"{args.framework}.json"
    out.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
