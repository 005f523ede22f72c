# shardstream developer/CI entry points.  Run `make help` for the list.
#
# Everything Python runs inside ./.venv, created with --system-site-packages so a
# machine-wide torch (multi-GB) is reused; on a bare machine pip installs it from
# the `test` extra of pyproject.toml.  The Rust extension is built by maturin in the
# release profile; CARGO_TARGET_DIR is honoured if set (cargo and maturin read it).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-print-directory

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
VENV_ABS    := $(abspath $(VENV))
CARGO       ?= cargo
PIP_FLAGS   ?= --disable-pip-version-check
PYTEST_ARGS ?= -q -p no:cacheprovider
CARGO_TEST_ARGS ?=
BENCH_ARGS  ?=
DEMO_ARGS   ?=
STUBTEST_ARGS ?=
# Directories checked by ruff.
PY_DIRS     := $(wildcard python tests benches build_backend)

# pyo3's build script must see the same interpreter for every cargo invocation
# (cargo test/clippy and maturin), otherwise it reconfigures and rebuilds pyo3.
export PYO3_PYTHON := $(VENV_ABS)/bin/python

# maturin: the venv's copy if pip put one there, else the machine-wide one that the
# venv sees through --system-site-packages (`python -m maturin` needs the script).
MATURIN = "$$( [ -x $(VENV)/bin/maturin ] && echo $(VENV)/bin/maturin || command -v maturin )"

# Stamps: bootstrap done once per pyproject.toml change; extension rebuilt when any
# Rust source / manifest is newer than the last build.
BOOT_STAMP := $(VENV)/.shardstream-bootstrap
EXT_STAMP  := $(VENV)/.shardstream-ext
LINT_STAMP := $(VENV)/.shardstream-lint-deps
BENCH_STAMP := $(VENV)/.shardstream-bench-deps
RUST_SRC   := Cargo.toml Cargo.lock pyproject.toml \
              $(shell find rust -type f \( -name '*.rs' -o -name 'Cargo.toml' -o -name 'build.rs' \) 2>/dev/null)

.PHONY: help
help: ## Show this help
	@echo "shardstream — make targets (fresh machine: 'make demo' then 'make test')"
	@echo
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'
	@echo
	@echo "Variables: PYTHON=$(PYTHON) VENV=$(VENV) PYTEST_ARGS='$(PYTEST_ARGS)'"
	@echo "           CARGO_TEST_ARGS='$(CARGO_TEST_ARGS)' BENCH_ARGS='$(BENCH_ARGS)' DEMO_ARGS='$(DEMO_ARGS)'"
	@echo "           CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-<default: ./target>}"

# --------------------------------------------------------------------------- setup

# The release extension is built as the release wheel is (the backend's -C release-wheel=true:
# zig, manylinux2014, stripped), with the same cargo command, so `make test-wheel`'s wheel
# build finds it built instead of compiling everything a second time for another linker.
EDITABLE_INSTALL = $(PY) -m pip install $(PIP_FLAGS) --no-build-isolation -C release-wheel=true
# What the backend asks for on top of maturin (ziglang, on glibc Linux): installed into the venv,
# since builds here run without isolation (no download per build).
define install_build_requires
	@reqs=$$($(PY) -c 'import sys; sys.path.insert(0, "build_backend"); import shardstream_backend as b; print(*b.get_requires_for_build_wheel(), sep="\n")'); \
	if [ -n "$$reqs" ]; then \
	  mapfile -t r <<< "$$reqs"; echo ">>> build requirements: $${r[*]}"; \
	  $(PY) -m pip install $(PIP_FLAGS) -q "$${r[@]}"; \
	fi
endef

$(BOOT_STAMP): pyproject.toml build_backend/shardstream_backend.py
	@echo ">>> bootstrap: $(VENV) (system site packages visible) + pip install -e '.[test]'"
	@test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@# maturin is the PEP 517 backend; having it in (or visible to) the venv lets us
	@# build without an isolated build env and lets `make build-dev` call it directly.
	$(PY) -m pip install $(PIP_FLAGS) -q 'maturin>=1.9,<2'
	$(install_build_requires)
	$(EDITABLE_INSTALL) -e '.[test]'
	@touch $(EXT_STAMP) $@

