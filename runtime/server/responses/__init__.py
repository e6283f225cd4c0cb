"""OpenAI's Responses API, POST /v1/responses, on the chat path (docs/openai-api.md,
docs/agents.md). Stateless: responses are not kept.

routes.py   the route: body -> one engine request -> a response object or its events
schemas.py  the request body
inputs.py   `instructions` + `input` items -> chat messages
tools.py    function / namespace tools and tool_choice -> a ToolPlan; text.format -> a constraint
objects.py  the response object, its output items and usage
split.py    what of a growing output may stream now (text before a possible tool call)
events.py   the typed server-sent events of `stream: true`
"""
