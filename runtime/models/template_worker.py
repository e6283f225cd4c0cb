"""The chat-template renderer's worker process: renders a checkpoint's Jinja template in jinja2's
immutable sandbox, inside a process the server can kill (runtime.models.template_sandbox).

A template is code from the model file. The sandbox stops it touching Python internals, but not
from spending: `{% for i in range(99999) %}{% for j in range(99999) %}` runs for hours and
`{{ 'a' * 1000000000 }}` takes gigabytes, in whichever thread renders it. Here it runs with
- an address-space limit (RLIMIT_AS: the process's size at start + the headroom the parent
  passes), so any allocation past it is a MemoryError, reported like any other template error;
- `*` and `**` intercepted (which also keeps jinja from folding `'a' * 10**9` at compile time):
  a repetition past the output bound or a huge power is refused before it is computed;
- the output counted as it is generated, refused past `max_chars`;
and the parent kills the process when a render runs past its time limit.

Run as a script (`python -I template_worker.py HEADROOM_BYTES`), never imported by the server: it
needs only the standard library and jinja2. Protocol: one JSON line per request
({"template", "context", "max_chars"}) on stdin, one JSON line per reply on stdout
({"text"} or {"error", "kind"}: "raised" when the template called raise_exception, "limit" for a
bound, "template" for anything else). The first line out is {"ready": true}.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_EXPONENT = 4096  # 10 ** 4096 is a 13,600-digit int: plenty for a template, cheap to compute
_CACHED_TEMPLATES = 16


class TemplateRaised(Exception):
    """The template's own raise_exception('...'): its verdict on the conversation."""


class LimitExceeded(Exception):
    pass


def raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def __init__(self) -> None:
        # as transformers renders them: loopcontrols for the templates that `{% break %}`
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        self.globals["raise_exception"] = raise_exception
        self.max_chars = 0  # set per request

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | bytes | list | tuple)
                    and isinstance(count, int)
                    and len(seq) * count > self.max_chars
                ):
                    raise LimitExceeded(
                        f"a repetition of {len(seq)} x {count} is beyond the output bound "
                        f"of {self.max_chars} characters"
                    )
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise LimitExceeded(f"an exponent of {right} is beyond {MAX_EXPONENT}")
        return super().call_binop(context, operator, left, right)


def limit_memory(headroom_bytes: int) -> None:
    try:
        with open("/proc/self/statm") as fh:
            size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return  # not Linux: the time limit still holds
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + headroom_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def render(env: BoundedEnvironment, cache: dict[str, Any], request: dict[str, Any]) -> str:
    source = request["template"]
    template = cache.get(source)
    if template is None:
        template = env.from_string(source)
        if len(cache) >= _CACHED_TEMPLATES:
            cache.pop(next(iter(cache)))
        cache[source] = template
    env.max_chars = max_chars = int(request["max_chars"])
    parts: list[str] = []
    size = 0
    for chunk in template.generate(**request["context"]):
        size += len(chunk)
        if size > max_chars:
            raise LimitExceeded(f"the output is beyond the bound of {max_chars} characters")
        parts.append(chunk)
    return "".join(parts)


def reply(request: dict[str, Any], env: BoundedEnvironment, cache: dict[str, Any]) -> str:
    try:
        return json.dumps({"text": render(env, cache, request)})
    except TemplateRaised as exc:
        return json.dumps({"error": str(exc), "kind": "raised"})
    except LimitExceeded as exc:
        return json.dumps({"error": str(exc), "kind": "limit"})
    except MemoryError:
        return json.dumps({"error": "it ran out of its memory bound", "kind": "limit"})
    except RecursionError:
        return json.dumps({"error": "recursion too deep", "kind": "limit"})
    except Exception as exc:  # any failure of the template's code: TemplateError, OverflowError...
        text = (str(exc).strip().splitlines() or [""])[0]
        return json.dumps({"error": f"{type(exc).__name__}: {text}", "kind": "template"})


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    limit_memory(int(argv[0]) if argv else 512 << 20)
    env = BoundedEnvironment()
    cache: dict[str, Any] = {}
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            return 2
        out.write(reply(request, env, cache) + "\n")
        out.flush()
    return 0  # stdin closed: the parent is gone


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
