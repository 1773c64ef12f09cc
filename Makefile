# The README's two commands: `make demo` and `make test`. Both install into .venv first: the requirements,
# then this project itself (`pip install -e .`, pyproject.toml), so that tools/*.py run from any folder.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pip keeps no copy of what it downloads: the stacks' wheels are 8 GB, and CI's disk is shared with the tests' runs
PIP_FLAGS := -q --disable-pip-version-check --no-cache-dir
# the second lane: torch 2.1.0, the torch of ModelZoo's Ascend stack (requirements-compat.txt), on Python 3.9 (below),
# a Python of its users (ModelZoo's entries run 3.8 to 3.10)
VENV_COMPAT  := .venv-torch2.1
PY_COMPAT    := $(VENV_COMPAT)/bin/python
STAMP_COMPAT := $(VENV_COMPAT)/.installed
# the third: the Ascend 1.11 stack as its users install it (1.11_requirements.txt: torch 1.11.0, torchvision 0.12.0)
# on Python 3.9, the newest Python with torch 1.11 wheels: pyenv's 3.9, else python3.9 on PATH (or PYTHON39=...)
VENV_111  := .venv-torch1.11
PY_111    := $(VENV_111)/bin/python
STAMP_111 := $(VENV_111)/.installed
PYTHON39  ?= $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.9.*/bin/python) \
                         $(shell command -v python3.9 2>/dev/null))
# the guides' Python 3.7 (their cp37 wheels), for the same stack's lane there: pyenv's 3.7, else python3.7 on PATH
VENV_37   := .venv-torch1.11-py37
PY_37     := $(VENV_37)/bin/python
STAMP_37  := $(VENV_37)/.installed
PYTHON37  ?= $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.7.*/bin/python) \
                         $(shell command -v python3.7 2>/dev/null))
# $(call venv_on,VENV,TARGET,X.Y,PYTHON): VENV made with PYTHON, a Python X.Y, where it is missing or has another
# Python; one line naming the way to get one where none is found
venv_is = -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(1)")' 2>/dev/null
venv_on = @$(1)/bin/python $(call venv_is,$(3)) || { $(if $(4),$(4),false) $(call venv_is,$(3)) || { \
  echo "error: make $(2) needs Python $(3), and none was found (neither pyenv's \$$(pyenv root)/versions/$(3).*" \
  "nor python$(3) on PATH): install one (pyenv install $(3)) or name it" \
  "(make $(2) PYTHON$(subst .,,$(3))=/path/to/python$(3))" >&2; exit 2; }; rm -rf $(1); $(4) -m venv $(1); }
# pytest-xdist: one test process per core, at most 4 (most tests wait on a child process's start); tests
# marked conftest.RANKS (jobs of several ranks on localhost ports) all run on one of them
PYTEST_ARGS := -q -n auto --maxprocesses 4 --dist loadgroup -rs --durations=15 tests
# lanes of their own, on each stack: the jobs of several ranks (marker "ranks": conftest.RANKS runs them one after
# another) and the graph-mode tests (--compile; marker "graph": compiling takes a CPU minutes)
MAIN_TESTS   := -m "not graph and not ranks and not slurm and not double and not clients and not bench and not tools"
RANKS_TESTS  := -m "ranks and not graph and not slurm and not double"
GRAPH_TESTS  := -m graph
# runs that train on the torch_npu double (marker "double", conftest.DOUBLE), its ranks' jobs included
DOUBLE_TESTS := -m "double and not graph and not slurm"
# what outside clients run on this project (marker "clients"): pytorch/examples' commands and checkpoints, msprobe,
# a Python without the project's packages, the signals clusters stop a run with
CLIENT_TESTS := -m "clients and not graph and not ranks and not slurm and not double"
# the benchmark scripts' smoke runs (marker "bench")
BENCH_TESTS  := -m "bench and not graph and not ranks and not slurm and not double"
# the porting tools' runs (marker "tools"): the device battery, ONNX export, op inventory, precision comparison
TOOLS_TESTS  := -m "tools and not graph and not ranks and not slurm and not double"
# CI's second lane of the pinned stack: everything of it but make test's and Slurm's (what test-clients, test-bench,
# test-tools, test-graph, test-npu and test-ranks run), in one pytest run (one start, the cores kept busy to its end)
MORE_TESTS   := -m "not slurm and (graph or ranks or double or clients or bench or tools)"
# the other stacks' lanes run only the tests whose outcome can depend on torch (marker "stack", tests/README.md),
# every one of them but Slurm's, in one pytest run
STACK_TESTS  := -m "not slurm" --stack-only
# a stack's second Python: the ways a user runs the trainer (marker "ways", a few stack tests), trained end to end, and
# the stack tests its first Python cannot run (marker "py38": msprobe's alignment, audit hooks)
WAYS_TESTS   := -m "(ways or py38) and not slurm" --stack-only