.PHONY: venv
venv: $(BOOT_STAMP) ## Create .venv and install shardstream (editable) + test deps, once

$(EXT_STAMP): $(BOOT_STAMP) $(RUST_SRC)
	@echo ">>> rebuilding the Rust extension in place (release, as the wheel is built)"
	$(EDITABLE_INSTALL) --no-deps -e .
	@touch $@

.PHONY: build
build: $(EXT_STAMP) ## (Re)build the Rust extension if Rust sources changed (no-op otherwise)

.PHONY: build-dev
build-dev: $(BOOT_STAMP) ## Quick build for the edit/test loop (profile dev-opt: our crates -O1, dependencies -O3); `make build` restores release
	VIRTUAL_ENV=$(VENV_ABS) $(MATURIN) develop --profile dev-opt --skip-install
	@rm -f $(EXT_STAMP)

.PHONY: rebuild
rebuild: $(BOOT_STAMP) ## Force a rebuild of the Rust extension
	@rm -f $(EXT_STAMP)
	@$(MAKE) build

# --------------------------------------------------------------------------- test

.PHONY: test
test: test-rust test-py test-wheel ## Run all tests: cargo test, pytest, then pytest against the built wheel

.PHONY: test-rust
test-rust: $(BOOT_STAMP) ## Rust tests (cargo test --workspace)
	@# Test binaries of the bindings crate may link libpython; cargo does not put
	@# search paths outside the target dir on LD_LIBRARY_PATH, so add Python's LIBDIR.
	LD_LIBRARY_PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \
	  $(CARGO) test --workspace $(CARGO_TEST_ARGS)

.PHONY: test-py
test-py: build ## Python tests (pytest tests); "no tests collected" is a failure
	@rc=0; $(PY) -m pytest $(PYTEST_ARGS) tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$rc

# --------------------------------------------------------------------------- run

.PHONY: demo
demo: build ## Run the resume demo (python -m shardstream demo $(DEMO_ARGS))
	$(PY) -m shardstream demo $(DEMO_ARGS)

# The `bench` extra of pyproject.toml (keep in sync): HF datasets, Grain and trl baselines.
# Installed once; if pip fails (offline) the bench runs and prints those rows as skipped.
$(BENCH_STAMP): $(BOOT_STAMP)
	@if $(PY) -m pip install $(PIP_FLAGS) -q 'datasets>=2.18' 'grain>=0.2.18' 'trl>=1.16'; then touch $@; \
	else echo "warning: could not install the bench extra; those benchmark rows will be skipped" >&2; fi

.PHONY: bench
bench: build $(BENCH_STAMP) ## Run the benchmarks on a quiet machine, print their tables (docs/benchmarks.md; BENCH_ARGS='--help')
	$(PY) benches/bench.py $(BENCH_ARGS)

.PHONY: bench-quick
bench-quick: build ## Every benchmark section at small sizes, one run each: a smoke run, not figures (BENCH_ARGS too)
	$(PY) benches/bench.py --quick $(BENCH_ARGS)

.PHONY: bench-mapstyle
bench-mapstyle: build $(BENCH_STAMP) ## Map-style benchmark: ParquetRows random access vs HF datasets / pyarrow take, shuffle quality, the sampler at 10^9 rows, resume (MAPSTYLE_ARGS='--quick')
	$(PY) benches/mapstyle.py $(MAPSTYLE_ARGS)

.PHONY: bench-pack
bench-pack: build $(BENCH_STAMP) ## Token packing benchmark: vs numpy, Grain, trl; resume; DataLoader; mixture (PACK_ARGS='--quick', '--only callgrind')
	$(PY) benches/pack.py $(PACK_ARGS)

.PHONY: bench-s3
bench-s3: build $(BENCH_STAMP) ## Object-store benchmark over a local moto S3 server (BENCH_S3_ARGS='--quick')
	$(PY) benches/bench_s3.py $(BENCH_S3_ARGS)

