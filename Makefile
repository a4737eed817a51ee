# Two commands do everything on a fresh machine:
#   make demo   set up .venv, pull the embedded default models, run the short benchmark
#   make test   set up .venv and run the whole test suite (pulls the models it needs;
#               the CUDA tests skip where there is no GPU)
#   make test-exact  the sampling conformance suite with release-sized samples
#   make test-gpu  only the CUDA tests, on a GPU machine
#   make gpu-check the GPU check and timings on a lent GPU machine (DRY_RUN=1: on the CPU)
#   make openvino  openvino-genai and the OpenVINO exports for `bench --peer openvino`
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-exact test-gpu gpu-check docs docs-tables lint clean openvino

LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36

$(STAMP): pyproject.toml scripts/build_llama_cpp.sh scripts/patch_llama_cpp.py
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	# llama.cpp backend: the Python bindings without their own build, then llama.cpp itself
	# built once with native CPU flags into $(VENV)/llama.cpp (the bindings load it from there)
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(VENV)/bin/pip install --quiet \
		--no-binary llama-cpp-python "$(LLAMA_CPP_PYTHON)"
	scripts/build_llama_cpp.sh $(VENV)
	# our kernels for --dtype q4 (kernels/*.cpp), built for this CPU
	$(VENV)/bin/python -c "from draftsman.kernels.native import build; build(verbose=True)"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/draftsman bench --preset demo

# the suite in TEST_WORKERS processes (pytest-xdist), each test file in one of them so that a
# file's loaded models are shared by its tests; every torch op there runs single-threaded
# (tests/conftest.py), so two workers use a 2-core machine's second core (20 -> 13 minutes)
TEST_WORKERS ?= 2

test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# the sampling conformance suite with 10x the draws (releases; about 10 minutes)
test-exact: $(STAMP)
	DRAFTSMAN_EXACT_DRAWS=20000 $(VENV)/bin/python -m pytest -q -s tests/test_conformance.py
	DRAFTSMAN_EXACT_DRAWS=1000 $(VENV)/bin/python -m pytest -q -s tests/test_llama_cpp_exact.py

test-gpu: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m gpu

# the documentation site (docs/, mkdocs.yml; the docs extra), strict: a warning fails
docs: $(STAMP)
	$(VENV)/bin/pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# rewrite every generated table in README.md and docs/ from its results folder
docs-tables: $(STAMP)
	$(VENV)/bin/python -m draftsman.bench.docs_tables

# `--peer openvino`: openvino-genai in $(VENV) (the openvino extra), and the default pair
# exported to OpenVINO IR (int4; int8 for the 1.5B) under ~/.cache/draftsman/openvino by
# optimum-intel in its own venv, $(OV_EXPORT_VENV) (it pins an older transformers)
OV_EXPORT_VENV := .venv-openvino-export

openvino: $(STAMP)
	$(VENV)/bin/pip install --quiet -e ".[openvino]"
	PY=$(PY) scripts/export_openvino.sh $(OV_EXPORT_VENV)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV)

# on a lent GPU machine, from the working tree with nothing installed (its own PyTorch):
# install beside it, `pytest -m gpu`, the timing runs; results packed into $OUT (see
# scripts/gpu_check.py; scripts/gpu_carry.py prepares what travels beside the tree).
# DRY_RUN=1: the same stages on the CPU with tiny random models (the suite runs it)
gpu-check:
	$(PY) scripts/gpu_check.py $(if $(DRY_RUN),--dry-run) $(GPU_CHECK_ARGS)
