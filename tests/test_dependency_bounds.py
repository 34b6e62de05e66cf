"""The dependency lower bounds in pyproject.toml are versions the suite was run on: each is the
version pinned in .ci/lowest.txt, the set ``bash scripts/bootstrap.sh lowest`` resolves with uv's
``--resolution lowest-direct``, installs and tests. Raising or lowering a bound without that run
fails here."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: Extras the dev install leaves out, so the lowest-versions run cannot test them: the embedded
#: model (built by scripts/install-local-model.sh, tested by the local_llm tests on what it
#: builds) and the benchmark-only client.
UNTESTED_EXTRAS = {"local", "bench"}


def lower_bounds(pyproject: dict[str, object]) -> dict[str, Version]:
    """``name: lower bound`` of every requirement the dev install brings, self-references left out."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    requirements = list(project["dependencies"])
    for extra, items in project["optional-dependencies"].items():
        if extra not in UNTESTED_EXTRAS:
            requirements += items
    bounds: dict[str, Version] = {}
    for text in requirements:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == "debatebus":
            continue
        (lower,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        bounds[canonicalize_name(requirement.name)] = lower
    return bounds


def pinned(text: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_lower_bound_is_the_version_the_lowest_run_tested() -> None:
    bounds = lower_bounds(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    pins = pinned((ROOT / ".ci" / "lowest.txt").read_text())
    wrong = {name: (str(bound), str(pins.get(name))) for name, bound in bounds.items()
             if pins.get(name) != bound}
    assert wrong == {}, ("bound in pyproject.toml, version tested (.ci/lowest.txt): run "
                         "`bash scripts/bootstrap.sh lowest` after changing a bound")


def test_a_bound_the_lowest_run_did_not_test_is_caught() -> None:
    pyproject = {"project": {"dependencies": ["redis>=5.3", "msgspec>=0.19"],
                             "optional-dependencies": {"dev": ["debatebus[redis]"],
                                                       "local": ["llama-cpp-python>=0.3"]}}}
    bounds = lower_bounds(pyproject)
    assert bounds == {"redis": Version("5.3"), "msgspec": Version("0.19")}
    pins = pinned("# header\nredis==8.0.0\nmsgspec==0.19.0\n")
    assert {name for name, bound in bounds.items() if pins.get(name) != bound} == {"redis"}
