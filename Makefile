# Two set-up commands (README): `make demo` and `make test`. Both create .venv if missing:
# CPU torch, sglang 0.5.23 without its CUDA dependency set, the pinned minimal dependencies,
# and this package (editable).
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
E2E_STAMP := $(VENV)/.e2e-installed
DEMO_CKPT := test/fixtures/modelslim/q35_dense_w8a8_dynamic
DEMO_REF := test/fixtures/reference/q35_dense_w8a8_dynamic.safetensors

.PHONY: venv demo test test-fast accept bench bench-scaling lint e2e e2e-short e2e-forms e2e-moe \
	e2e-moe-short e2e-hybrid e2e-hybrid-msmodelslim upstream-tree upstream-test upstream-series \
	upstream-lint upstream-py310 upstream-py310-lock

venv: $(STAMP)

# Every install is --no-deps from exact pins (requirements/cpu-lock.txt), so pip resolves
# nothing; -qq keeps pip to errors. The last line says how long it took and what it weighs.
$(STAMP): pyproject.toml requirements/cpu-lock.txt requirements/torch-cpu.txt
	@start=$$(date +%s); set -e; \
	echo "set-up: building $(VENV) (CPU torch, sglang 0.5.23 without its CUDA set, the pinned test set)"; \
	test -x $(VPY) || $(PYTHON) -m venv $(VENV); \
	$(VPY) -m pip install -qq --no-deps -r requirements/torch-cpu.txt; \
	$(VPY) -m pip install -qq --no-deps sglang==0.5.23 -r requirements/cpu-lock.txt; \
	$(VPY) -m pip install -qq --no-deps -e .; \
	touch $(STAMP); \
	echo "set-up: $(VENV) built in $$(( $$(date +%s) - start )) s, $$(du -sh $(VENV) | cut -f1) on disk"

demo: $(STAMP)
	$(VENV)/bin/sglang-mtp-dequant doctor $(DEMO_CKPT)
	$(VENV)/bin/sglang-mtp-dequant verify $(DEMO_CKPT) --reference $(DEMO_REF)

# the whole suite, the e2e harness's own tests among them (they start sglang's server, whose
# imports are in requirements/e2e.txt)
test: $(E2E_STAMP)
	$(VPY) -m pytest -q

# the unit layer alone: formats, naming, plan, ownership; no sglang import (checked), seconds
test-fast: $(STAMP)
	$(VPY) -m pytest -q test/unit

accept: $(STAMP)
	$(VPY) -m pip install -qq --no-deps -r requirements/accept.txt
	$(VPY) benchmarks/accept_length.py --plot docs/accept_length.png --json .cache/accept/results.json

# sglang's own server with EAGLE on the CPU, as users launch it: ONE ModelSlim folder and its
# own MTP head in launch form F1 (flagless: sglang auto-detects ModelSlim for the target, builds
# the draft unquantized; e2e/run.py, e2e/plan.py): the plugin on, off, the draft built quantized,
# the float folder's own MTP, each against its run without speculation; a 512-token generation,
# 8 concurrent requests, plugin/float tokens/s alternated.
# Ends with `e2e accept_length float=F stock=S plugin=P quantized_draft=Q tokens_per_s ... form=F1`.
# FORM=F2 (--quantization modelslim), F3 (--speculative-draft-model-quantization unquant) or F4
# (--speculative-draft-model-quantization modelslim) serves another form.
# Yours: make e2e MODEL=<ModelSlim folder> [FLOAT=<its float folder>]; TP=2 for --tp-size 2;
# the two-folder form: make e2e TARGET=<float folder> DRAFT=<ModelSlim folder of the same model>
E2E_ARGS := $(if $(TARGET),--target $(TARGET)) $(if $(DRAFT),--draft $(DRAFT)) \
	$(if $(MODEL),--model $(MODEL)) $(if $(FLOAT),--float $(FLOAT)) $(if $(TP),--tp-size $(TP)) \
	$(if $(FORM),--form $(FORM))
# With TP set, make e2e runs the five servers and leaves out the extras that do not depend on
# --tp-size (the 512-token generation, the 8-request load test, the alternated tokens/s rounds:
# most of the TP=1 run's time); they stay in the TP=1 run
E2E_EXTRAS := $(if $(TP),--long-tokens 0 --load-requests 0 --perf-rounds 0)
E2E_RUN := $(if $(TP),-tp$(TP))$(if $(FORM),-$(FORM))

