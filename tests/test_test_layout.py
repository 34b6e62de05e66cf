"""How the test suite itself is laid out.

- Helpers live in tests/support/: no module under tests/ imports from a ``test_*`` module or from a
  ``conftest`` (absolute, relative or inside a function), so a test module is only ever collected,
  and a conftest only ever provides fixtures.
- Markers follow the brokers a test uses (tests/support/markers.py): collecting with ``-m redis``
  or ``-m kafka`` selects exactly the tests whose fixtures start that broker.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.markers import broker_markers

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _is_test_or_conftest(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def _module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layout_violations(root: Path) -> list[str]:
    """``file:line: what`` for every import, anywhere under ``root`` (a tests directory), that takes
    something out of a test module or a conftest."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_of(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                sources = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    origin = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                # ``from tests.x import test_y`` imports the module test_y (or a test function)
                sources = [origin, *(f"{origin}.{alias.name}" for alias in node.names)]
            else:
                continue
            for source in sources:
                if source.split(".")[0] == root.name and _is_test_or_conftest(source):
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno}: imports from {source} (helpers belong in "
                                 f"{root.name}/support/, fixtures in a conftest)")
                    break
    return found


def test_no_module_imports_from_a_test_module_or_a_conftest() -> None:
    assert layout_violations(TESTS) == []


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tests"
    for name, text in {
        "__init__.py": "",
        "conftest.py": "",
        "support/__init__.py": "",
        "support/helpers.py": "def helper(): ...\n",
        "a/__init__.py": "",
        "a/conftest.py": "from tests.support.helpers import helper\n",
        "a/test_ok.py": "from tests.support.helpers import helper\nimport pytest\n",
        "a/test_abs.py": "from tests.a.test_ok import helper\n",
        "a/test_conftest.py": "from tests.a.conftest import thing\n",
        "a/test_rel.py": "from .test_ok import helper\n",
        "a/test_rel_conftest.py": "from . import conftest\n",
        "a/test_module.py": "from tests.a import test_ok\n",
        "a/test_plain.py": "import tests.a.test_ok\n",
        "a/test_late.py": "def f():\n    from tests.conftest import x\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_every_form_of_such_an_import_is_caught(tree: Path) -> None:
    caught = {line.split(":")[0] for line in layout_violations(tree)}
    assert caught == {f"tests/a/{name}.py" for name in
                      ("test_abs", "test_conftest", "test_rel", "test_rel_conftest", "test_module",
                       "test_plain", "test_late")}


# ---- markers follow fixtures -----------------------------------------------------------------


def test_broker_markers_come_from_fixtures_and_broker_parameters() -> None:
    assert broker_markers(["redis_server", "tmp_path"], {}) == {"redis"}
    assert broker_markers(["fault_tansu"], {}) == {"kafka"}
    assert broker_markers(["kind"], {"kind": "redis_streams-resp2"}) == {"redis"}
    assert broker_markers(["kind"], {"kind": "kafka"}) == {"kafka"}
    assert broker_markers(["kind", "topic"], {"kind": "memory"}) == set()
    # a URL given as a parameter is data under test, not a broker the test starts
    assert broker_markers(["url"], {"url": "redis://127.0.0.1:1/0"}) == set()


PATHS = ("tests/transports/test_contract.py", "tests/checkpoints/test_store_contract.py",
         "tests/bus/test_processes.py", "tests/bus/test_foreign_clients.py")


@pytest.fixture(scope="module")
def collected() -> dict[str, set[str]]:
    """The test ids ``pytest --collect-only -m MARKER`` selects out of PATHS, per broker marker."""
    selected: dict[str, set[str]] = {}
    for marker in ("redis", "kafka"):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
             "-p", "no:cacheprovider", "-m", marker, *PATHS],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))},
            capture_output=True, text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        selected[marker] = {line for line in run.stdout.splitlines() if "::" in line}
    return selected


def test_collected_tests_carry_the_markers_of_the_brokers_they_use(
        collected: dict[str, set[str]]) -> None:
    redis, kafka = collected["redis"], collected["kafka"]
    contract = "tests/transports/test_contract.py::test_ack_publishes_results"
    store = "tests/checkpoints/test_store_contract.py::test_lease_free_then_held"
    drain = "tests/bus/test_processes.py::test_sigterm_drains_in_flight_debate_before_exiting"
    # parametrized fixtures that pick their broker by parameter
    assert {f"{contract}[redis_streams-resp2]", f"{contract}[redis_pubsub-cluster]",
            f"{store}[redis-resp3]", f"{store}[redis-cluster]", f"{drain}[redis_streams]"} <= redis
    assert {f"{contract}[kafka]", f"{drain}[kafka]"} <= kafka
    # and nothing that runs in memory
    assert not {t for t in redis | kafka if t.endswith(("[memory]", "[sqlite]"))}
    assert not redis & kafka


def test_a_test_that_takes_a_broker_fixture_is_marked(collected: dict[str, set[str]]) -> None:
    # No hand marker on these four: they take ``redis_server`` directly.
    path = "tests/bus/test_foreign_clients.py::"
    assert {test.removeprefix(path) for test in collected["redis"] if test.startswith(path)} == {
        "test_redis_cli_request_and_result_on_streams",
        "test_an_entry_without_an_envelope_field_is_dead_lettered_naming_its_fields",
        "test_an_entry_without_an_envelope_field_but_a_request_id_is_answered_failed",
        "test_synkro_wire_on_pubsub_with_redis_cli",
    }
