"""A Python block's timeshare names, checked without running it: the block
compiles; every name it imports from timeshare, or reaches through a
timeshare module, exists; every call of one takes the arguments the block
passes. Values the block makes from such calls (``client = timeshare.connect()``,
``with job.turn() as turn``) are followed through their return annotations,
so ``client.join(...)`` and ``turn.should_yield`` are checked too. Whatever
the block names that is not timeshare's (a trainer, a model) is the reader's
and left alone."""

from __future__ import annotations

import ast
import importlib
import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any

OWN = "timeshare"
# Return types that stand for what they yield: a context manager's value, an
# iterator's items (a @contextmanager's), an awaitable's result.
UNWRAPPED = (
    "AbstractContextManager",
    "AbstractAsyncContextManager",
    "Iterator",
    "AsyncIterator",
    "Generator",
    "AsyncGenerator",
    "Awaitable",
    "Coroutine",
)


@dataclass(frozen=True)
class Known:
    """What the block's expression is: a module, an object (a class, a
    function, a value), a method of a known type, or an instance of a type."""

    module: types.ModuleType | None = None
    obj: Any = None
    is_obj: bool = False
    # (class, name): a method reached through an instance of the class.
    method: tuple[type, str] | None = None
    instance: Any = None  # a type, possibly generic (AbstractContextManager[Turn])


LAZY = object()  # a name a module makes on first use (its __getattr__): there, not loaded


def module_member(module: types.ModuleType, name: str) -> Any:
    """The module's ``name``, LAZY for one its ``__getattr__`` makes on first
    use (timeshare.integrations.trl.GRPOTrainer imports TRL: not loaded here),
    or None when it has none."""
    if name in vars(module):
        return vars(module)[name]
    lazy = vars(module).get("__getattr__")
    if lazy is not None and f'"{name}"' in inspect.getsource(lazy):
        return LAZY
    return None


@dataclass
class Checker(ast.NodeVisitor):
    names: dict[str, Known] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    # --- bindings -----------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] != OWN:
                continue
            module = self._import(alias.name, node.lineno)
            if module is None:
                continue
            if alias.asname:
                self.names[alias.asname] = Known(module=module)
            else:
                self.names[OWN] = Known(module=importlib.import_module(OWN))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if (node.module or "").split(".")[0] != OWN:
            return
        module = self._import(node.module or "", node.lineno)
        if module is None:
            return
        for alias in node.names:
            member = module_member(module, alias.name)
            if member is LAZY:
                continue
            if member is not None:
                self.names[alias.asname or alias.name] = (
                    Known(module=member) if inspect.ismodule(member) else Known(obj=member,
                                                                                is_obj=True)
                )  # fmt: skip
                continue
            sub = self._import(f"{module.__name__}.{alias.name}", node.lineno, quiet=True)
            if sub is None:
                self.problems.append(f"line {node.lineno}: {module.__name__} has no {alias.name}")
            else:
                self.names[alias.asname or alias.name] = Known(module=sub)

    def _import(self, name: str, line: int, quiet: bool = False) -> types.ModuleType | None:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as missing:
            if not quiet and (missing.name or "").split(".")[0] == OWN:
                self.problems.append(f"line {line}: there is no module {name}")
            return None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        value = self.infer(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name) and value is not None:
                self.names[target.id] = value

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            entered = entered_value(self.infer(item.context_expr))
            if isinstance(item.optional_vars, ast.Name) and entered is not None:
                self.names[item.optional_vars.id] = entered
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    # --- uses -------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        callee = self.infer(node.func)
        if callee is None or callee.module is not None:
            return
        target, skip_self = callable_of(callee)
        if target is None:
            return
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            return
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return
        args = [None] * (len(node.args) + (1 if skip_self else 0))
        try:
            signature.bind(*args, **{k.arg: None for k in node.keywords if k.arg})
        except TypeError as error:
            self.problems.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {error}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        self.infer(node)  # records a missing attribute

    # --- what an expression is ----------------------------------------------------
    def infer(self, node: ast.expr) -> Known | None:
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Await):
            return self.infer(node.value)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return returned_value(self.infer(node.func))
        return None

    def _attribute(self, node: ast.Attribute) -> Known | None:
        base = self.infer(node.value)
        if base is None:
            return None
        if base.module is not None:
            found = module_member(base.module, node.attr)
            if found is LAZY:
                return None
            if found is not None:
                return (
                    Known(module=found)
                    if inspect.ismodule(found)
                    else Known(obj=found, is_obj=True)
                )
            sub = self._import(f"{base.module.__name__}.{node.attr}", node.lineno, quiet=True)
            if sub is None:
                self.problems.append(f"line {node.lineno}: {base.module.__name__} has no "
                                     f"{node.attr}")  # fmt: skip
                return None
            return Known(module=sub)
        owner = base.obj if base.is_obj and inspect.isclass(base.obj) else origin(base.instance)
        if owner is None or not inspect.isclass(owner) or not owner.__module__.startswith(OWN):
            return None
        if not has_member(owner, node.attr):
            self.problems.append(f"line {node.lineno}: {owner.__name__} has no {node.attr}")
            return None
        if base.is_obj:
            return Known(obj=getattr(owner, node.attr), is_obj=True)
        return member_value(owner, node.attr)


