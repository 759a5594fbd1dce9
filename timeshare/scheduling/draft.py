"""A working copy of a group's state, for a handler to change and the core
to keep only once the handler has returned (GroupCore.handle; NodeCore's
record too, through draft_model).

Copied by what each field's type says, once worked out per model: a value
no handler can change in place (a number, a string) is shared, a container
or record is copied. Cheaper than pydantic's dump and validation, which
build every value anew, and far cheaper than a deep copy."""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel

from timeshare.scheduling.state import GroupState

Model = TypeVar("Model", bound=BaseModel)
Copier = Callable[[Any], Any]

_set = object.__setattr__
_IMMUTABLE = (str, int, float, bool, type(None))
# The bounded histories are only appended to, and their last turn closed: the
# copy holds new lists of the same records, and a copy of the last turn. The
# policy is only ever replaced whole.
_HISTORIES = ("recent_turns", "recent_switches")
_SHARED = {"policy"}


def draft(state: GroupState) -> GroupState:
    """A copy of ``state`` that can be changed without changing it."""
    copied = _copy_model(state, _group_fields())
    turns = copied.recent_turns
    if turns:
        turns[-1] = turns[-1].model_copy()
    return copied


def draft_model(model: Model) -> Model:
    """A copy of any record of plain fields (no extra fields or private
    attributes) that can be changed without changing it."""
    return _copy_model(model, _fields_of(type(model)))


@cache
def _group_fields() -> tuple[tuple[str, Copier], ...]:
    return tuple(
        (name, list if name in _HISTORIES else copier)
        for name, copier in _fields_of(GroupState)
        if name not in _SHARED
    )


@cache
def _fields_of(model: type[BaseModel]) -> tuple[tuple[str, Copier], ...]:
    """(field, how to copy its value) for every field a handler could change in place."""
    if model.__private_attributes__ or model.model_config.get("extra") == "allow":
        raise TypeError(f"{model.__name__}: a draft copies no extra fields or private attributes")
    fields = ((name, _copier(field.annotation)) for name, field in model.model_fields.items())
    return tuple((name, copier) for name, copier in fields if copier is not None)


def _copy_model(model: Model, fields: tuple[tuple[str, Copier], ...]) -> Model:
    """As pydantic's shallow copy (BaseModel.__copy__) of a model with no
    extra fields and no private attributes, then its fields copied."""
    values = model.__dict__.copy()
    for name, copy_value in fields:
        values[name] = copy_value(values[name])
    copied = model.__class__.__new__(model.__class__)
    _set(copied, "__dict__", values)
    _set(copied, "__pydantic_extra__", None)
    _set(copied, "__pydantic_fields_set__", set(model.__pydantic_fields_set__))
    _set(copied, "__pydantic_private__", None)
    return copied


def _copier(kind: Any) -> Copier | None:
    """How to copy a value of type ``kind``; None where it cannot change in place."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind in _IMMUTABLE or origin is Literal:
        return None
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        fields = _fields_of(kind)
        return lambda value: _copy_model(value, fields)
    if origin in (Union, types.UnionType):
        inner = [_copier(arg) for arg in args if arg is not type(None)]
        if len(inner) == 1:
            return None if inner[0] is None else _unless_none(inner[0])
    elif origin is tuple:
        immutable = all(_copier(arg) is None for arg in args if arg is not Ellipsis)
        return None if immutable else copy.deepcopy
    elif origin is list and args:
        item = _copier(args[0])
        return list if item is None else _each_item(item)
    elif origin is dict and len(args) == 2:
        item = _copier(args[1])
        return dict if item is None else _each_value(item)
    return copy.deepcopy  # a type not worked out here: copied whole, to be safe


def _unless_none(copier: Copier) -> Copier:
    return lambda value: None if value is None else copier(value)


def _each_item(copier: Copier) -> Copier:
    return lambda value: [copier(each) for each in value]


def _each_value(copier: Copier) -> Copier:
    return lambda value: {key: copier(each) for key, each in value.items()}