# --------------------------------------------------------------------------- lint

$(LINT_STAMP): $(BOOT_STAMP)
	$(PY) -m pip install $(PIP_FLAGS) -q 'ruff>=0.6' 'mypy>=1.11'
	@touch $@

.PHONY: lint
lint: lint-rust lint-py lint-stubs ## All linters (use `make -k lint` to see every failure)

.PHONY: lint-rust
lint-rust: $(BOOT_STAMP) ## cargo fmt --check + clippy -D warnings
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: lint-py
lint-py: $(LINT_STAMP) ## ruff check + ruff format --check
	$(PY) -m ruff check $(PY_DIRS)
	$(PY) -m ruff format --check $(PY_DIRS)

.PHONY: lint-stubs
lint-stubs: build $(LINT_STAMP) ## mypy stubtest: _core.pyi / package vs the built extension
	@# pyarrow/torchdata ship no type stubs; without this mypy refuses to build at all.
	@printf '[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n' > $(VENV)/stubtest-mypy.ini
	$(PY) -m mypy.stubtest shardstream --mypy-config-file $(VENV)/stubtest-mypy.ini $(STUBTEST_ARGS)

.PHONY: fmt
fmt: $(LINT_STAMP) ## Auto-format Rust and Python sources
	$(CARGO) fmt --all
	$(PY) -m ruff format $(PY_DIRS)
	$(PY) -m ruff check --fix $(PY_DIRS)

# --------------------------------------------------------------------------- package

DIST_DIR    ?= dist
# Release wheels are built the way `pip wheel .` / `pip install .` build them: through the PEP 517
# backend of pyproject.toml (build_backend/shardstream_backend.py = maturin's, plus, on glibc
# Linux, the maturin arguments of [tool.shardstream.linux-wheel]): zig links the extension against
# glibc 2.17, giving one abi3 (CPython >= 3.10) manylinux2014 wheel, stripped; maturin's
# --auditwheel check fails the build rather than tag a wheel that needs more (or a library outside
# the manylinux set). WHEEL_BUILD_ARGS='...' replaces those arguments, e.g.
# WHEEL_BUILD_ARGS='--compatibility pypi --strip' for this machine's linker and glibc.
WHEEL_BUILD_ARGS ?=
# maturin warns on every run (develop, sdist too) that build-backend is not "maturin"; the
# project's backend is maturin's with release-wheel arguments.
export MATURIN_NO_MISSING_BUILD_BACKEND_WARNING := 1
PIP_WHEEL = $(PY) -m pip wheel $(PIP_FLAGS) --no-build-isolation --no-deps -v \
            $(if $(WHEEL_BUILD_ARGS),--config-settings 'maturin.build-args=$(WHEEL_BUILD_ARGS)')
