"""Heddle detector plugins in Python.

A plugin is a class with two static methods, ``info()`` and ``detect(facts)``, exported with
``Plugin = heddle_plugin.export(MyPlugin)``. componentize-py builds it into a WebAssembly
component of the ``heddle:plugin@0.2.0`` ``detector`` world (plugins/wit/v0.2); natively,
under plain ``python3``, the same class runs through :func:`run`, so its tests need neither
WebAssembly nor a Heddle checkout beyond this package. See docs/plugins.md.

The component runs in Heddle's sandbox: no files, no network, no environment, no clock waits
past the call's deadline. ``open()``, ``socket`` and ``os.environ`` exist but find nothing or
fail with an error; everything a plugin may know arrives in ``facts``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple, TypeVar, Union

from . import log

__all__ = [
    "Affinity",
    "Detection",
    "EnvRecommendation",
    "Expectation",
    "Facts",
    "Info",
    "PluginError",
    "export",
    "log",
    "run",
]

T = TypeVar("T")


class PluginError(Exception):
    """The node is of the plugin's kind but it cannot make sense of it. Reported to the host
    as the contract's ``plugin-error`` (``code``, ``message``). A node the plugin does not
    recognise is not an error: return an empty :class:`Detection`."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def bad_facts(cls, message: str) -> "PluginError":
        return cls("bad-facts", message)


@dataclass(frozen=True)
class Info:
    """Who the plugin is and which parts of the facts it reads (JSON pointers such as
    ``/host/dmi`` or ``/network/interfaces/*/name``). The host passes only those parts;
    empty means the whole document."""

    name: str
    version: str
    description: str
    reads: Sequence[str] = ()


@dataclass
class EnvRecommendation:
    name: str
    value: str
    reason: str


@dataclass
class Affinity:
    gpu: int
    cpus: str = ""
    numa: Optional[int] = None
    nic: Optional[str] = None
    netdev: Optional[str] = None


@dataclass
class Expectation:
    test: str
    metric: str
    value: float
    source: str
    min_size_bytes: int = 0


@dataclass
class Detection:
    """What a plugin says about a node. Build it with the helpers; an empty one means "does
    not apply to this node"."""

    traits: list = field(default_factory=list)  # [(key, value)]
    env: list = field(default_factory=list)  # [EnvRecommendation]
    affinity: list = field(default_factory=list)  # [Affinity]
    warnings: list = field(default_factory=list)  # [str]
    expectations: list = field(default_factory=list)  # [Expectation]

    def add_trait(self, key: str, value: str) -> "Detection":
        self.traits.append((str(key), str(value)))
        return self

    def recommend(self, name: str, value: str, reason: str) -> "Detection":
        """An environment variable for jobs on this node, with a one-sentence reason an
        operator can check. Names must be identifiers; the host refuses others."""
        self.env.append(EnvRecommendation(str(name), str(value), str(reason)))
        return self

    def warn(self, message: str) -> "Detection":
        self.warnings.append(str(message))
        return self

    def add_affinity(self, gpu: int, cpus: str = "", numa: Optional[int] = None,
                     nic: Optional[str] = None, netdev: Optional[str] = None) -> "Detection":
        self.affinity.append(Affinity(int(gpu), str(cpus), numa, nic, netdev))
        return self

    def expect(self, test: str, metric: str, value: float, source: str,
               min_size_bytes: int = 0) -> "Detection":
        """Results of ``test`` below ``value`` (in ``metric``'s unit) are judged FAIL."""
        self.expectations.append(Expectation(test, metric, float(value), source, int(min_size_bytes)))
        return self

    def trait_value(self, key: str) -> Optional[str]:
        return next((v for k, v in self.traits if k == key), None)

    def env_value(self, name: str) -> Optional[str]:
        return next((e.value for e in self.env if e.name == name), None)

    def is_empty(self) -> bool:
        return not (self.traits or self.env or self.affinity or self.warnings or self.expectations)


_MISSING = object()


