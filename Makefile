# The two set-up commands of the README: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
SORTIE := $(VENV)/bin/sortie

.PHONY: install bytecode demo test test-unit lint bench clean

install: $(VENV)/.installed

# torch goes first, pinned: 2.13.0 is a local CPU build here, and a bare range would pull CUDA
# wheels. The editable install uses compat mode (a plain path in a .pth file): the default import
# finder costs every interpreter start (each node check, each torchrun rank) ~20 ms.
# uv installs it all in seconds where pip takes two minutes (measured side by side from a clean
# clone here: README, "Set up and run"); it reads no pip.conf, so .ci/uv_env.py hands it pip's
# settings. Should uv fail for any reason, pip installs as before.
$(VENV)/.installed: pyproject.toml
	@{ test -x /usr/sbin/sshd || command -v sshd >/dev/null; } && command -v rsync >/dev/null || { \
	  echo "installing openssh-server (sshd runs the local cluster's nodes) and rsync (code sync)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server rsync; }
	python3 -m venv $(VENV)
	{ $(PY) -m pip install -q uv && settings="$$($(PY) .ci/uv_env.py)" && eval "$$settings" && \
	  $(VENV)/bin/uv pip install -q --python $(PY) torch==2.13.0 && \
	  $(VENV)/bin/uv pip install -q --python $(PY) -e '.[all,local,test]' -C editable_mode=compat; } || { \
	  echo "uv did not install: installing with pip"; \
	  $(PY) -m pip install -q torch==2.13.0 && \
	  $(PY) -m pip install -q -e '.[all,local,test]' --config-settings editable_mode=compat; }
	PYTHONDONTWRITEBYTECODE= $(PY) .ci/warm_bytecode.py
	touch $@

# Our own modules' bytecode, again after edits (PYTHONDONTWRITEBYTECODE, set here, would leave
# every command compiling an edited module from source: 0.3 s of each `sortie exec`, measured).
bytecode: install
	$(PY) -m compileall -q -j 0 sortie stacks bootstrap infra trainer >/dev/null

demo: install
	$(SORTIE) run --nodes 2 --procs-per-node 2 --steps 60

# Azurite (Azure Blob's emulator, from npm) for the az:// checkpoint test; skipped without npm.
# Chromium (Debian's) for the run report's browser test; skipped without it (apt needs root).
AZURITE := .azurite/node_modules/.bin/azurite-blob
# Test processes side by side (pytest-xdist); every test makes and checks only its own
# clusters, so they never meet. Three on two cores: a fifth of a run with two left the cores
# idle while tests waited on clocks (a TTL, Slurm's time limit, a notice; vmstat: 20 %), which a
# third fills (10 % idle). Fresh clones, quiet, the tests' files on tmpfs: 1443 s with two,
# 1211 s with three (2026-11-30; each test slower, none failed; on disk, 2026-11-29: 1240 s
# with two, 1139 and 1282 s with three). `--dist worksteal` (each takes its share; one that
# ends first takes from another's end): with `load` the Slurm tests came last and one process
# stood idle ~130 s at the end.
TEST_WORKERS ?= 3
# The tests' files in memory: as root, a tmpfs of this checkout's own (out of it: nothing that
# reads the checkout's files walks them; as another user, a plain directory). On this
# machine's disk (ext4, mounted with discard) a file costs far more than its bytes, and the
# tests make many (booted nodes' root file systems, image stores): the booted nodes' tests
# took 47 s on tmpfs against 71 s on disk, side by side; a fresh clone's CI 1443 s, not 1513.
# A passing test's directory goes as it passes (tests/conftest.py); the tmpfs is unmounted when
# every test passed, and kept, with what the failed tests left, when one failed.
TEST_TMP := /tmp/sortie-tests-$(shell printf %s '$(CURDIR)' | cksum | cut -d ' ' -f 1)
# The booted nodes' image build's output (.log) and exit code (.code), when it runs behind.
IMAGE_BUILD := $(TEST_TMP).image

test: install
	@# Debian's packages for the real parts (.ci/test_packages.sh says which test needs which):
	@# the booted nodes' first, so that their image (a few minutes on a fresh machine, then
	@# kept) is built while the rest install and ruff, mypy and the docs run, not before them
	@# (it keeps one core busy, ~90 s here; mypy the other, ~26 s from a fresh clone).
	@.ci/test_packages.sh booted
	@rm -f $(IMAGE_BUILD).*; if [ "$$(id -u)" = 0 ] && command -v debootstrap >/dev/null; \
	  then { $(SORTIE) images --build; echo $$? > $(IMAGE_BUILD).code; } \
	    < /dev/null > $(IMAGE_BUILD).log 2>&1 & echo $$! > $(IMAGE_BUILD).pid; \
	  else echo 0 > $(IMAGE_BUILD).code; fi
	@test -x $(AZURITE) || ! command -v npm >/dev/null || \
	  npm install --prefix .azurite --no-audit --no-fund --silent azurite@3
	@.ci/test_packages.sh --except booted  # those went first (a line each, not two)
	@$(MAKE) -s bytecode
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p sortie  # the product's types (pyproject.toml [tool.mypy]): 0 errors
	$(VENV)/bin/mkdocs build --strict  # the reference (docs/): a broken link fails it
	@while [ ! -s $(IMAGE_BUILD).code ] && kill -0 "$$(cat $(IMAGE_BUILD).pid)" 2>/dev/null; \
	  do sleep 1; done; cat $(IMAGE_BUILD).log 2>/dev/null; \
	  exit "$$(cat $(IMAGE_BUILD).code 2>/dev/null || echo 1)"
	@mkdir -p $(TEST_TMP) && { [ "$$(id -u)" != 0 ] || mountpoint -q $(TEST_TMP) || \
	  mount -t tmpfs -o size=50%,mode=0755 sortie-tests $(TEST_TMP); }
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 \
	  --basetemp=$(TEST_TMP)/run; code=$$?; \
	  if [ $$code = 0 ]; then ! mountpoint -q $(TEST_TMP) || umount $(TEST_TMP); \
	  else echo "what the failed tests left: $(TEST_TMP)/run"; fi; exit $$code

# The quick loop: the tests that start no process (under a minute on two cores). Nothing in
# them waits, so one process per core: a third on two cores took 57-62 s against 46-55 s
# (2026-11-30), each process importing the clouds' programs for itself.
UNIT_WORKERS ?= auto
test-unit: install bytecode
	$(VENV)/bin/pytest -q -n $(UNIT_WORKERS) -m unit

bench: install bytecode
	$(PY) benchmarks/bootstrap_fanout.py
	$(PY) benchmarks/e2e_local.py
	$(PY) benchmarks/plan_scaling.py
	$(PY) benchmarks/report.py
	$(PY) benchmarks/faults.py
	$(PY) benchmarks/node_lines.py
	@[ "$$(id -u)" != 0 ] || $(PY) benchmarks/booted.py --reuse

clean:
	! mountpoint -q $(TEST_TMP) || umount $(TEST_TMP)
	rm -rf $(VENV) runs $(TEST_TMP) $(IMAGE_BUILD).*
