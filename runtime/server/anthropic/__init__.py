"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), translated
onto the chat path: the same template, tool rendering and constraints as /v1/chat/completions.

    schemas.py     the request bodies (what is accepted, what is ignored)
    translate.py   a body -> chat messages, a ToolPlan, the prompt's ids and sampling params
    tools.py       tools + tool_choice -> the chat path's ToolPlan, and the constraint
    fit_schema.py  a tool's input_schema reduced to what the grammar engine takes
    reply.py       an output -> content blocks, stop_reason, usage
    stream.py      the server-sent event sequence
    openapi.py     the response bodies and error statuses /openapi.json documents
    errors.py      Anthropic's error shape and status codes (no server imports: the edge and
                   runtime.server.errors dispatch on the path with it)
    auth.py        `x-api-key` beside `Authorization: Bearer`
    routes.py      the two routes

This module imports nothing, so the edge can import `errors` without the routes.
"""
