"""Reading a GGUF file with llama.cpp's own reader (the `gguf` package): metadata and tensors.

Each tensor comes out as a `GGUFTensor`: its GGML type, its logical shape (row-major, as torch
sees it) and its raw bytes, still packed, straight from the memory map. Dequantizing is a separate
step (`dequantize`), so a later change can keep some types packed (Q4_1, Q8_0 kernels) by
intercepting tensors before it.

Every problem with the file is a one-line `ModelLoadError` naming the file. The reader maps the file
instead of reading it, and its sizes are checked against the file's length before any tensor is
touched, so a header that claims terabytes allocates nothing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from runtime.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
# types we turn into floats: plain floats, the legacy block quants and the K-quants. The rest (the
# IQ / TQ / MXFP4 families, integer tensors) are refused by name rather than half supported.
DEQUANTIZABLE = [
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
]
_HEADER_BYTES = 24  # magic, version, tensor count, kv count


@dataclass(frozen=True)
class GGUFTensor:
    name: str  # the GGUF name, e.g. "blk.0.attn_q.weight"
    ggml_type: str  # GGMLQuantizationType name: "F32", "Q4_1", ...
    shape: tuple[int, ...]  # logical shape, torch order ([out, in] for a linear weight)
    data: np.ndarray  # raw bytes as the file holds them (a view into the memory map)


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # key -> str | int | float | bool | list, as gguf decodes it
    tensors: dict[str, GGUFTensor]  # by GGUF name, in file order

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_types(self) -> dict[str, int]:
        """GGML type -> number of tensors (the file's quantization, for provenance)."""
        counts: dict[str, int] = {}
        for tensor in self.tensors.values():
            counts[tensor.ggml_type] = counts.get(tensor.ggml_type, 0) + 1
        return counts


def is_gguf(path: Path) -> bool:
    """A file that starts with the GGUF magic (or is named *.gguf: then a bad magic is an error)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    with path.open("rb") as fh:
        return fh.read(4) == GGUF_MAGIC


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path)
    size = _check_header(path)
    import gguf  # a runtime dependency, imported here so safetensors-only users never pay for it

    try:
        reader = _checked_reader(gguf, path, size)
        metadata = {key: field.contents() for key, field in reader.fields.items() if field.types}
        raw = list(reader.tensors)
    except ModelLoadError:
        raise
    except Exception as exc:  # the reader raises ValueError/IndexError/KeyError on bad bytes
        raise ModelLoadError(
            f"{path}: not a readable GGUF file, header truncated or corrupt ({_one_line(exc)})"
        ) from exc
    tensors: dict[str, GGUFTensor] = {}
    for t in raw:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise _beyond_end(path, t.name, end, size)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGML lists dims inner first
        tensors[t.name] = GGUFTensor(t.name, t.tensor_type.name, shape, t.data)
    return GGUFFile(path, metadata, tensors)


def _beyond_end(path: Path, name: str, end: int, size: int) -> ModelLoadError:
    return ModelLoadError(
        f"{path}: tensor {name!r} claims bytes up to {end}, the file has {size} "
        "(truncated, or a header that lies about sizes)"
    )


def _checked_reader(gguf: Any, path: Path, size: int) -> Any:
    """gguf's reader, with each tensor's claimed extent checked against the file before the
    reader slices the map (where a short slice would surface as an obscure reshape error)."""

    class CheckedReader(gguf.GGUFReader):  # type: ignore[misc, name-defined]
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
                block, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
                n_bytes = int(np.prod(dims.astype(object))) * type_bytes // block  # no overflow
                end = int(start_offs) + int(offset[0]) + n_bytes
                if end > size:
                    raise _beyond_end(path, bytes(name).decode(errors="replace"), end, size)
            super()._build_tensors(start_offs, fields)

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            fast = _array_parts(gguf, self, orig_offs, raw_type)
            return fast if fast is not None else super()._get_field_parts(orig_offs, raw_type)

    return CheckedReader(str(path))


def _array_parts(gguf: Any, reader: Any, orig_offs: int, raw_type: int) -> Any:
    """gguf's `_get_field_parts` for a flat array of strings or scalars, with the same parts
    (item types, data indices, contents), built without one numpy memmap slice per element:
    SmolLM2's vocabulary and merges are ~98k strings, and gguf's reader spent ~2.5 CPU s per open
    slicing them (every TP rank and every load opens the file). None: not such an array (gguf's
    own code then reads it)."""
    kinds = gguf.GGUFValueType
    if raw_type != kinds.ARRAY:
        return None
    raw_itype = reader._get(orig_offs, np.uint32)
    alen = reader._get(orig_offs + 4, np.uint64)
    item = kinds(int(raw_itype[0]))
    count = int(alen[0])
    offs = orig_offs + 12
    head: list[Any] = [raw_itype, alen]
    types = [kinds.ARRAY, item] if count else [kinds.ARRAY]  # gguf's: the item type from the first
    if item == kinds.STRING:
        data = memoryview(reader.data)  # the map itself: slices of it are views, not copies
        swapped = reader.byte_order == "S"
        order: Literal["little", "big"] = (
            "big" if (sys.byteorder == "little") == swapped else "little"
        )
        end = len(data)
        parts = head
        for _ in range(count):
            if offs + 8 > end:
                raise ValueError(f"string length at {offs} beyond the file's {end} bytes")
            length = int.from_bytes(data[offs : offs + 8], order)
            if offs + 8 + length > end:
                raise ValueError(f"string of {length} bytes at {offs} beyond the file's end")
            parts.append(data[offs : offs + 8])  # the length (read by nobody, kept for shape)
            parts.append(data[offs + 8 : offs + 8 + length])  # .tobytes() as contents() reads
            offs += 8 + length
        return offs - orig_offs, parts, list(range(3, 2 + 2 * count, 2)), types
    nptype = reader.gguf_scalar_to_np.get(item)
    if nptype is None:  # nested arrays: gguf's own code
        return None
    values = reader._get(offs, nptype, count)
    if len(values) != count:
        raise ValueError(f"array of {count} {item.name} at {offs} beyond the file's end")
    rows = list(np.asarray(values).reshape(count, 1))  # one 1-element part per item, as gguf's
    return (
        offs + int(values.nbytes) - orig_offs,
        head + rows,
        list(range(2, 2 + count)),
        types,
    )


def _check_header(path: Path) -> int:
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such GGUF file")
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(_HEADER_BYTES)
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (wrong magic {head[:4]!r})")
    if len(head) < _HEADER_BYTES:
        raise ModelLoadError(f"{path}: truncated GGUF file ({size} bytes, header incomplete)")
    return size


def dequantize(path: Path, tensor: GGUFTensor, dtype: torch.dtype) -> torch.Tensor:
    """The tensor as `dtype`, shape `tensor.shape`. Quantized blocks go through float32."""
    if tensor.ggml_type not in DEQUANTIZABLE:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name!r} has type {tensor.ggml_type}, which is not supported "
            f"(supported: {', '.join(DEQUANTIZABLE)})"
        )
    if tensor.ggml_type in ("F32", "F16"):
        values = torch.from_numpy(np.array(tensor.data, copy=True))  # the map is read-only
    else:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize

        qtype = GGMLQuantizationType[tensor.ggml_type]
        values = torch.from_numpy(gguf_dequantize(tensor.data, qtype))
    return values.reshape(tensor.shape).to(dtype)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