.PHONY: install install-compat install-torch1.11 test test-clients test-bench test-tools test-ranks test-slurm test-graph test-npu test-more test-compat test-torch1.11 install-torch1.11-py37 test-torch1.11-py37 stress soak ci demo lint clean-demo check-device

install: $(STAMP)

$(STAMP): requirements.txt requirements-common.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -r requirements.txt
	$(PY) -m pip install $(PIP_FLAGS) --no-deps -e .
	$(PY) -m pip check
	@./tools/install_system_deps.sh
	@touch $@

install-compat: $(STAMP_COMPAT)

$(STAMP_COMPAT): requirements-compat.txt requirements-common.txt pyproject.toml
	$(call venv_on,$(VENV_COMPAT),install-compat,3.9,$(PYTHON39))
	$(PY_COMPAT) -m pip install $(PIP_FLAGS) -r requirements-compat.txt
	$(PY_COMPAT) -m pip install $(PIP_FLAGS) --no-deps -e .
	$(PY_COMPAT) -m pip check
	@./tools/install_system_deps.sh
	@touch $@

install-torch1.11: $(STAMP_111)

# the venv made with a Python 3.9 (venv_on), then 1.11_requirements.txt as users run it, then what the tests need
# (requirements-torch1.11-tests.txt)
$(STAMP_111): 1.11_requirements.txt requirements-torch1.11-tests.txt pyproject.toml
	$(call venv_on,$(VENV_111),install-torch1.11,3.9,$(PYTHON39))
	$(PY_111) -m pip install $(PIP_FLAGS) -r 1.11_requirements.txt
	$(PY_111) -m pip install $(PIP_FLAGS) -r requirements-torch1.11-tests.txt
	$(PY_111) -m pip install $(PIP_FLAGS) --no-deps -e .
	$(PY_111) -m pip check
	@touch $@

install-torch1.11-py37: $(STAMP_37)

# the same on Python 3.7: 1.11_requirements.txt as users run it, then the test runners of Python 3.7
# (requirements-py37-tests.txt)
$(STAMP_37): 1.11_requirements.txt requirements-py37-tests.txt pyproject.toml
	$(call venv_on,$(VENV_37),install-torch1.11-py37,3.7,$(PYTHON37))
	$(PY_37) -m pip install $(PIP_FLAGS) -r 1.11_requirements.txt
	$(PY_37) -m pip install $(PIP_FLAGS) -r requirements-py37-tests.txt
	$(PY_37) -m pip install $(PIP_FLAGS) --no-deps -e .
	$(PY_37) -m pip check
	@touch $@

# the pinned stack (requirements.txt)
test: install
	$(PY) -m pytest $(MAIN_TESTS) $(PYTEST_ARGS)

# what outside clients run (pytorch/examples' commands and checkpoints, msprobe, a Python without the packages)
test-clients: install
	$(PY) -m pytest $(CLIENT_TESTS) $(PYTEST_ARGS)

# the benchmark scripts' smoke runs (bench/)
test-bench: install
	$(PY) -m pytest $(BENCH_TESTS) $(PYTEST_ARGS)

# the porting tools (tools/): the check-device battery on the CPU, ONNX export, op report, precision comparison
test-tools: install
	$(PY) -m pytest $(TOOLS_TESTS) $(PYTEST_ARGS)

# CI's second lane: the rest of the pinned stack but Slurm's (test-clients, test-bench, test-tools, test-graph,
# test-npu and test-ranks) in one pytest run
test-more: install
	$(PY) -m pytest $(MORE_TESTS) $(PYTEST_ARGS)

# the jobs of several ranks (spawn, torchrun, nodes, Ctrl-C, killed ranks) on the pinned stack
test-ranks: install
	$(PY) -m pytest $(RANKS_TESTS) $(PYTEST_ARGS)

# ranks started by a real one-node Slurm: tools/slurm_local.sh installs Debian's slurm-wlm and munge where missing
# (as root), starts a private munged, slurmctld and slurmd on this host (configuration and state in
# $SLURM_LOCAL_STATE, default /tmp/slurm-local; /etc/slurm and /etc/munge untouched), and fails the lane where it
# cannot or refuses where another Slurm runs here; then, with its SLURM_CONF, srun -n 2 and the sbatch example on
# main.py (tests/test_slurm.py) and the script's own start/stop (tests/test_slurm_local.py); the daemons it
# started are stopped afterwards
test-slurm: install
	./tools/slurm_local.sh
	. "$${SLURM_LOCAL_STATE:-/tmp/slurm-local}/env" && $(PY) -m pytest -m slurm -q -rs --durations=5 tests/test_slurm.py \
	  tests/test_slurm_local.py; rc=$$?; ./tools/slurm_local.sh stop; exit $$rc

