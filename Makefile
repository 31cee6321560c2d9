# pykubelet: `make run` starts the example pods, `make test` runs every check.
# Both create .venv themselves on a fresh Debian 12 machine with Python 3.11.

# The virtualenvs' interpreter: the distribution's python3 when it is 3.11 or newer, else python3
# on PATH. Debian builds its own with PGO and LTO and links it statically: it ran the agent's
# bursts of 1,000 pods 15 % faster than a build without them, pyenv's default (bench/HISTORY.md,
# session 22). PYTHON=... chooses another; `make clean` first: .venv keeps the one it was made with.
SYSTEM_PYTHON := /usr/bin/python3
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell $(SYSTEM_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	2>/dev/null && echo $(SYSTEM_PYTHON) || echo python3)
endif
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ROOT_DIR ?= .run/root
PORT ?= 10255

.PHONY: run test test-env lint unit integration bench soak clean venv

# What the tests need on the machine: Podman for the docker runtime's tests (their session
# fixture writes a private Podman configuration, builds the images and starts, then stops, the
# service through scripts/podman-test-env), containerd and the CNI plugins for the remote (CRI)
# runtime's (the same for scripts/containerd-test-env), Chromium for the status page's, dnsmasq
# for the DNS tests, and docker-registry, skopeo and htpasswd for the pull-secret tests' registry
# (tests/fixtures/registry.py).
TEST_PACKAGES := podman runc busybox-static chromium containerd containernetworking-plugins \
	dnsmasq-base docker-registry skopeo apache2-utils

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || scripts/install-debian-packages python3-venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

run: $(STAMP)
	@mkdir -p $(ROOT_DIR)
	@echo "pykubelet: serving the pods of examples/manifests at http://127.0.0.1:$(PORT)/pods (Ctrl-C stops them)"
	$(BIN)/pykubelet --pod-manifest-path examples/manifests --root-dir $(ROOT_DIR) \
		--container-runtime process --read-only-port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check --no-cache pykubelet tests bench
	$(BIN)/ruff format --check --no-cache pykubelet tests bench
	$(BIN)/mypy --strict pykubelet
	$(BIN)/lint-imports --no-cache

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/pytest -q -m 'not soak' tests/integration

test-env:
	@scripts/install-debian-packages $(TEST_PACKAGES)

# Two workers: the integration tests mostly wait on processes and engines, so two run in about
# half the time on two cores. The tests of each private engine stay on one worker (loadgroup,
# tests/conftest.py).
test: lint test-env
	$(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadgroup --durations=15 -m 'not soak' tests

# The long variants of the fault tests (10,000 manifests, 60 SIGKILLs during churn): not in CI.
soak: $(STAMP) test-env
	$(BIN)/pytest -q -p no:cacheprovider -m soak tests

# The bench extra (py-spy, for the flame graphs in bench/flamegraphs/) on top of the test venv.
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	@touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .run .mypy_cache .ruff_cache .pytest_cache .hypothesis build pykubelet.egg-info

# The agent as a systemd service (README, "Running as a service"): a virtualenv under PREFIX,
# pykubelet.service with its drop-in in the kubelet's style, the environment file and the
# config file (those two only if absent: they are the operator's). DESTDIR stages it all under
# another root (packaging, tests); the virtualenv's scripts still name PREFIX.
PREFIX ?= /opt/pykubelet
DESTDIR ?=
UNIT_DIR ?= /etc/systemd/system
STATE_DIR ?= /var/lib/pykubelet
UNIT := $(DESTDIR)$(UNIT_DIR)/pykubelet.service
DROPIN := $(DESTDIR)$(UNIT_DIR)/pykubelet.service.d/10-pykubelet.conf

.PHONY: install uninstall

install:
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || scripts/install-debian-packages python3-venv
	$(PYTHON) -m venv --clear $(DESTDIR)$(PREFIX)
	$(DESTDIR)$(PREFIX)/bin/pip install --quiet --disable-pip-version-check --no-compile .
	@if [ -n "$(DESTDIR)" ]; then \
		grep -rlI -- '$(DESTDIR)$(PREFIX)' $(DESTDIR)$(PREFIX)/bin | \
			xargs -r sed -i 's|$(DESTDIR)$(PREFIX)|$(PREFIX)|g'; \
	fi
	install -D -m 644 README.md $(DESTDIR)$(PREFIX)/share/doc/pykubelet/README.md
	install -d -m 755 $(DESTDIR)$(UNIT_DIR)/pykubelet.service.d
	sed 's|@PREFIX@|$(PREFIX)|g' packaging/pykubelet.service > $(UNIT)
	sed 's|@PREFIX@|$(PREFIX)|g' packaging/10-pykubelet.conf > $(DROPIN)
	chmod 644 $(UNIT) $(DROPIN)
	install -d -m 700 $(DESTDIR)$(STATE_DIR)
	install -d -m 755 $(DESTDIR)/etc/kubernetes/manifests
	[ -e $(DESTDIR)$(STATE_DIR)/config.yaml ] || \
		install -m 644 packaging/config.yaml $(DESTDIR)$(STATE_DIR)/config.yaml
	[ -e $(DESTDIR)/etc/default/pykubelet ] || \
		install -D -m 644 packaging/default $(DESTDIR)/etc/default/pykubelet
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "pykubelet installed in $(PREFIX); start it with: systemctl enable --now pykubelet"

# The operator's files (/etc/default/pykubelet, $(STATE_DIR) with the pods' state) are kept.
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then \
		systemctl disable --now pykubelet.service || true; fi
	rm -f $(UNIT) $(DROPIN)
	-rmdir $(DESTDIR)$(UNIT_DIR)/pykubelet.service.d
	rm -rf $(DESTDIR)$(PREFIX)
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
