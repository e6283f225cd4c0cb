"""What one constraint may cost: its size (checked on the request thread, a 400 naming the field)
and its compile (time and memory in a worker process that is killed past either, rules.py and
pool.py), the compile workers and each tenant's share of them, and the compiled-grammar cache's
byte bound. Built from the server settings (`grammar_*`); the defaults serve tests and tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import ConfigError

__all__ = ["GrammarLimits"]


@dataclass(frozen=True)
class GrammarLimits:
    compile_timeout_s: float = 10.0  # one compile's wall time in its worker; then it is killed
    compile_max_memory_bytes: int = 1 << 30  # the worker's RSS during a compile; then killed
    num_workers: int = 2  # compile worker processes
    workers_per_tenant: int = 1  # compiles one tenant (API key, or client address) runs at once
    cache_max_bytes: int = 64 << 20  # compiled grammars kept, by their measured heap bytes
    max_regex_chars: int = 4096  # a regex constraint, and each schema `pattern`
    max_schema_bytes: int = 64 << 10  # a JSON Schema's canonical text
    max_schema_properties: int = 1024  # `properties` entries over the whole schema
    max_schema_depth: int = 32  # nested subschemas
    max_grammar_rules: int = 1024  # `::=` rules of an EBNF grammar
    max_grammar_bytes: int = 64 << 10  # an EBNF grammar's text

    def __post_init__(self) -> None:
        if self.compile_timeout_s <= 0:
            raise ConfigError("grammar_compile_timeout_s must be positive", param="grammar")
        if self.num_workers < 1 or not 1 <= self.workers_per_tenant <= self.num_workers:
            raise ConfigError(
                "need 1 <= grammar_compile_workers_per_tenant <= grammar_compile_workers",
                param="grammar_compile_workers_per_tenant",
            )

    @classmethod
    def from_settings(cls, settings: Any) -> GrammarLimits:
        default = cls()
        return cls(
            **{
                name: getattr(settings, f"grammar_{setting}", getattr(default, name))
                for name, setting in _SETTINGS.items()
            }
        )


# field -> its setting's name after `grammar_` (runtime.config)
_SETTINGS = {
    "compile_timeout_s": "compile_timeout_s",
    "compile_max_memory_bytes": "compile_max_memory_bytes",
    "num_workers": "compile_workers",
    "workers_per_tenant": "compile_workers_per_tenant",
    "cache_max_bytes": "cache_max_bytes",
    "max_regex_chars": "max_regex_chars",
    "max_schema_bytes": "max_schema_bytes",
    "max_schema_properties": "max_schema_properties",
    "max_schema_depth": "max_schema_depth",
    "max_grammar_rules": "max_rules",
    "max_grammar_bytes": "max_grammar_bytes",
}