# torch 2.1.0 on Python 3.9 (requirements-compat.txt): every test marked "stack" but Slurm's, in one lane; a test that
# needs a newer torch skips with its reason (-rs lists them)
test-compat: install-compat
	$(PY_COMPAT) -m pytest $(STACK_TESTS) $(PYTEST_ARGS)

# torch 1.11.0 on Python 3.9 (1.11_requirements.txt, as its users install it): the ways a user runs the trainer
# (marker "ways"), trained end to end, and what Python 3.7 cannot run (marker "py38"); torch 1.11 itself is proven on
# Python 3.7 below, where every other stack test runs
test-torch1.11: install-torch1.11
	$(PY_111) -m pytest $(WAYS_TESTS) $(PYTEST_ARGS)

# torch 1.11.0 on Python 3.7 (1.11_requirements.txt, the guides' cp37 wheels): every test marked "stack" but Slurm's;
# a test of what 1.11 cannot do skips with its reason (-rs lists them): the torch_npu double (marker "fake_npu": no
# PrivateUse1 before torch 2.1), float16 autocast on a CPU, torch.compile; the alignment tests skip as well (msprobe
# has no Python 3.7 release), and so does the audit-hook count of a checkpoint's reads (Python 3.8)
test-torch1.11-py37: install-torch1.11-py37
	$(PY_37) -m pytest $(STACK_TESTS) $(PYTEST_ARGS)

# graph mode (--compile): tests/test_graph.py
test-graph: install
	$(PY) -m pytest $(GRAPH_TESTS) $(PYTEST_ARGS)

# main.py's NPU ways to run, trained end to end on the torch_npu double (tests/fake_npu: tensors on npu:N with
# host data)
test-npu: install
	$(PY) -m pytest $(DOUBLE_TESTS) $(PYTEST_ARGS)

# every lane in CI's order, each timed with its five slowest tests (.ci/lanes.py; .ci/run calls it)
ci:
	$(PYTHON) .ci/lanes.py

# a lane or a test again and again, counting how often it passes: make stress LANE=test-ranks N=20, or
# make stress TEST=tests/test_stop.py::test_x N=20 (on the pinned stack)
N ?= 10
stress:
	@test -n "$(LANE)$(TEST)" || { echo "error: name a lane or a test: make stress LANE=test-ranks N=20, or make stress TEST=tests/test_stop.py::test_x N=20" >&2; exit 2; }
	$(if $(TEST),$(MAKE) --no-print-directory install && ,)$(PYTHON) .ci/lanes.py stress $(or $(LANE),$(TEST)) $(N)

# the stop path under seeded fault injection (tools/inject_faults.py): N stop signals (200 unless N is given) at
# drawn moments of real runs of each launcher of LAUNCHERS (one process, spawn's 2 ranks, torchrun's 2 workers,
# ModelZoo's test/train_full_1p.sh), two at a time, each resumed and compared with the run that was not stopped; a
# line per injection, a table per phase and per launcher, every injection in $(SOAK_DIR)/faults-SEED.json (exit 1 if
# one is not exact): make soak N=200 SEED=7
SEED      ?= 0
SOAK_DIR  ?= soak
LAUNCHERS ?= one spawn torchrun driver
soak: install
	$(PY) -m tools.inject_faults -n $(if $(filter command line environment,$(origin N)),$(N),200) --seed $(SEED) \
	  --launchers $(LAUNCHERS) --jobs 2 --work-dir $(SOAK_DIR)/seed-$(SEED) --json $(SOAK_DIR)/faults-$(SEED).json

# What to run first on an accelerator box: tools/check_device.py's PASS/FAIL battery, results in
# check_device.json. It uses the machine's own Python (with its torch) when no venv is installed.
check-device:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m tools.check_device --json check_device.json

# ruff (pyproject.toml's [tool.ruff]: pyflakes, pycodestyle, Python 3.7 as the target) and shellcheck; seconds
lint: install
	$(PY) -m ruff check --no-cache .
	shellcheck -x env_npu.sh test/*.sh tools/*.sh

# A small learnable data set (10 classes of drawn shapes) and a short ShuffleNetV2 run on
# whatever device is present. Each run writes a fresh folder under demo_output/.
demo: install
	@test -d demo_data/train || $(PY) -m tools.make_dataset demo_data --train-per-class 200 --val-per-class 30 --size 64
	$(PY) main.py demo_data -a shufflenet_v2_x0_5_npu --epochs 10 --eval-freq 5 -b 16 --lr 0.1 \
		--warmup-epochs 1 --lr-schedule cosine --wd 4e-5 -j 2 --train-crop-size 56 --val-resize-size 64 \
		--val-crop-size 56 --crop-scale-min 0.35 --seed 0 -p 50 --output-dir demo_output/$$(date +%Y%m%d-%H%M%S)
	@last=$$(ls -d demo_output/*/ | tail -n 1); $(PY) -m tools.plot_runs $$last -o $${last}curves.png --force

clean-demo:
	rm -rf demo_data demo_output
