"""`fastllm embed`: one JSON array per text, or one JSON document; vs transformers BertModel."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.cli import main

TEXTS = ["The cache stores keys and values.", "Batching shares the weights."]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _reference(path: Path, texts: list[str]) -> torch.Tensor:
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(path)
    model = BertModel.from_pretrained(path).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state  # [B, S, H]
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_embed_lines_match_transformers(
    demo_model_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = demo_model_dir("bert")
    rc, out, _ = _run(["embed", "--model", str(path), *TEXTS], capsys)
    assert rc == 0
    vectors = torch.tensor([json.loads(line) for line in out.splitlines()])
    assert vectors.shape == (2, 64)
    cosine = (vectors * _reference(path, TEXTS)).sum(-1)
    assert torch.all(cosine > 0.9999)


def test_embed_json_document(
    demo_model_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = _run(["embed", "--model", str(demo_model_dir("bert")), "--json", *TEXTS], capsys)
    doc = json.loads(out)
    assert rc == 0 and [d["index"] for d in doc["data"]] == [0, 1]
    assert abs(sum(x * x for x in doc["data"][1]["embedding"]) - 1.0) < 1e-5


def test_embed_errors(
    demo_model_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = _run(["embed", "--model", str(demo_model_dir("llama")), "x"], capsys)
    assert rc == 2 and out == "" and err.startswith("error: ") and "encoder" in err
    rc, _, err = _run(["embed", "--model", str(demo_model_dir("bert")), "word " * 600], capsys)
    assert rc == 2 and "context" in err