$(E2E_STAMP): $(STAMP) requirements/e2e.txt
	$(VPY) -m pip install -qq --no-deps -r requirements/e2e.txt
	touch $(E2E_STAMP)

e2e: $(E2E_STAMP)
	$(VPY) -m e2e $(E2E_ARGS) $(E2E_EXTRAS) --log-dir .cache/e2e/dense$(E2E_RUN) \
		--json .cache/e2e/results$(E2E_RUN).json

# the one-folder form F1 with 2 prompts x 16 tokens (plugin, stock, quantized draft,
# reference): what CI runs at every landing
e2e-short: $(E2E_STAMP)
	$(VPY) -m e2e --short $(E2E_ARGS) --log-dir .cache/e2e/short$(E2E_RUN) \
		--json .cache/e2e/short$(E2E_RUN).json

# the server table of every launch form (e2e/forms.py): per fixture, F1-F4 with the plugin off
# and on, 2 prompts x 16 tokens, against its runs without speculation and the float folder's
# own MTP; each cell an accept length, sglang's start-up error, or the NPU-only piece named.
# FIXTURES="<ModelSlim folder>[=<float folder>] ..." for others (default: the bundled ones)
FIXTURES ?=
e2e-forms: $(E2E_STAMP)
	$(VPY) -m e2e.forms $(FIXTURES) --log-dir .cache/e2e/forms \
		--json .cache/e2e/forms.json --markdown .cache/e2e/forms.md

# the same runs for the bundled hybrid Qwen3.5 (three Gated DeltaNet layers to one full-attention
# layer): sglang's GDN Triton kernels under the interpreter, the float target's tokens also
# against transformers' greedy decode; ends with `e2e-hybrid accept_length float=F ...`
e2e-hybrid: $(E2E_STAMP)
	$(VPY) -m e2e --family hybrid $(E2E_ARGS) \
		--log-dir .cache/e2e/hybrid$(E2E_RUN) --json .cache/e2e/hybrid$(E2E_RUN).json

# transformers' own decode of the hybrid's two W8A8_DYNAMIC exports against its float decode
# and sglang's two targets (started here); ends with `quantized_reference <folder> agree_float=..`
.PHONY: e2e-quantized-reference
e2e-quantized-reference: $(E2E_STAMP)
	for m in hybrid_qwen36_recipe hybrid_w8a8; do \
		$(VPY) -m e2e.quantized_reference --model test/fixtures/e2e/$$m \
			--float test/fixtures/e2e/hybrid_float --serve --log-dir .cache/e2e/qref-$$m \
			--json .cache/e2e/qref-$$m.json || exit 1; \
	done

# the real msmodelslim 26.1.0 (its own venv) on the bundled hybrid: which GDN projections its
# Qwen3.5 and Qwen3.6 recipes quantize; the Qwen3.5 export compared with the bundled one
MS_VENV := .cache/venv-ms
MS_STAMP := $(MS_VENV)/.installed
$(MS_STAMP): test/fixtures/modelslim/_gen/requirements-msmodelslim.txt
	test -x $(MS_VENV)/bin/python || $(PYTHON) -m venv $(MS_VENV)
	$(MS_VENV)/bin/pip install -qq -c requirements/constraints.txt \
		-r test/fixtures/modelslim/_gen/requirements-msmodelslim.txt pillow==13.0.0
	touch $(MS_STAMP)

e2e-hybrid-msmodelslim: $(MS_STAMP)
	$(MS_VENV)/bin/python benchmarks/msmodelslim_hybrid.py \
		--float test/fixtures/e2e/hybrid_float --exporter test/fixtures/e2e/hybrid_w8a8 \
		--work .cache/msmodelslim-hybrid --json .cache/msmodelslim-hybrid/report.json

# the same four servers for the bundled Qwen3.5-MoE (8 routed experts, top-2, shared expert;
# its MTP draft's experts quantized); ends with `e2e-moe accept_length float=F stock=S ...`
e2e-moe: $(E2E_STAMP)
	$(VPY) -m e2e --family moe $(E2E_ARGS) --log-dir .cache/e2e/moe \
		--json .cache/e2e/moe.json

e2e-moe-short: $(E2E_STAMP)
	$(VPY) -m e2e --family moe --short $(E2E_ARGS) --json .cache/e2e/moe-short.json

