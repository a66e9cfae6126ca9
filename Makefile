# The two set-up commands a newcomer runs: `make demo` and `make test`.
# Both bootstrap .venv from the pinned requirements (idempotent: a stamp file skips the
# install when requirements.txt, pyproject.toml and setup.py have not changed).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYTHONUNBUFFERED := 1

.PHONY: venv test demo bench-batch clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps graphdatascience==2.2
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

test: venv
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info .pytest_cache
