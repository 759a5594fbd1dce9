"""How a backend is chosen by name: from the entry-point group
``timeshare.backends``, or several stacked with "+". Apart from base.py, so
that the stack (stacked.py), itself a backend, is built here without base.py
importing what imports it."""

from __future__ import annotations

from importlib.metadata import entry_points

from timeshare.activities.backends.base import Backend, BackendConfig, BackendNotFound
from timeshare.activities.backends.stacked import StackedBackend
from timeshare.names import BACKEND_ENTRY_POINT_GROUP


def available_backends() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=BACKEND_ENTRY_POINT_GROUP))


def load_backend(name: str, config: BackendConfig) -> Backend:
    """One backend, or several stacked with "+" ("freeze+cuda": freeze, then checkpoint)."""
    if "+" in name:
        return StackedBackend([load_backend(part, config) for part in name.split("+")])
    matches = [ep for ep in entry_points(group=BACKEND_ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        known = ", ".join(available_backends()) or "none installed"
        raise BackendNotFound(f"unknown backend {name!r} (available: {known})")
    backend_class = matches[0].load()
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise BackendNotFound(f"entry point {name!r} does not name a Backend class")
    return backend_class.create(config)
