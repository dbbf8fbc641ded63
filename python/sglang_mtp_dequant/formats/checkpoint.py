"""The one place that knows how a ModelSlim checkpoint folder is laid out on disk.

Usage::

    source = resolve_checkpoint("/models/Qwen3.5-27B-w8a8")   # tools; or what sglang recorded
    ckpt = Checkpoint.open(source, wanted=lambda n: n.startswith("mtp."))
    info = ckpt.tensors["mtp.layers.0.mlp.up_proj.weight"]   # file, dtype, shape (header only)
    scales = ckpt.read_many([ckpt.tensors["mtp.layers.0.mlp.up_proj.weight_scale"], ...])

It reads the headers of exactly the files sglang streams (the weight bytes are read once, by
sglang) and checks index files the way sglang reads them.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

from ..errors import CheckpointFormatError
from .config import CheckpointConfig, load_json
from .description import read_description
from .foreign import DeclaredFormat, declared_format


@dataclass(frozen=True)
class WeightSource:
    """One checkpoint resolution: the folder and the weight files sglang streams from it, as
    its loader holds them (a snapshot's symlinks), in its order."""

    requested: str  # what sglang was asked to load: a folder, or a hub id
    folder: str
    files: tuple[str, ...]
    how: str  # who resolved it, for log lines and the doctor's header


RESTORE = "restore the file the exporter wrote, or delete it"
INDEX_RESTORE = "restore the index file the exporter wrote, or delete it"
CORRUPT = "the file is truncated or corrupt: download or export it again"

#: safetensors dtype tags -> torch dtypes (unsigned too: else unsigned codes would plan as float)
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
}


