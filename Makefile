# Two set-up commands (README): `make demo` and `make test`. Both create .venv if missing:
# CPU torch, sglang 0.5.23 without its CUDA dependency set, the pinned minimal dependencies,
# and this package (editable).
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_CKPT := test/fixtures/modelslim/q35_dense_w8a8_dynamic
DEMO_REF := test/fixtures/reference/q35_dense_w8a8_dynamic.safetensors

.PHONY: venv demo test accept bench bench-scaling lint e2e e2e-short e2e-moe e2e-moe-short

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/cpu.txt requirements/constraints.txt requirements/torch-cpu.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q -r requirements/torch-cpu.txt
	$(VPY) -m pip install -q --no-deps sglang==0.5.23
	$(VPY) -m pip install -q -c requirements/constraints.txt -r requirements/cpu.txt
	$(VPY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sglang-mtp-dequant doctor $(DEMO_CKPT)
	$(VENV)/bin/sglang-mtp-dequant verify $(DEMO_CKPT) --reference $(DEMO_REF)

test: $(STAMP)
	$(VPY) -m pytest -q

accept: $(STAMP)
	$(VPY) -m pip install -q -c requirements/constraints.txt -r requirements/accept.txt
	$(VPY) benchmarks/accept_length.py --plot docs/accept_length.png --json .cache/accept/results.json

# sglang's own server with EAGLE on the CPU, four servers: no speculation, float draft,
# ModelSlim W8A8 draft with the plugin off, and on (benchmarks/e2e_server.py); ends with
# `e2e accept_length float=F stock=S plugin=P tokens_per_s ...`. Your own folders:
# make e2e TARGET=<float folder> DRAFT=<ModelSlim folder of the same model>
E2E_STAMP := $(VENV)/.e2e-installed
E2E_ARGS := $(if $(TARGET),--target $(TARGET)) $(if $(DRAFT),--draft $(DRAFT))

$(E2E_STAMP): $(STAMP) requirements/e2e.txt
	$(VPY) -m pip install -q --no-deps -r requirements/e2e.txt
	touch $(E2E_STAMP)

e2e: $(E2E_STAMP)
	$(VPY) benchmarks/e2e_server.py $(E2E_ARGS) --json .cache/e2e/results.json

# the same with 2 prompts x 16 tokens: what CI runs at every landing
e2e-short: $(E2E_STAMP)
	$(VPY) benchmarks/e2e_server.py --short $(E2E_ARGS) --json .cache/e2e/short.json

# the same four servers for the bundled Qwen3.5-MoE (8 routed experts, top-2, shared expert;
# its MTP draft's experts quantized); ends with `e2e-moe accept_length float=F stock=S ...`
e2e-moe: $(E2E_STAMP)
	$(VPY) benchmarks/e2e_server.py --family moe $(E2E_ARGS) --json .cache/e2e/moe.json

e2e-moe-short: $(E2E_STAMP)
	$(VPY) benchmarks/e2e_server.py --family moe --short $(E2E_ARGS) --json .cache/e2e/moe-short.json

# decode cost against a plain cast (R), codes decoded per EP=2 rank (F), extra peak memory (M);
# ends with `dequant_vs_cast_ratio R ep2_rank_decode_fraction F peak_extra_mb M`
bench: $(STAMP)
	$(VPY) benchmarks/bench_dequant.py --json .cache/bench/results.json

# plugin vs stock load and doctor time for 64..512 experts in one shard
bench-scaling: $(STAMP)
	$(VPY) benchmarks/bench_scaling.py --json .cache/bench/scaling.json

lint: $(STAMP)
	$(VPY) -m pip install -q ruff
	$(VENV)/bin/ruff check python test benchmarks
	$(VENV)/bin/ruff format --check python test benchmarks
