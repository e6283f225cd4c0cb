"""Bad GGUF files: each is one `ModelLoadError` line naming the file and the reason, from the
loader and from the CLI (`fastllm convert`, `fastllm serve` before it starts: exit 2), and a header
that claims more data than the file holds allocates nothing of the claimed size."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import runtime.server
from runtime.cli import main
from runtime.errors import ModelLoadError
from runtime.models import load_model
from tests.runtime.models.builders import build_llama
from tests.runtime.models.gguf_files import write_gguf


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gguf-bad")
    return write_gguf(build_llama(root / "m", tokenizer=False), root / "good.gguf")


def truncated(good: Path, out: Path) -> Path:
    data = good.read_bytes()
    out.write_bytes(data[: len(data) * 2 // 3])  # header intact, tensor data cut
    return out


def header_cut(good: Path, out: Path) -> Path:
    out.write_bytes(good.read_bytes()[:200])  # inside the metadata
    return out


def wrong_magic(good: Path, out: Path) -> Path:
    out.write_bytes(b"GGUX" + good.read_bytes()[4:])
    return out


def unknown_arch(good: Path, out: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(out), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    _finish(writer)
    return out


def unsupported_type(good: Path, out: Path) -> Path:
    """A weight stored as I32, a GGML type with no float meaning here."""
    import gguf

    reader = gguf.GGUFReader(str(good))
    writer = gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    for t in reader.tensors:
        array = np.array(t.data)
        if t.name == "blk.0.attn_norm.weight":
            array = array.astype(np.int32)
        writer.add_tensor(t.name, array)
    _finish(writer)
    return out


def lying_header(good: Path, out: Path) -> Path:
    """The first tensor's row count rewritten to 2**40: ~4 TB of claimed f32 data."""
    data = bytearray(good.read_bytes())
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    assert n_dims == 2
    struct.pack_into("<Q", data, at + 4 + 8, 1 << 40)  # dims are inner-first: [hidden, vocab]
    out.write_bytes(bytes(data))
    return out


def _finish(writer: object) -> None:
    writer.write_header_to_file()  # type: ignore[attr-defined]
    writer.write_kv_data_to_file()  # type: ignore[attr-defined]
    writer.write_tensors_to_file()  # type: ignore[attr-defined]
    writer.close()  # type: ignore[attr-defined]


BAD: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "truncated": (truncated, "claims bytes up to"),
    "header_cut": (header_cut, "header truncated or corrupt"),
    "wrong_magic": (wrong_magic, "not a GGUF file (wrong magic"),
    "unknown_arch": (unknown_arch, "unsupported GGUF architecture 'mamba'"),
    "unsupported_type": (unsupported_type, "has type I32, which is not supported"),
    "lying_header": (lying_header, "claims bytes up to 28147497"),  # 2**40 * 64 * 4 + ...
}


@pytest.fixture(params=sorted(BAD))
def bad(request: pytest.FixtureRequest, good_gguf: Path, tmp_path: Path) -> tuple[Path, str]:
    make, reason = BAD[request.param]
    return make(good_gguf, tmp_path / "model.gguf"), reason  # the reason is not in the name


def test_loader_raises_one_line_naming_file_and_reason(bad: tuple[Path, str]) -> None:
    path, reason = bad
    with pytest.raises(ModelLoadError) as exc:
        load_model(path, device="cpu")
    message = str(exc.value)
    assert "\n" not in message
    assert str(path) in message and reason in message


def test_convert_cli_prints_one_line_and_exits_2(
    bad: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, reason = bad
    with pytest.raises(SystemExit) as exc:
        main(["convert", "--input", str(path), "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and reason in err
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_serve_cli_refuses_before_starting(
    bad: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the bad file passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    path, reason = bad
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(path), "--port", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and reason in err


def test_lying_header_allocates_nothing_of_the_claimed_size(
    good_gguf: Path, tmp_path: Path
) -> None:
    path = lying_header(good_gguf, tmp_path / "lying.gguf")
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError):
            load_model(path, device="cpu")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the header claims 2**40 rows of 64 floats
