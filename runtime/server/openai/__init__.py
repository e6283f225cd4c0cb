"""The OpenAI-compatible API (docs/openai-api.md): /v1/completions, /v1/chat/completions,
/v1/embeddings, /v1/models, and vLLM's /tokenize and /detokenize.

routes.py           the /v1 routes: one handler per endpoint
features.py         what a body asks beyond a plain request, decided once per body
tokenize.py         /tokenize, /detokenize
schemas.py          pydantic request / response models (what /openapi.json documents)
content_parts.py    chat content as a list of text parts; any other part type is a 400
unsupported.py      OpenAI fields this server does not implement: refused unless neutral
structured.py       structured-output and tool fields -> the engine's ConstraintSpec
tools/              tool calling: plan, prompt rendering, parsing, streamed calls
controls.py         sampling controls and logprob fields -> SamplingParams fields
generate.py         submit / join / usage helpers shared by the generation routes; one run
streaming.py        server-sent events; a disconnect cancels the request
chunks.py           a streamed choice's chunk (with its logprobs), the streamed 200 in OpenAPI
choices.py          runs prompt batches and n / best_of as engine requests
logprobs.py         the logprobs shapes of completions and chat
choice_logprobs.py  the same per choice of a batch
tenancy.py          the prefix cache's tenants (one per API key) and their tally
response_size.py    a non-streamed body's largest response against max_response_bytes
batch_fit.py        whether a batch's prompts × choices can queue, before any of them does
"""
