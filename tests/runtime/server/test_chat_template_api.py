"""Issue 39, findings 7 and 8 over HTTP: a model whose chat template hangs, explodes or fails on
some conversations answers those requests with a 400 in the OpenAI error shape, quickly (a small
time budget), and goes on serving the rest. Before: OverflowError and a missing loader were 500s
with tracebacks, nested range loops never returned and blocked /health, `'a' * 10**9` took GBs."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from runtime.models import template_sandbox
from tests.runtime.server.inprocess import AUTH, InProcess, in_process
from tests.runtime.server.live import engine_for, light_settings, router_of

# fine on the load-time sample conversation; each trap is sprung by one message's content
TEMPLATE = """\
{% set last = messages[-1]['content'] %}
{% if last == 'overflow' %}{% for i in range(10**9) %}{% endfor %}
{% elif last == 'include' %}{% include 'other.jinja' %}
{% elif last == 'hang' %}{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}\
{% endfor %}
{% elif last == 'huge' %}{{ 'a' * 1000000000 }}
{% elif last == 'refuse' %}{{ raise_exception('this model refuses that') }}
{% endif %}
{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>
{{ m['content'] }}{{ eos_token }}
{% endfor %}<|assistant|>
"""


@pytest.fixture(scope="module")
def app(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcess]:
    path = tmp_path_factory.mktemp("template-api") / "llama"
    shutil.copytree(demo_model_dir("llama"), path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    saved = template_sandbox._sandbox
    try:
        make_router = router_of(llama=partial(engine_for, path, name="llama"))
        # the settings set the sandbox's limits (runtime.server.wiring.configure_request_work)
        with in_process(light_settings(chat_template_timeout_s=0.5), make_router) as served:
            sandbox = template_sandbox._sandbox
            assert sandbox is not None and sandbox.limits.time_s == 0.5
            yield served
    finally:
        if template_sandbox._sandbox is not None:
            template_sandbox._sandbox.close()
        template_sandbox._sandbox = saved


def chat(app: InProcess, content: str) -> object:
    body = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    return app.client.post("/v1/chat/completions", json=body, headers=AUTH)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("overflow", "OverflowError"),
        ("include", "no loader"),
        ("hang", "took longer than 0.5 s"),
        ("huge", "beyond the output bound"),
        ("refuse", "chat template: this model refuses that"),
    ],
)
def test_template_failure_is_a_400_in_the_openai_shape(
    app: InProcess, content: str, needle: str
) -> None:
    response = chat(app, content)
    assert response.status_code == 400, response.text  # type: ignore[attr-defined]
    error = response.json()["error"]  # type: ignore[attr-defined]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    assert needle in error["message"] and "Traceback" not in error["message"]
    # the server goes on serving: health, and a conversation the template renders
    assert app.client.get("/health").status_code == 200
    assert chat(app, "hello").status_code == 200  # type: ignore[attr-defined]