# the bundled Qwen3.5/3.6 VL exports (test/fixtures/e2e/vl_*: msmodelslim's recipes quantize the
# vision tower, which sglang 0.5.23 builds unquantized) in launch form F1 with EAGLE, plugin on
# and off, against their float VL folder: text accept length and one image request per
# test/fixtures/e2e/vl_images/*.png (e2e/vl.py); ends with `e2e-vl passed`
.PHONY: e2e-vl
e2e-vl: $(E2E_STAMP)
	$(VPY) -m e2e.vl --log-dir .cache/e2e/vl --json .cache/e2e/vl.json

# the vision tower's bytes at the released models' shapes, decoded to bf16 or held int8;
# ends with `vision_memory <model> bf16=B int8=I extra=E tower=T (MiB ...)` per model
.PHONY: bench-vision-memory
bench-vision-memory: $(STAMP)
	$(VPY) benchmarks/vision_memory.py --json .cache/bench/vision_memory.json

# decode cost against a plain cast (R), codes decoded per EP=2 rank (F), extra peak memory (M);
# ends with `dequant_vs_cast_ratio R ep2_rank_decode_fraction F peak_extra_mb M`
bench: $(STAMP)
	$(VPY) benchmarks/bench_dequant.py --json .cache/bench/results.json

# plugin vs stock load and doctor time for 64..512 experts in one shard
bench-scaling: $(STAMP)
	$(VPY) benchmarks/bench_scaling.py --json .cache/bench/scaling.json

# sglang's own draft load, stock vs plugin, behind 0..400,000 target tensors in other shards;
# ends with `draft_load plugin_vs_stock_200000 R plugin_400000_vs_plugin_0 F`
.PHONY: bench-draft-load
bench-draft-load: $(STAMP)
	$(VPY) benchmarks/bench_draft_load.py --json .cache/bench/draft_load.json

# sglang's server start-up with the plugin on and off (alternated pairs) on the Qwen3.5-recipe
# hybrid export; ends with `startup hybrid_w8a8 pairs N ready_s on=min/median off=min/median ..`
.PHONY: bench-startup
bench-startup: $(E2E_STAMP)
	$(VPY) benchmarks/bench_startup.py --json .cache/bench/startup.json

# the sglang release matrix (compat/run.py): one small venv per release over .venv (that
# sglang wheel --no-deps, its transformers pin), the activation, dense-scheme, guard and
# release tests, load_plugins() in a fresh process, doctor and verify on a fixture; one line
# per release. COMPAT_RELEASES="0.5.14 0.5.18 0.5.23" for some; default: every tested release
.PHONY: compat
COMPAT_RELEASES ?=
COMPAT_FLAGS ?=
compat: $(E2E_STAMP)
	$(VPY) compat/run.py $(COMPAT_RELEASES) $(COMPAT_FLAGS) --json .cache/compat/results.json

# ruff (lint + format check) and mypy, every function annotated (pyproject.toml [tool.mypy])
LINT_STAMP := $(VENV)/.lint-installed

$(LINT_STAMP): $(STAMP) requirements/lint.txt
	$(VPY) -m pip install -qq --no-deps -r requirements/lint.txt
	touch $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check python test benchmarks upstream e2e compat
	$(VENV)/bin/ruff format --check python test benchmarks upstream e2e compat
	$(VENV)/bin/mypy python/sglang_mtp_dequant

# -- the fix as a stack of sglang pull requests (upstream/BASE, upstream/series/, upstream/stack/)
UPSTREAM_REPO := .cache/upstream/sglang
# The end-to-end server run against the patched tree in step 01's launch (F1: one ModelSlim
# folder, no quantization flag, EAGLE 3/1/4): sglang's own server with EAGLE on the CPU, the
# branch's tree serving with the plugin off, beside stock sglang and the float folder's own MTP
# (make e2e's harness, 2 prompts x 16 tokens; stock <= 1.3, branch >= 0.97 x float checked).
# `make upstream-test UPSTREAM_E2E=` skips it (the step says so).
UPSTREAM_E2E ?= $(VPY) -m e2e --short --upstream-tree $(UPSTREAM_REPO) --form F1 --log-dir .cache/e2e/upstream --json .cache/e2e/upstream.json

