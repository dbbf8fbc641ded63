# Two set-up commands (README): `make demo` and `make test`. Both create .venv if missing:
# CPU torch, sglang 0.5.23 without its CUDA dependency set, the pinned minimal dependencies,
# and this package (editable).
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_CKPT := test/fixtures/modelslim/q35_dense_w8a8_dynamic
DEMO_REF := test/fixtures/reference/q35_dense_w8a8_dynamic.safetensors

.PHONY: venv demo test accept bench bench-scaling lint upstream-tree upstream-test upstream-series

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

# -- the fix as a feature branch of sglang's own tree (upstream/BASE, upstream/series/) -------
UPSTREAM_REPO := .cache/upstream/sglang
# The end-to-end server run against the patched tree (benchmarks/e2e/) plugs in here: a shell
# command, run by `make upstream-test` with the tree first on PYTHONPATH, SGLANG_PLUGINS=none
# and UPSTREAM_TREE set. Empty: that step says it did not run.
UPSTREAM_E2E ?=

# the pinned wheel (sha256 checked) -> a git repo whose first commit is its sglang/ at
# python/sglang/ -> upstream/series/*.patch applied by git am; reuses what is current
upstream-tree: $(STAMP)
	$(VPY) upstream/tree.py tree --repo $(UPSTREAM_REPO) --python $(VPY)

# sglang's collect_tests + run_unittest_files on the branch's registered tests (plugin off),
# the same tests red on the baseline, fixtures bit-identical to the plugin, then UPSTREAM_E2E
upstream-test: upstream-tree
	UPSTREAM_E2E='$(UPSTREAM_E2E)' $(VPY) upstream/run_tests.py --repo $(UPSTREAM_REPO)

# after committing on the tree's branch: rewrite upstream/series/ from it
upstream-series:
	$(VPY) upstream/tree.py export --repo $(UPSTREAM_REPO)
