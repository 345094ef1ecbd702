"""A sharded checkpoint read as data: DCP's `.metadata` unpickled with only the classes DCP itself writes there
allowed, and its non-tensor items (the optimizer's param groups) loaded with `torch.load(weights_only=True)`.

Anything else a `.metadata` or an item names is refused (CheckpointRefused, naming the file and what it names)
before it is imported, so a file planted in a copied run folder runs nothing.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from ...worker import checkpoint as ckpt

METADATA = ".metadata"
_DCP = "torch.distributed.checkpoint"
# Every global a `.metadata` written by torch.distributed.checkpoint.save names (listed from real checkpoints
# with pickletools), besides torch's dtypes: DCP's own records, torch.Size, a layout, and the checkpoint's path.
_ALLOWED = {
    (f"{_DCP}.metadata", "Metadata"), (f"{_DCP}.metadata", "StorageMeta"), (f"{_DCP}.metadata", "MetadataIndex"),
    (f"{_DCP}.metadata", "TensorStorageMetadata"), (f"{_DCP}.metadata", "BytesStorageMetadata"),
    (f"{_DCP}.metadata", "ChunkStorageMetadata"), (f"{_DCP}.metadata", "TensorProperties"),
    (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"), (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),  # Python 3.13's pathlib
}


def _refused(path: Path, what: str) -> ckpt.CheckpointRefused:
    return ckpt.CheckpointRefused(
        f"{path}: refused to unpickle: it names {what}, which a sharded checkpoint's metadata never holds, and "
        "unpickling it could run code. If you wrote this checkpoint yourself, set `trust_checkpoints = true` for "
        "the pipeline in its config")


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata records, containers and plain values; refuses any other global."""

    def __init__(self, file: io.BufferedIOBase, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise _refused(self.path, f"{module}.{name}")


def read_metadata(checkpoint: Path) -> Metadata:
    """The DCP metadata of the checkpoint folder `checkpoint`, unpickled as data (CheckpointRefused if it names
    anything else)."""
    path = checkpoint / METADATA
    with open(path, "rb") as fh:
        metadata = _MetadataUnpickler(fh, path).load()
    if not isinstance(metadata, Metadata):
        raise _refused(path, type(metadata).__qualname__)
    return metadata


class MetadataReader(FileSystemReader):
    """DCP's file reader, with the metadata read (as data) beforehand: it never unpickles the file itself."""

    def __init__(self, checkpoint: Path, metadata: Metadata):
        super().__init__(checkpoint)
        self._metadata = metadata

    # No `kwargs` parameter: DCP then never falls back to a rank's own `__N.metadata` (torchherd writes none).
    def read_metadata(self, *args: Any, **options: Any) -> Metadata:
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        assert self._metadata.storage_meta is not None
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class DataPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading its non-tensor items as data."""

    def __init__(self, checkpoint: Path):
        super().__init__()
        self.checkpoint = checkpoint

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            if "GLOBAL" not in str(exc):
                raise
            assert self.metadata is not None
            stored = self.metadata.storage_data[read_item.storage_index]
            raise ckpt.refusal(self.checkpoint / stored.relative_path, exc) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def refusal_in(exc: CheckpointException) -> ckpt.CheckpointRefused | None:
    """The refusal one of the ranks met inside a DCP collective (DCP gives every rank all the ranks' failures)."""
    for failure, _trace in exc.failures.values():
        if isinstance(failure, ckpt.CheckpointRefused):
            return failure
    return None