# the pinned wheel (sha256 checked) -> a git repo whose first commit is its sglang/ at
# python/sglang/ -> upstream/series/*.patch applied by git am; reuses what is current
upstream-tree: $(STAMP)
	$(VPY) upstream/tree.py tree --repo $(UPSTREAM_REPO) --python $(VPY)

# sglang's test harness imports datasets (CustomTestCase): requirements/upstream-test.txt
UPSTREAM_STAMP := $(VENV)/.upstream-installed
$(UPSTREAM_STAMP): $(STAMP) requirements/upstream-test.txt
	$(VPY) -m pip install -qq --no-deps -r requirements/upstream-test.txt
	touch $(UPSTREAM_STAMP)

# sglang's own lint tools, pinned, in their own venv (requirements/upstream-lint.txt)
UPSTREAM_LINT_VENV := .cache/upstream-lint-venv
UPSTREAM_LINT_STAMP := $(UPSTREAM_LINT_VENV)/.installed
$(UPSTREAM_LINT_STAMP): requirements/upstream-lint.txt
	test -x $(UPSTREAM_LINT_VENV)/bin/python || $(PYTHON) -m venv $(UPSTREAM_LINT_VENV)
	$(UPSTREAM_LINT_VENV)/bin/python -m pip install -qq --no-deps -r requirements/upstream-lint.txt
	touch $(UPSTREAM_LINT_STAMP)

# sglang's CPU CI stage as closely as it can exist here (upstream/README.md, "Python 3.10, as
# sglang's CPU CI"): CPython 3.10 from pyenv, python[dev] of the 0.5.23 wheel as uv resolves it
# for 3.10 (requirements/upstream-py310.txt, CUDA torch from PyPI included), installed by uv
# (the installer that stage uses; uv's cache is reused). Rebuilt only when the lock changes.
PYTHON310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python) python3.10)
UV_VERSION := 0.13.8
UV_VENV := .cache/upstream-uv
UV := $(UV_VENV)/bin/uv
PY310_VENV := .cache/upstream-py310-venv
PY310_STAMP := $(PY310_VENV)/.installed
$(UV):
	test -x $(UV_VENV)/bin/python || $(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install -qq uv==$(UV_VERSION)
$(PY310_STAMP): requirements/upstream-py310.txt | $(UV)
	@start=$$(date +%s); set -e; \
	echo "upstream-py310: building $(PY310_VENV) ($(PYTHON310), requirements/upstream-py310.txt)"; \
	export UV_PYTHON_DOWNLOADS=never; \
	test -x $(PY310_VENV)/bin/python || $(UV) venv -q --python $(PYTHON310) $(PY310_VENV); \
	$(UV) pip sync -q --python $(PY310_VENV)/bin/python requirements/upstream-py310.txt; \
	touch $(PY310_STAMP); \
	echo "upstream-py310: built in $$(( $$(date +%s) - start )) s, $$(du -sh $(PY310_VENV) | cut -f1) on disk"
upstream-py310: $(PY310_STAMP)

# rewrite requirements/upstream-py310.txt from the wheel's METADATA (upstream/py310_deps.py)
upstream-py310-lock: upstream-tree | $(UV)
	UV_PYTHON_DOWNLOADS=never $(VPY) upstream/py310_deps.py lock --uv $(UV) --python $(PYTHON310)

# isort, ruff, ruff format, codespell and the registered-test rules on what the stack touches
upstream-lint: upstream-tree $(UPSTREAM_LINT_STAMP)
	$(VPY) upstream/lint.py --repo $(UPSTREAM_REPO) --tools $(UPSTREAM_LINT_VENV)

# PR 1 alone, then the whole stack: sglang's collect_tests + run_unittest_files on the
# registered tests (plugin off), the same tests red on the baseline, fixtures bit-identical to
# the plugin; then UPSTREAM_E2E on the whole stack
upstream-test: upstream-tree upstream-lint $(E2E_STAMP) $(UPSTREAM_STAMP) $(PY310_STAMP)
	UPSTREAM_E2E='$(UPSTREAM_E2E)' $(VPY) upstream/run_tests.py --repo $(UPSTREAM_REPO)

# after committing on the tree's branch (and moving its step/* tags): rewrite upstream/series/
# and upstream/stack/*/ from it
upstream-series:
	$(VPY) upstream/tree.py export --repo $(UPSTREAM_REPO)