# What test-wheel runs against the installed wheel: what the wheel's own build (zig linker,
# manylinux2014, stripped) could change -- the API over every codec and format, the CLI entry
# point, the docs' examples, and the object-store HTTP/TLS stack on its main paths. Left to
# test-py, where the same Python and Rust sources run: the torchrun tests (~6 min), the
# reliability suites (~4 min), the trainer/DataLoader integrations (Python glue), the bench
# harness, the fault-injection object-store cases (timing-heavy; the retry logic is the
# same source), and the resume, map-style, row-mode and import-footprint matrices (api/
# test_resume.py, test_mapstyle.py, test_rows_fast.py, test_footprint.py: ~60% of the wheel
# run's time, exercising the same code paths over more positions and settings, not more of
# the binary). For everything: make test-wheel WHEEL_TEST_SELECT=
# (--ignore-glob patterns must be absolute: pytest runs from a directory outside the repo.)
WHEEL_IGNORE := integration/test_distributed.py integration/test_accelerate.py \
  integration/test_hf_trainer.py integration/test_lightning.py integration/test_dataloader.py \
  integration/test_mapstyle_loader.py reliability/* bench/* api/test_resume.py \
  api/test_mapstyle.py api/test_rows_fast.py api/test_footprint.py
WHEEL_TEST_SELECT ?= $(foreach p,$(WHEEL_IGNORE),'--ignore-glob=$(CURDIR)/tests/$(p)') \
  -k 'not (test_object_store and (fault or silent or slow or blackhole or short_delays or moto_proxy))'
PYTEST_WHEEL_ARGS ?= $(PYTEST_ARGS) $(WHEEL_TEST_SELECT)

.PHONY: wheel
wheel: $(BOOT_STAMP) ## Build the release wheel into dist/ (abi3, CPython >= 3.10; manylinux2014 via zig on Linux)
	@mkdir -p $(DIST_DIR) && rm -f $(DIST_DIR)/shardstream-*.whl
	$(PIP_WHEEL) --wheel-dir $(DIST_DIR) .
	@ls -l $(DIST_DIR)/shardstream-*.whl

.PHONY: sdist
sdist: $(BOOT_STAMP) ## Build the source distribution into dist/ (maturin sdist)
	@mkdir -p $(DIST_DIR) && rm -f $(DIST_DIR)/shardstream-*.tar.gz
	$(MATURIN) sdist --out $(DIST_DIR)
	@ls -l $(DIST_DIR)/shardstream-*.tar.gz

# test-wheel builds exactly `make wheel`'s wheel (same command and cargo target, so either one
# reuses the other's build), and `make build` built the extension with the same cargo command
# (EDITABLE_INSTALL), so after it the wheel build only packages (13 s here; compiling everything
# again for the zig linker took 640 CPU-s).
WHEEL_TEST_DIR ?= $(DIST_DIR)/test-wheel

.PHONY: test-wheel
test-wheel: $(BOOT_STAMP) ## Build wheel + sdist, pytest against the wheel in a fresh venv (no cargo/rustc)
	@rm -rf $(WHEEL_TEST_DIR) && mkdir -p $(WHEEL_TEST_DIR)
	$(PIP_WHEEL) --wheel-dir $(WHEEL_TEST_DIR) .
	$(MATURIN) sdist --out $(WHEEL_TEST_DIR)
	PYTHON=$(PYTHON) bash tests/wheel/run.sh $(WHEEL_TEST_DIR) $(PYTEST_WHEEL_ARGS)

# Interpreters for wheel-smoke: the first usable one of each minor version >= 3.10.
WHEEL_SMOKE_PYTHONS ?= python3.10 python3.13 $(wildcard $(HOME)/.pyenv/versions/3.1[0-9]*/bin/python)

.PHONY: wheel-smoke
wheel-smoke: wheel ## Smoke-test the abi3 wheel on other CPythons >= 3.10 (pip needs PyPI)
	bash tests/wheel/smoke.sh $(DIST_DIR) $(WHEEL_SMOKE_PYTHONS)

# Optional (root and network; not in `make test`): the release wheel installed by pip, imported
# and used (tests/wheel/smoke.py) in a Debian 11 chroot, glibc 2.31 -- older than this Debian 12
# machine's 2.36. The chroot and the CPython built in it stay in OLDGLIBC_ROOT (1.4 GB) for later
# runs: the first run took 7 min here (load 4-6), later ones 35 s. See tests/wheel/oldglibc.sh.
OLDGLIBC_ROOT ?= $(VENV)/oldglibc-bullseye

.PHONY: wheel-oldglibc
wheel-oldglibc: wheel ## Install + use the release wheel under glibc 2.31 (Debian 11 chroot; root, network)
	PYTHON=$(PY) bash tests/wheel/oldglibc.sh $(DIST_DIR) $(OLDGLIBC_ROOT)

.PHONY: clean
clean: ## Remove build products, the venv and caches (keeps bench-data/)
	-$(CARGO) clean
	rm -rf $(VENV) dist build *.egg-info
	rm -f python/shardstream/_core*.so python/shardstream/_core*.pyd
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
	rm -rf .pytest_cache .hypothesis .ruff_cache .mypy_cache demo-data

.PHONY: distclean
distclean: clean ## clean + remove the cached benchmark data
	rm -rf bench-data
