#!/usr/bin/env bash
# The two set-up commands of the README, on a fresh machine:
#   bash scripts/bootstrap.sh demo   # install with the embedded local model, serve one debate on the bus
#   bash scripts/bootstrap.sh test   # install everything the tests need and run them (what CI runs)
#   bash scripts/bootstrap.sh lowest # the suite on the lowest versions pyproject.toml allows
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-test}"

ensure_system_packages() {
  # Redis for the bus and its tests; Chromium for the live page's end-to-end test.
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  if [ "$what" = test ]; then
    command -v chromium >/dev/null || missing+=(chromium)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
  fi
}

ensure_venv() {
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  . .venv/bin/activate
  python -m pip install -q --upgrade pip
}

case "$what" in
  demo)
    ensure_system_packages
    ensure_venv
    python -m pip install -q -e ".[redis,cli,fast]"
    bash scripts/install-local-model.sh
    # In memory, unless the user names a broker in DEBATEBUS_BROKER (the demo then asks and
    # answers on its own event type and group, so it never touches real traffic there).
    exec python -m debatebus demo "${2:-Should we adopt microservices?}"
    ;;
  test)
    ensure_system_packages
    ensure_venv
    python -m pip install -q -e ".[dev]"
    bash scripts/install-local-model.sh
    set +e
    # Most of the suite waits on brokers and worker processes, not on the CPU: three pytest-xdist
    # workers on two cores. The embedded model's tests (marker local_llm) keep both cores busy
    # (llama.cpp's threads wait on each other, and crawl when anything else runs): they run
    # afterwards, alone.
    python -m pytest -q -n 3 --dist worksteal --durations=15 -m "not local_llm"
    status=$?
    python -m pytest -q --durations=15 -m local_llm
    model_status=$?
    set -e
    [ $status -eq 0 ] || exit $status
    [ $model_status -eq 0 ] || exit $model_status
    ruff check src tests benchmarks
    mypy --strict src
    ;;
  lowest)
    # The lowest versions pyproject.toml allows (uv's lowest-direct resolution: every direct
    # dependency at its lower bound), pinned in .ci/lowest.txt, installed in .ci/venv-lowest, and
    # the suite on them. Run it after changing a bound and commit .ci/lowest.txt:
    # tests/test_dependency_bounds.py (in CI) checks that every bound is a version pinned there.
    # Not part of CI's test run: a second whole suite would double its ten minutes.
    ensure_system_packages
    [ -x .ci/venv-uv/bin/uv ] || { python3 -m venv .ci/venv-uv && .ci/venv-uv/bin/python -m pip install -q uv; }
    [ -x .ci/venv-lowest/bin/python ] || python3 -m venv .ci/venv-lowest
    uv=.ci/venv-uv/bin/uv
    py=.ci/venv-lowest/bin/python
    pins=$(mktemp)
    "$uv" pip compile -q --python "$py" --resolution lowest-direct --extra dev --no-header \
      --no-annotate pyproject.toml -o "$pins"
    { sed -n '/^#/p' .ci/lowest.txt; cat "$pins"; } > .ci/lowest.txt.new
    mv .ci/lowest.txt.new .ci/lowest.txt
    rm -f "$pins"
    "$uv" pip sync -q --python "$py" .ci/lowest.txt
    "$uv" pip install -q --python "$py" --no-deps -e .
    "$py" -m pytest -q -n 3 --dist worksteal --durations=15 -m "not local_llm"
    ;;
  *)
    echo "usage: bash scripts/bootstrap.sh demo|test|lowest" >&2
    exit 2
    ;;
esac
