"""compose.yaml can't be run here (no Docker engine): check it says what users need."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_services_images_and_commands() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "kafka", "worker"}
    redis, kafka, worker = services["redis"], services["kafka"], services["worker"]
    assert redis["image"].startswith("redis:")
    assert "--appendonly" in redis["command"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft: no ZooKeeper
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # we create topics explicitly
    assert worker["build"] == "."
    assert worker_command()[:3] == ["debatebus", "worker", "debatebus._demo:app"]
    assert worker["environment"]["DEBATEBUS_BROKER"] == "redis://redis:6379/0"
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"


def shell_words(form: list[str], shell: str) -> list[str]:
    """The words a ``[shell, script]`` command runs, ``$$`` read as compose reads it: a ``$`` for
    the container's shell."""
    assert form[:-1] == shell.split() and len(form) == len(shell.split()) + 1, form
    return shlex.split(form[-1].replace("$$", "$"))


def worker_command() -> list[str]:
    words = shell_words(compose()["services"]["worker"]["command"], "sh -c")
    assert words[0] == "exec"  # the worker is the container's main process, and gets its signals
    return words[1:]


def test_every_service_has_a_healthcheck_and_the_worker_uses_debatebus_check() -> None:
    services = compose()["services"]
    for name, service in services.items():
        assert "healthcheck" in service, name
    check = shell_words(services["worker"]["healthcheck"]["test"], "CMD-SHELL")
    assert check[:2] == ["debatebus", "check"]
    # The check follows this container's worker: both are named by the container's hostname.
    name = worker_command()[worker_command().index("--consumer") + 1]
    assert name == "$HOSTNAME"
    assert check[check.index("--consumer") + 1] == name
    timeout = float(check[check.index("--timeout") + 1])
    assert timeout < float(services["worker"]["healthcheck"]["timeout"].removesuffix("s"))


def test_every_service_restarts_unless_stopped() -> None:
    for name, service in compose()["services"].items():
        assert service.get("restart") == "unless-stopped", name


def test_the_dockerfile_builds_what_the_worker_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "scripts/install-local-model.sh" in dockerfile  # the local model, built portably
    assert 'CMD ["debatebus", "worker", "debatebus._demo:app"]' in dockerfile
    assert (ROOT / "scripts" / "install-local-model.sh").exists()
