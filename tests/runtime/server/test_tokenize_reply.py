"""/tokenize's large reply written from a table of the ids' spellings: byte for byte what the
JSON encoder (runtime.server.offload.json_bytes, Starlette's JSONResponse) writes."""

from __future__ import annotations

import json
import random

import pytest

from runtime.server.offload import SCALAR_SLICE, json_bytes
from runtime.server.openai.tokenize import reply, reply_bytes


def _standard(payload: object) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("count", [0, 1, SCALAR_SLICE, SCALAR_SLICE + 1, 100_000])
def test_the_reply_is_the_encoders_bytes(count: int) -> None:
    rng = random.Random(count)
    ids = [rng.randrange(50_000) for _ in range(count)] + [0, 49_999][: min(count, 2)]
    expected = _standard(reply(ids, 2048))
    assert reply_bytes(ids, 2048, 50_000) == expected == json_bytes(reply(ids, 2048))


def test_an_id_past_the_table_goes_through_the_encoder() -> None:
    ids = [5, 70_000, 7]  # no tokenizer gives this; the reply is still right
    assert reply_bytes(ids, 16, 512) == _standard(reply(ids, 16))