def origin(kind: Any) -> Any:
    return typing.get_origin(kind) or kind


def has_member(owner: type, name: str) -> bool:
    if hasattr(owner, name) or name in getattr(owner, "model_fields", {}):
        return True
    try:
        if name in typing.get_type_hints(owner):
            return True
    except Exception:
        pass
    # Set in __init__ (self.name = ...), as plain classes keep their state.
    for klass in owner.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            try:
                if f"self.{name} " in inspect.getsource(init) or f"self.{name}:" in (
                    inspect.getsource(init)
                ):
                    return True
            except (OSError, TypeError):
                continue
    return False


def hints_return(function: Any) -> Any:
    try:
        return typing.get_type_hints(function).get("return")
    except Exception:
        return None


def member_value(owner: type, name: str) -> Known | None:
    static = inspect.getattr_static(owner, name, None)
    if isinstance(static, property):
        returned = hints_return(static.fget)
        return Known(instance=without_none(returned)) if returned is not None else None
    if callable(static) or isinstance(static, staticmethod | classmethod):
        return Known(method=(owner, name))
    try:
        kind = typing.get_type_hints(owner).get(name)
    except Exception:
        kind = None
    return Known(instance=without_none(kind)) if kind is not None else None


def without_none(kind: Any) -> Any:
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        rest = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else None
    return kind


def callable_of(callee: Known) -> tuple[Any, bool]:
    """What a call calls (None: not timeshare's), and whether its first
    parameter (self) is bound by the call's receiver."""
    if callee.is_obj:
        module = getattr(callee.obj, "__module__", "") or ""
        return (callee.obj if callable(callee.obj) and module.startswith(OWN) else None), False
    if callee.method is not None:
        owner, name = callee.method
        static = inspect.getattr_static(owner, name, None)
        return getattr(owner, name), not isinstance(static, staticmethod | classmethod)
    return None, False


def returned_value(callee: Known | None) -> Known | None:
    if callee is None:
        return None
    if callee.is_obj and inspect.isclass(callee.obj):
        return Known(instance=callee.obj)
    target, _ = callable_of(callee)
    if target is None:
        return None
    returned = hints_return(target)
    return Known(instance=without_none(returned)) if returned is not None else None


def entered_value(value: Known | None) -> Known | None:
    """What ``with VALUE as name`` binds."""
    if value is None or value.instance is None:
        return None
    kind = value.instance
    if typing.get_origin(kind) is not None and getattr(origin(kind), "__name__", "") in UNWRAPPED:
        args = typing.get_args(kind)
        return Known(instance=args[0]) if args else None
    if inspect.isclass(kind) and hasattr(kind, "__enter__"):
        returned = hints_return(kind.__enter__)
        if returned is None or isinstance(returned, typing.TypeVar):
            return Known(instance=kind)
        return Known(instance=kind if returned is typing.Self else returned)
    return None


def python_problems(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        return [f"does not compile: {error.msg} (line {error.lineno})"]
    checker = Checker()
    checker.visit(tree)
    return list(dict.fromkeys(checker.problems))
