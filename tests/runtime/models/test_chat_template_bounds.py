"""Issue 39, findings 7 and 8 and the minor template one: a checkpoint's chat template renders
where it can be stopped (runtime.models.template_sandbox). A hang stops at the time limit, an
explosion at the output or memory bound, any failure of the template's code is one
InvalidRequestError (a 400), and a template that cannot render a sample conversation is refused
at load in one line. Before: nested `range(99999)` loops never returned, `'a' * 10**9` took
gigabytes, OverflowError / a missing loader were 500s, an unclosed tag failed on every request.
The budgets here are small (0.5 s) so the hanging cases take about that long."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import runtime.server
from runtime.cli import main
from runtime.errors import InvalidRequestError, ModelLoadError
from runtime.models import template_sandbox
from runtime.models.chat_template import render_chat_template, render_chat_template_async
from runtime.models.template_sandbox import TemplateLimits, TemplateSandbox
from runtime.models.tokenizer import Tokenizer
from tests.runtime.models.builders import build_llama
from tests.runtime.models.gguf_files import write_gguf
from tests.runtime.models.gguf_hostile import rewrite

MESSAGES = [{"role": "user", "content": "hi"}]
NESTED_LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
HOSTILE: dict[str, tuple[str, str]] = {  # template, what the 400 says
    "nested_range_loops": (NESTED_LOOPS, "took longer than 0.5 s"),
    "string_times_1e9": ("{{ 'a' * 1000000000 }}", "beyond the output bound"),
    "range_1e9_overflow": ("{% for i in range(10**9) %}{% endfor %}", "OverflowError"),
    "include_without_loader": ("{% include 'x.jinja' %}", "no loader"),
    "center_1e9": ("{{ 'a'|center(1000000000) }}", "memory bound"),
    "doubling_loop": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "chat template failed",
    ),
    "output_past_bound": ("{% for i in range(99999) %}{{ 'x' * 100 }}{% endfor %}", "bound"),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "chat template failed"),
    "unclosed_tag": ("{% if messages %}hello", "TemplateSyntaxError"),
    "huge_power": ("{{ 7 ** 99999999 }}", "exponent"),
}


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[TemplateSandbox]:
    sandbox = TemplateSandbox(TemplateLimits(time_s=0.5, max_output_chars=1 << 20))
    monkeypatch.setattr(template_sandbox, "_sandbox", sandbox)
    yield sandbox
    sandbox.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_a_400_and_stops(small_budget: TemplateSandbox, name: str) -> None:
    template, reason = HOSTILE[name]
    with pytest.raises(InvalidRequestError) as exc:
        render_chat_template(template, MESSAGES, bos_token="<s>", eos_token="</s>")
    assert exc.value.http_status == 400 and exc.value.param == "messages"
    assert reason in exc.value.message and "\n" not in exc.value.message
    # the sandbox serves the next request (a killed worker is replaced)
    ok = render_chat_template("{{ messages[0].content }}!", MESSAGES, bos_token="", eos_token="")
    assert ok == "hi!"


CHATML = (  # SmolLM2's template
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# the loop-control syntax some real templates use (transformers enables it)
WITH_BREAK = (
    "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}|{% break %}{% endif %}"
    "{% endfor %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "[{{ m.role }}]{{ m.content }}{% endfor %}"
)


@pytest.mark.parametrize("template", [CHATML, WITH_BREAK], ids=["chatml", "loopcontrols"])
def test_renders_like_transformers(small_budget: TemplateSandbox, template: str) -> None:
    """Real template syntax gives what transformers' own renderer gives."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "system", "content": "Be terse."}, *MESSAGES]
    ours = render_chat_template(template, messages, bos_token="", eos_token="")
    (expected,), _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True
    )
    assert ours == expected


def test_template_raise_exception_is_its_message(small_budget: TemplateSandbox) -> None:
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidRequestError, match="chat template: roles must alternate"):
        render_chat_template(template, MESSAGES, bos_token="", eos_token="")


def test_async_helper_renders_off_the_loop(small_budget: TemplateSandbox) -> None:
    import asyncio

    text = asyncio.run(
        render_chat_template_async("{{ messages|length }}", MESSAGES, bos_token="", eos_token="")
    )
    assert text == "1"


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gguf-template")
    return write_gguf(build_llama(root / "m", tokenizer=False), root / "good.gguf")


BAD_AT_LOAD = {
    "unclosed_tag": ("{% for m in messages %}{{ m.content }}", "TemplateSyntaxError"),
    "include": ("{% include 'other.jinja' %}", "no loader"),
    "hang": (NESTED_LOOPS, "took longer than 0.5 s"),
}


@pytest.mark.parametrize("name", sorted(BAD_AT_LOAD))
def test_gguf_template_refused_at_load_by_convert_and_serve(
    small_budget: TemplateSandbox,
    good_gguf: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
) -> None:
    template, reason = BAD_AT_LOAD[name]
    path = rewrite(good_gguf, tmp_path / "model.gguf", {"tokenizer.chat_template": template})
    with pytest.raises(SystemExit) as exc:
        main(["convert", "--input", str(path), "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "chat template fails on a sample conversation" in err and reason in err

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the template passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(path), "--port", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and reason in err and str(path) in err


def test_model_dir_template_refused_at_load(
    small_budget: TemplateSandbox, demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    path = tmp_path / "llama"
    shutil.copytree(demo_model_dir("llama"), path)
    (path / "chat_template.jinja").write_text("{% if messages %}unclosed")
    with pytest.raises(ModelLoadError) as exc:
        Tokenizer.from_dir(path)
    assert str(path) in exc.value.message and "TemplateSyntaxError" in exc.value.message


def test_a_template_refusing_the_sample_by_its_own_rule_loads(
    small_budget: TemplateSandbox, demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Gemma-style templates raise_exception on a system role: their rule, not a broken file."""
    path = tmp_path / "llama"
    shutil.copytree(demo_model_dir("llama"), path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_dir(path)
    assert tokenizer.apply_chat_template(MESSAGES) == "hi"


def test_model_dir_template_refused_by_serve_and_convert(
    small_budget: TemplateSandbox,
    demo_model_dir: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "llama"
    shutil.copytree(demo_model_dir("llama"), path)
    (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the template passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    for argv in (
        ["serve", "--model", str(path), "--port", "0"],
        ["convert", "--input", str(path), "--output", str(tmp_path / "out"), "--quiet"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1, (argv[0], err)
        assert "TemplateSyntaxError" in err and str(path) in err
