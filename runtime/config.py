"""The one settings object. Precedence: CLI flags (init kwargs) > FASTLLM_* environment > YAML file
(`FASTLLM_CONFIG` or `--config`) > the embedded defaults below.

Embedded defaults run everything in one process: SQLite file, in-process alert evaluator,
tracing off unless OTEL_EXPORTER_OTLP_ENDPOINT is set, the demo model built locally. The fields
are declared by area in runtime/settings/; this module combines them, checks across areas, reads
the sources and turns an invalid value into one ConfigError.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, get_origin

from pydantic import ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from runtime.errors import ConfigError
from runtime.settings.engine import EngineSettings, band_for
from runtime.settings.model import ModelSettings
from runtime.settings.server import ServerSettings
from runtime.settings.telemetry import TelemetrySettings


class _EnvSource(EnvSettingsSource):
    """FASTLLM_* variables; a list setting takes JSON (`["a","b"]`) or a comma list (`a,b`)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            if isinstance(value, str) and get_origin(field.annotation) is list:
                return [part.strip() for part in value.split(",") if part.strip()]
            raise


class Settings(ModelSettings, EngineSettings, ServerSettings, TelemetrySettings, BaseSettings):
    """Every setting: the fields by area in runtime/settings/ (model, engine, server,
    telemetry); here the checks across areas and the sources."""

    model_config = SettingsConfigDict(env_prefix="FASTLLM_", extra="forbid", validate_default=True)

    @model_validator(mode="after")
    def _check_speculation(self) -> Settings:
        if self.speculative_method == "self_draft" and self.quantization == (
            self.speculative_draft_quant
        ):
            raise ValueError(
                f"speculative_method=self_draft with quantization={self.quantization}: the draft "
                f"(speculative_draft_quant={self.speculative_draft_quant}) would be the served "
                "weights"
            )
        return self

    @model_validator(mode="after")
    def _check_band(self) -> Settings:
        if self.batch_goal is not None:  # the goal names a band (runtime.config)
            self.min_util, self.max_util = band_for(self.batch_goal)
        if self.min_util >= self.max_util:
            raise ValueError(f"min_util ({self.min_util}) must be below max_util ({self.max_util})")
        if not self.min_num_seqs <= self.max_num_seqs:
            raise ValueError("min_num_seqs must not exceed max_num_seqs")
        if self.grammar_compile_workers_per_tenant > self.grammar_compile_workers:
            raise ValueError(
                "grammar_compile_workers_per_tenant must not exceed grammar_compile_workers"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _EnvSource(settings_cls)  # same prefix and options as the default one
        sources: list[PydanticBaseSettingsSource] = [init_settings, env]
        yaml_path = os.environ.get("FASTLLM_CONFIG")
        if yaml_path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_path))
        return tuple(sources)


def check_settings_file(path: str | Path) -> None:
    """The --config file (FASTLLM_CONFIG) is readable YAML holding one mapping: anything else
    would surface as a YAML traceback or a TypeError from deep inside pydantic-settings."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})", param="config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--config {path}: malformed YAML{at}", param="config") from None
    if data is not None and not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(
            f"--config {path}: expected a mapping of settings, got a YAML {kind}", param="config"
        )


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings; `overrides` are CLI flags (None values are ignored so defaults apply).
    An invalid value from any source is a ConfigError naming the setting and its variable."""
    flags = {k: v for k, v in overrides.items() if v is not None}
    if config_file is None:
        return _validated(flags)
    previous = os.environ.get("FASTLLM_CONFIG")
    os.environ["FASTLLM_CONFIG"] = str(config_file)
    try:
        return _validated(flags)
    finally:
        if previous is None:
            os.environ.pop("FASTLLM_CONFIG", None)
        else:
            os.environ["FASTLLM_CONFIG"] = previous


def _validated(flags: dict[str, Any]) -> Settings:
    yaml_path = os.environ.get("FASTLLM_CONFIG")
    if yaml_path:
        check_settings_file(yaml_path)
    try:
        return Settings(**flags)
    except SettingsError as exc:  # a value a source could not even decode (e.g. bad JSON)
        found = re.search(r'field "(\w+)"', str(exc))
        name = found.group(1) if found else "?"
        raise ConfigError(
            f"invalid setting {name} (FASTLLM_{name.upper()}, --config YAML or flag): {exc}",
            param=name,
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"]]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = str(first["msg"]).removeprefix("Value error, ")
        if not loc:  # a check across settings (model validator)
            raise ConfigError(f"invalid settings: {message}{more}") from None
        name, item = loc[0], "".join(f"[{part}]" for part in loc[1:])
        raise ConfigError(
            f"invalid setting {name}{item} (FASTLLM_{name.upper()}, --config YAML or flag): "
            f"{message}, got {first.get('input')!r}{more}",
            param=name,
        ) from None