class Facts:
    """A node's facts (the JSON of ``heddle-agent facts``, documented in docs/facts.md), looked
    up by JSON pointer (RFC 6901). Typed getters return ``None`` when the value is absent or
    null and raise :class:`PluginError` (``bad-facts``) when it has another type, so a plugin
    never mistakes a list for a string."""

    def __init__(self, document: Any):
        if not isinstance(document, dict):
            raise PluginError.bad_facts("facts are not a JSON object")
        self._doc = document

    @classmethod
    def parse(cls, text: str) -> "Facts":
        try:
            return cls(json.loads(text))
        except ValueError as e:
            raise PluginError.bad_facts(f"facts are not valid JSON: {e}") from None

    @property
    def root(self) -> dict:
        return self._doc

    def get(self, pointer: str) -> Any:
        """The value at ``pointer`` (``""`` is the whole document), or ``None``."""
        value = _lookup(self._doc, pointer)
        return None if value is _MISSING else value

    def _typed(self, pointer: str, kinds: Union[type, Tuple[type, ...]], what: str) -> Any:
        value = self.get(pointer)
        # bool is an int in Python; JSON keeps them apart, so do we.
        if value is None:
            return None
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            raise PluginError.bad_facts(f"{pointer} is a boolean, not {what}")
        if not isinstance(value, kinds):
            raise PluginError.bad_facts(f"{pointer} is {_kind(value)}, not {what}")
        return value

    def str_at(self, pointer: str) -> Optional[str]:
        return self._typed(pointer, str, "a string")

    def int_at(self, pointer: str) -> Optional[int]:
        return self._typed(pointer, int, "an integer")

    def float_at(self, pointer: str) -> Optional[float]:
        value = self._typed(pointer, (int, float), "a number")
        return None if value is None else float(value)

    def bool_at(self, pointer: str) -> Optional[bool]:
        return self._typed(pointer, bool, "a boolean")

    def list_at(self, pointer: str) -> list:
        """The array at ``pointer``; empty when absent."""
        return self._typed(pointer, list, "an array") or []

    def object_at(self, pointer: str) -> dict:
        """The object at ``pointer``; empty when absent."""
        return self._typed(pointer, dict, "an object") or {}

    def entries(self, pointer: str) -> Iterator[Tuple[Union[int, str], Any]]:
        """``(index, value)`` of an array or ``(key, value)`` of an object, so ``/rdma/devices``
        reads the same whether the agent sent a list or a map; nothing when absent."""
        value = self.get(pointer)
        if isinstance(value, list):
            return iter(enumerate(value))
        if isinstance(value, dict):
            return iter(value.items())
        return iter(())


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _lookup(doc: Any, pointer: str) -> Any:
    if pointer == "":
        return doc
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointers start with '/': {pointer!r}")
    value = doc
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(token, _MISSING)
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def run(plugin: Any, facts_json: Union[str, dict]) -> Detection:
    """Runs ``plugin.detect`` natively on a facts document (text or an already parsed dict),
    the way the component does minus WebAssembly: for the plugin's own tests. The host also
    cuts the facts down to ``info().reads`` before the component sees them; check a plugin's
    ``reads`` with ``heddle-agent detect --plugin``."""
    facts = Facts.parse(facts_json) if isinstance(facts_json, str) else Facts(facts_json)
    detection = plugin.detect(facts)
    if not isinstance(detection, Detection):
        raise TypeError(f"detect() returned {type(detection).__name__}, not a Detection")
    return detection


def export(plugin: T) -> Union[T, Callable[[], Any]]:
    """The class componentize-py exports: write ``Plugin = export(MyPlugin)`` in the app
    module. Inside a component it adapts ``MyPlugin`` to the generated ``wit_world``
    bindings; natively (no ``wit_world`` module) it returns ``MyPlugin`` unchanged."""
    try:
        import wit_world  # noqa: F401  (generated by componentize-py; only inside a build)
    except ModuleNotFoundError as e:
        if e.name != "wit_world":
            raise
        return plugin
    from ._component import adapt

    return adapt(plugin)
