#!/bin/sh
# Container entry point: with no model mounted at $FASTLLM_MODEL_PATH, build the tiny demo model
# there first (deterministic: every replica builds the same bytes), then run `fastllm "$@"`.
set -eu
model="${FASTLLM_MODEL_PATH:-/models/default}"
if [ "${1:-serve}" = "serve" ] && [ ! -f "$model/config.json" ]; then
    echo "no model at $model: building the demo model (llama, tiny)" >&2
    fastllm make-demo-model "$model" --arch "${FASTLLM_DEMO_ARCH:-llama}" --size tiny
fi
exec fastllm "$@"
