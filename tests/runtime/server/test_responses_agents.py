"""The OpenAI Agents SDK runs an agent with one function tool through `OpenAIResponsesModel`
against a live server on the tiny random llama: the first turn is a forced call (the weights are
random), the SDK runs the tool, sends its output back as a `function_call_output` item, and the
run ends with the model's answer in the agent's output type (a random model's free text would
rarely end before max_tokens, and the SDK treats an incomplete response as a failure). Tracing
is off (nothing leaves the machine)."""

from __future__ import annotations

import asyncio
from typing import Literal

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.runtime.server.live import API_KEY, LiveServer


class Forecast(BaseModel):  # the agent's output type: a JSON schema the answer must follow
    sunny: bool
    city: Literal["Paris", "Oslo", "Lima"]


def test_an_agent_with_one_tool_runs_to_completion(served: LiveServer) -> None:
    cities: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"sunny in {city}"

    async def run() -> object:
        client = AsyncOpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0)
        async with client:
            agent = Agent(
                name="forecaster",
                instructions="Answer with the weather.",
                tools=[get_weather],
                output_type=Forecast,
                model=OpenAIResponsesModel(model="llama", openai_client=client),
                # forced on the first turn; the SDK resets tool_choice after a call
                model_settings=ModelSettings(tool_choice="get_weather", max_tokens=60),
            )
            config = RunConfig(tracing_disabled=True)
            return await Runner.run(agent, "Weather in Oslo?", max_turns=4, run_config=config)

    result = asyncio.run(run())
    assert len(cities) >= 1 and cities[0] in ("Paris", "Oslo", "Lima")
    kinds = [type(item) for item in result.new_items]  # type: ignore[attr-defined]
    assert kinds[:2] == [ToolCallItem, ToolCallOutputItem]
    assert kinds[-1] is MessageOutputItem
    assert isinstance(result.final_output, Forecast)  # type: ignore[attr-defined]
    (first, *rest) = result.raw_responses  # type: ignore[attr-defined]
    assert first.output[0].type == "function_call" and rest
