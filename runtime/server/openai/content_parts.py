"""Chat content may be a list of parts (what current OpenAI SDK examples, LangChain and benchmark
tools send): `[{"type": "text", "text": "..."}, ...]`. Text parts are joined with a newline, as
vLLM joins them; any other part type (image_url, input_audio, file, ...) is a 400 naming the type,
since this server runs text models only.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from runtime.server.openai.unsupported import UNSUPPORTED

MAX_PARTS = 256


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


def refuse_other_parts(value: Any) -> Any:
    if isinstance(value, list):
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise PydanticCustomError(
                    UNSUPPORTED,
                    "content part type '{part_type}' is not supported by this server "
                    "(only text parts)",
                    {"field": "messages", "part_type": kind[:64]},
                )
    return value


ContentParts = Annotated[
    list[TextPart], Field(min_length=1, max_length=MAX_PARTS), BeforeValidator(refuse_other_parts)
]
