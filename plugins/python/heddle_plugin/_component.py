"""The glue between a plugin class and the bindings componentize-py generates for the
``detector`` world. Imported only inside a component build (``wit_world`` exists there)."""

from __future__ import annotations

import sys
import traceback
from typing import Any

import wit_world
from componentize_py_types import Err
from wit_world.exports import plugin as wit

from . import Detection, Facts, PluginError


def _to_wit(d: Detection) -> "wit.Detection":
    return wit.Detection(
        traits=[wit.DetectedTrait(key=k, value=v) for k, v in d.traits],
        env=[wit.EnvRecommendation(name=e.name, value=e.value, reason=e.reason) for e in d.env],
        affinity=[
            wit.GpuAffinity(gpu=a.gpu, cpus=a.cpus, numa=a.numa, nic=a.nic, netdev=a.netdev)
            for a in d.affinity
        ],
        warnings=list(d.warnings),
        expectations=[
            wit.Expectation(test=e.test, metric=e.metric, min_size_bytes=e.min_size_bytes,
                            value=e.value, source=e.source)
            for e in d.expectations
        ],
    )


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(e).__name__}: {e}{at}"


def adapt(plugin: Any) -> type:
    class Plugin(wit_world.exports.Plugin):
        def info(self) -> "wit.PluginInfo":
            i = plugin.info()
            return wit.PluginInfo(name=i.name, version=i.version, description=i.description,
                                  reads=list(i.reads))

        def detect(self, facts_json: str) -> "wit.Detection":
            try:
                detection = plugin.detect(Facts.parse(facts_json))
            except PluginError as e:
                raise Err(wit.PluginError(code=e.code, message=e.message))
            except Exception as e:
                # A bug in the plugin: the whole traceback to stderr (kept in the report), and
                # the exception and where it was raised as the error operators see.
                traceback.print_exc(file=sys.stderr)
                raise Err(wit.PluginError(code="exception", message=_where(e)))
            if not isinstance(detection, Detection):
                raise TypeError(f"detect() returned {type(detection).__name__}, not a Detection")
            return _to_wit(detection)

    Plugin.__name__ = Plugin.__qualname__ = "Plugin"
    return Plugin
