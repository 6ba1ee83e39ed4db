"""Logging through the host: inside a component, messages go to ``heddle:plugin/log`` (kept
up to a per-call cap and forwarded to the host's logs after the call); natively, to Python's
``logging`` under the name ``heddle_plugin`` and to :data:`records`, for tests."""

from __future__ import annotations

import logging
from typing import List, Tuple

#: Messages logged natively, as ``(level, message)``.
records: List[Tuple[str, str]] = []

try:
    from wit_world.imports import log as _wit
except ModuleNotFoundError as e:
    if e.name not in ("wit_world", "wit_world.imports"):
        raise
    _wit = None

_native = logging.getLogger("heddle_plugin")


def _emit(level: str, message: str) -> None:
    message = str(message)
    if _wit is not None:
        _wit.log(getattr(_wit.Level, level.upper()), message)
        return
    records.append((level, message))
    _native.log(getattr(logging, {"trace": "DEBUG"}.get(level, level.upper())), message)


def trace(message: str) -> None:
    _emit("trace", message)


def debug(message: str) -> None:
    _emit("debug", message)


def info(message: str) -> None:
    _emit("info", message)


def warn(message: str) -> None:
    _emit("warn", message)


def error(message: str) -> None:
    _emit("error", message)
