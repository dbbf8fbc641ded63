"""The one reader of a checkpoint's ``config.json``.

Usage::

    config = CheckpointConfig.read("/models/Qwen3.5-27B-w8a8")   # raises CheckpointFormatError
    config.architecture            # "Qwen3_5ForConditionalGeneration"
    config.value("num_hidden_layers")   # top level, else text_config
    config.dtype                   # "bfloat16" | "float16" | "float32" | None
    config.namespace()             # attribute access, for sglang helpers that take an hf_config

Why one reader: the name rules, the doctor, verify and the Ray check need the same few fields,
which multimodal checkpoints keep under ``text_config``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import orjson

from ..errors import CheckpointFormatError

CONFIG_NAME = "config.json"
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class CheckpointConfig:
    """A parsed ``config.json``; ``raw`` is the whole JSON object."""

    path: str
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: str) -> CheckpointConfig:
        path = os.path.join(folder, CONFIG_NAME)
        if not os.path.isfile(path):
            raise CheckpointFormatError(
                file=path,
                problem="is missing: sglang cannot build any model from this folder",
                hint="pass the checkpoint folder that holds config.json",
            )
        raw = load_json(
            path, "a model config", "restore the config.json the checkpoint shipped with"
        )
        if not isinstance(raw, dict):
            raise CheckpointFormatError(
                file=path,
                problem=f"holds a JSON {type(raw).__name__}, not an object",
                hint="restore the config.json the checkpoint shipped with",
            )
        return cls(path, raw)

    @property
    def text(self) -> dict[str, Any]:
        text = self.raw.get("text_config")
        return text if isinstance(text, dict) else {}

    @property
    def architecture(self) -> str | None:
        archs = self.raw.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return archs[0]
        return None

    def value(self, key: str) -> Any:
        """``key`` at the top level, else in ``text_config`` (where VL checkpoints keep it)."""
        if key in self.raw:
            return self.raw[key]
        return self.text.get(key)

    @property
    def dtype(self) -> str | None:
        """The float dtype sglang builds the draft in with ``--dtype auto``, when it says one."""
        text = self.text
        for candidate in (
            text.get("dtype"),
            text.get("torch_dtype"),
            self.raw.get("dtype"),
            self.raw.get("torch_dtype"),
        ):
            if candidate in FLOAT_DTYPES:
                return candidate
        return None

    def namespace(self) -> SimpleNamespace:
        """The JSON as attributes (``text_config`` too), like the hf_config sglang passes."""
        return _as_namespace(self.raw)


def read_json(path: str) -> object:
    """The JSON in ``path``, by orjson (a large index lists every tensor), else by json."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8"))


def load_json(path: str, what: str, hint: str) -> object:
    """The JSON in ``path``, or a ``CheckpointFormatError`` naming it as ``what``."""
    try:
        return read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(
            file=path, problem=f"is not readable as {what} ({exc})", hint=hint
        ) from exc


def _as_namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _as_namespace(v) for k, v in value.items()})
    return value
