"""Property tests of the three generation endpoints (issue 17): hypothesis sends arbitrary JSON
(request-shaped or not, lone surrogates, NaN and infinities, unknown and unsupported fields), with
a valid key, a wrong one or none. Whatever comes: never a 5xx, every error body OpenAI-shaped, and
inference_log rows + spilled + dropped = the requests that passed authentication."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.runtime.server.inprocess import (
    AUTH,
    InProcess,
    in_process,
    llama_and_bert,
    storage_settings,
)

# the server's own threads (engines, writer) use `random` while hypothesis draws a case; hypothesis
# takes that for a strategy using it (it is not: the cases come from its own seeded source)
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

EXAMPLES = 100  # per endpoint; seeded, so CI sees the same cases
MAX_NEW_TOKENS = 3
ENDPOINTS = {
    "/v1/completions": {"model": "llama", "prompt": "hello"},
    "/v1/chat/completions": {"model": "llama", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"model": "bert", "input": "hello"},
}
FIELDS = [
    *("model", "prompt", "messages", "input", "max_tokens", "max_completion_tokens", "stop"),
    *("temperature", "top_p", "n", "seed", "stream", "stream_options", "user", "ignore_eos"),
    *("encoding_format", "logprobs", "top_logprobs", "echo", "best_of", "logit_bias", "tools"),
    *("response_format", "dimensions", "suffix", "presence_penalty", "role", "content"),
]

text = st.text(st.characters() | st.sampled_from(["\ud800", "\udfff", "\x00"]), max_size=12)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats()  # NaN and infinities too: Python's JSON reads them
    | text
    | st.sampled_from(["llama", "bert", "user", "assistant", "base64", "float"])
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | text, inner, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def bodies(draw: st.DrawFn, path: str) -> Any:
    if draw(st.integers(0, 4)) == 0:
        return draw(values)  # anything at all
    body = dict(ENDPOINTS[path])  # request-shaped: a valid base, fields replaced or added
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        body[name] = draw(values)
    for name in ("max_tokens", "max_completion_tokens"):  # keep the real engine quick
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_NEW_TOKENS:
            body[name] = MAX_NEW_TOKENS
    limits = (body.get("max_tokens"), body.get("max_completion_tokens"))
    if not path.endswith("embeddings") and limits == (None, None):  # not the default 16 / 256
        body["max_tokens"] = MAX_NEW_TOKENS
    return body


@pytest.fixture(scope="module")
def app(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcess]:
    settings = storage_settings(tmp_path_factory.mktemp("properties"))
    with in_process(settings, llama_and_bert(demo_model_dir)) as served:
        yield served


def check_response(response: Any) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str) and error["type"]
        assert error["param"] is None or isinstance(error["param"], str)


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_arbitrary_json_never_5xx_and_every_authenticated_request_is_accounted(
    app: InProcess, path: str
) -> None:
    writer = app.state.writer
    rows, spilled, dropped = app.barrier_rows(), writer.num_spilled, writer.num_dropped
    num_authenticated = 0

    @seed(17 + len(path))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=bodies(path), auth=st.sampled_from(["key", "key", "none", "wrong"]))
    def check(body: Any, auth: str) -> None:
        nonlocal num_authenticated
        headers = {"Content-Type": "application/json"}
        if auth == "key":
            headers.update(AUTH)
            num_authenticated += 1
        elif auth == "wrong":
            headers["Authorization"] = "Bearer not-the-key"
        response = app.client.post(path, content=json.dumps(body).encode(), headers=headers)
        check_response(response)
        assert (response.status_code == 401) == (auth != "key")

    check()
    assert num_authenticated > EXAMPLES // 3
    stored = app.rows(rows + num_authenticated) - rows
    accounted = stored + writer.num_spilled - spilled + writer.num_dropped - dropped
    assert accounted == num_authenticated