#: float8 storage: like integer codes, a weight in it needs its scale
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (a header's tag torch has no dtype for: as is)."""
    return str(dtype).removeprefix("torch.")


def is_code_dtype(dtype: torch.dtype | str) -> bool:
    """Integer or float8 storage: values that mean nothing without their scales."""
    if not isinstance(dtype, torch.dtype) or dtype == torch.bool:
        return False
    return not dtype.is_floating_point or dtype in FLOAT8_DTYPES


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what its header says; no tensor bytes."""

    name: str
    file: str
    dtype: torch.dtype | str  # a str only for a dtype tag torch has no name for
    shape: tuple[int, ...]

    @property
    def is_integer(self) -> bool:
        return isinstance(self.dtype, torch.dtype) and not (
            self.dtype.is_floating_point or self.dtype == torch.bool
        )

    @property
    def holds_codes(self) -> bool:
        return is_code_dtype(self.dtype)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)


@dataclass
class Checkpoint:
    """Header-level view of a checkpoint folder: tensor locations plus the ModelSlim description
    (``read_description``); each header parsed once."""

    folder: str
    files: list[str]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    description: dict[str, str] = field(default_factory=dict)
    description_file: str | None = None
    group_size: int = 0
    format_version: str | None = None  # ``Description.version``
    description_flags: dict[str, object] = field(default_factory=dict)  # ``Description.flags``
    #: config.json's ``quantization_config`` (a compressed-tensors or ModelOpt export), if any
    declared: DeclaredFormat | None = None

    @classmethod
    def open(
        cls,
        source: WeightSource,
        wanted: Callable[[str], bool] = lambda name: True,
        indexes: Mapping[str, object] | None = None,
    ) -> Checkpoint:
        """Read the description, the index files and the headers of ``source``'s files,
        recording the tensors ``wanted`` names; ``indexes``: index files already parsed."""
        folder = os.path.abspath(source.folder)
        if not os.path.isdir(folder):
            raise CheckpointFormatError(
                file=folder,
                problem="is not a folder",
                hint="pass the local checkpoint folder sglang loads (--model-path)",
            )
        ckpt = cls(folder=folder, files=list(source.files))
        ckpt._read_description()
        ckpt.declared = _declared_format(folder)
        ckpt._check_index_files(wanted, indexes or {})
        for path in ckpt.files:
            ckpt._read_header(path, wanted)
        return ckpt

    def type_of(self, name: str) -> str | None:
        """The description's type for ``name`` (``FLOAT``, ``W8A8_DYNAMIC``, ...), if any."""
        return self.description.get(name)

    def read_many(self, infos: Iterable[TensorInfo]) -> dict[str, torch.Tensor]:
        """Read (small, companion) tensors, each file opened once: name -> tensor."""
        by_file: dict[str, list[TensorInfo]] = {}
        for info in infos:
            by_file.setdefault(info.file, []).append(info)
        out: dict[str, torch.Tensor] = {}
        for path, wanted in by_file.items():
            name = wanted[0].name
            try:
                with safe_open(path, framework="pt") as handle:
                    for info in wanted:
                        name = info.name
                        out[name] = handle.get_tensor(name)
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointFormatError(
                    file=path, problem=f"cannot read tensor {name!r} ({exc})", hint=CORRUPT
                ) from exc
        return out

    def _read_description(self) -> None:
        described = read_description(self.folder)
        self.description_file = described.file
        self.description = described.entries
        self.description_flags = described.flags
        self.group_size = described.group_size
        self.format_version = described.version

    def _check_index_files(
        self, wanted: Callable[[str], bool], parsed: Mapping[str, object]
    ) -> None:
        for index_path in sorted(glob.glob(os.path.join(self.folder, "*.safetensors.index.json"))):
            raw = parsed.get(os.path.basename(index_path))
            if raw is None:
                raw = load_json(index_path, "a safetensors index", RESTORE)
            weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
            if not isinstance(weight_map, dict):
                raise CheckpointFormatError(
                    file=index_path, problem="has no 'weight_map' object", hint=INDEX_RESTORE
                )
            if not self._index_shards_sound(weight_map):
                self._check_index_entries(index_path, weight_map, wanted)

    def _index_shards_sound(self, weight_map: Mapping[str, object]) -> bool:
        """Whether every shard the index names exists inside the folder (judged per shard: only
        an index with a problem is walked name by name)."""
        shards = index_shards(weight_map)
        return shards is not None and all(
            "\x00" not in shard
            and _inside_folder(shard)
            and os.path.isfile(os.path.join(self.folder, shard))
            for shard in shards
        )

    def _check_index_entries(
        self, index_path: str, weight_map: Mapping[str, object], wanted: Callable[[str], bool]
    ) -> None:
        """Raise on the first entry of ``weight_map`` that is no file name inside the folder, or
        maps a wanted name to a missing shard (other missing shards: whoever needs them)."""
        inside: dict[str, bool] = {}
        present: dict[str, bool] = {}
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or "\x00" in shard:
                raise CheckpointFormatError(
                    file=index_path,
                    problem=f"maps {name!r} to {shard!r}, not a file name",
                    hint=INDEX_RESTORE,
                )
            if shard not in inside:
                inside[shard] = _inside_folder(shard)
            if not inside[shard]:
                raise CheckpointFormatError(
                    file=index_path,
                    problem=f"maps {name!r} to {shard!r}, outside the checkpoint folder",
                    hint="an index must name shard files in its own folder; fix or delete it",
                )
            if not wanted(name):
                continue
            if shard not in present:
                present[shard] = os.path.isfile(os.path.join(self.folder, shard))
            if not present[shard]:
                raise CheckpointFormatError(
                    file=index_path,
                    problem=f"maps {name!r} to shard {shard!r}, which does not exist",
                    hint="the download or export is incomplete: fetch the missing shard",
                )

    def _read_header(self, path: str, wanted: Callable[[str], bool]) -> None:
        try:
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():
                    if not wanted(name):
                        continue
                    piece = handle.get_slice(name)
                    tag = piece.get_dtype()
                    info = TensorInfo(
                        name=name,
                        file=path,
                        dtype=_SAFETENSORS_DTYPES.get(tag, tag),
                        shape=tuple(int(d) for d in piece.get_shape()),
                    )
                    self._record(info)
        except CheckpointFormatError:
            raise
        except Exception as exc:  # safetensors raises its own error types on bad headers
            raise CheckpointFormatError(
                file=path, problem=f"is not a readable safetensors file ({exc})", hint=CORRUPT
            ) from exc

    def _record(self, info: TensorInfo) -> None:
        previous = self.tensors.get(info.name)
        if previous is not None and (previous.dtype, previous.shape) != (info.dtype, info.shape):
            raise CheckpointFormatError(
                file=info.file,
                problem=(
                    f"holds {info.name!r} as {info.dtype_name}{list(info.shape)}, but "
                    f"{previous.file} holds it as {previous.dtype_name}{list(previous.shape)}"
                ),
                hint="sglang streams every *.safetensors in the folder: remove the stray file",
            )
        self.tensors.setdefault(info.name, info)


def header_names(path: str) -> list[str]:
    """Every tensor name in a safetensors file's header, without ``safe_open``'s per-tensor
    checks; ``CheckpointFormatError`` for no readable header."""
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
    except (OSError, ValueError) as exc:  # json's errors are ValueErrors too
        raise CheckpointFormatError(
            file=path, problem=f"is not a readable safetensors file ({exc})", hint=CORRUPT
        ) from exc
    return [name for name in header if name != "__metadata__"]


def _declared_format(folder: str) -> DeclaredFormat | None:
    """config.json's quantization_config; a folder without a readable config declares none."""
    try:
        return declared_format(CheckpointConfig.read(folder))
    except CheckpointFormatError:
        return None


def index_shards(weight_map: object) -> set[str] | None:
    """The shards an index's ``weight_map`` names, or None if it is no map of names to strings."""
    if not isinstance(weight_map, dict):
        return None
    try:
        shards = set(weight_map.values())
    except TypeError:  # an unhashable entry: not a file name
        return None
    if not all(isinstance(shard, str) and shard for shard in shards):
        return None
    return shards


def _inside_folder(entry: str) -> bool:
    """Whether an index entry names a file under its folder, by name (snapshots are symlinks)."""
    if os.path.isabs(entry) or entry.startswith(("/", "\\")):
        return False
    normal = os.path.normpath(entry)
    return normal != os.curdir and normal.split(os.sep)[0] != os.pardir
