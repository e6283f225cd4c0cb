"""Hostile GGUF files for tests: a good tiny file (gguf_files.write_gguf) rewritten by llama.cpp's
own writer with some metadata keys replaced, added or dropped; the tensors stay as they were.

    rewrite(good, tmp / "m.gguf", {"llama.block_count": 2**31})
    rewrite(good, tmp / "m.gguf", {"tokenizer.ggml.tokens": None})   # dropped
    empty_token_list(good, tmp / "m.gguf")                          # a list of 0 tokens
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

_PLACEHOLDER = "x" * 24  # 8 length bytes + 24: the 32 bytes removed keep the data aligned


def rewrite(good: Path, out: Path, overrides: dict[str, Any]) -> Path:
    import gguf

    reader = gguf.GGUFReader(str(good))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name not in overrides:
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    for key, value in overrides.items():
        if value is not None:
            writer.add_key_value(key, value, *_types(gguf, value))
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def empty_token_list(good: Path, out: Path) -> Path:
    """tokenizer.ggml.tokens as an array of 0 strings (GGUFWriter refuses to write one, so a
    1-token list is written and its one item cut out of the bytes)."""
    rewrite(good, out, {"tokenizer.ggml.tokens": [_PLACEHOLDER]})
    data = out.read_bytes()
    item = struct.pack("<Q", len(_PLACEHOLDER)) + _PLACEHOLDER.encode()
    count = struct.pack("<Q", 1)
    at = data.index(count + item)
    out.write_bytes(data[:at] + struct.pack("<Q", 0) + data[at + len(count) + len(item) :])
    return out


def _types(gguf: Any, value: Any) -> tuple[Any, Any]:
    kinds = gguf.GGUFValueType
    if isinstance(value, bool):
        return kinds.BOOL, None
    if isinstance(value, int):
        return (kinds.UINT32 if 0 <= value < 2**32 else kinds.UINT64), None
    if isinstance(value, float):
        return kinds.FLOAT32, None
    if isinstance(value, str):
        return kinds.STRING, None
    return kinds.ARRAY, _types(gguf, value[0])[0]
