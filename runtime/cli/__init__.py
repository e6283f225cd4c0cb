"""`fastllm` command line. Each verb lives in its own module exposing a click `command`
(or group); this file only assembles them and turns typed errors into a message + exit code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from runtime.errors import FastllmError

# verb module -> attribute. Each verb's module is imported lazily so `fastllm --help` stays fast
# and a heavy dependency (torch, sqlalchemy) loads only for the verbs that need it.
VERBS: dict[str, str] = {
    "serve": "runtime.cli.serve",
    "generate": "runtime.cli.generate",
    "embed": "runtime.cli.embed",
    "make-demo-model": "runtime.cli.demo",
    "convert": "runtime.cli.convert",
    "audit": "runtime.cli.audit",
    "db": "runtime.cli.db",
    "alerts": "runtime.cli.alerts",
    "dashboards": "runtime.cli.dashboards",
    "doctor": "runtime.cli.doctor",
    "bench": "runtime.cli.bench",
    "rollout": "runtime.cli.rollout",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in VERBS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = VERBS.get(cmd_name)
        if module_name is None or not _module_exists(module_name):
            return None
        module = importlib.import_module(module_name)
        command: click.Command = module.command
        return command


def _module_exists(module_name: str) -> bool:
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fastllm-stack")
def cli() -> None:
    """fastllm: an observability-first LLM inference stack.

    \b
    Example:
      fastllm make-demo-model demo-models/llama-tiny --arch llama
      fastllm generate --model demo-models/llama-tiny "Hello"
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point: typed errors become `error: ...` on stderr and exit code 2."""
    if argv is None:  # the process's own command line: `serve` may re-execute it on jemalloc
        from runtime.memory.host_malloc import allow_reexec

        allow_reexec()
    try:
        rc = cli.main(args=argv, standalone_mode=False)
        # in non-standalone mode click returns ctx.exit(code) values instead of exiting
        if isinstance(rc, int) and rc != 0:
            sys.exit(rc)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.UsageError as exc:  # one line naming the option (no usage block)
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except FastllmError as exc:
        # one line: a wrapped driver error's SQL and background link stay out of it
        click.echo(f"error: {(exc.message.strip().splitlines() or [''])[0]}", err=True)
        sys.exit(2)
    except Exception as exc:  # the environment's own errors: one line too (runtime.cli.failures)
        from runtime.cli.failures import describe, is_debug

        line = describe(exc)
        if line is None or is_debug():
            raise
        click.echo(f"error: {line}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
