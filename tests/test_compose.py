"""compose.yaml can't be run here (no Docker engine): check it says what users need."""

from __future__ import annotations

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
    assert worker["command"][:3] == ["debatebus", "worker", "debatebus.demo:app"]
    assert worker["environment"]["DEBATEBUS_BROKER"] == "redis://redis:6379/0"
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"


def test_every_service_has_a_healthcheck_and_the_worker_uses_debatebus_check() -> None:
    services = compose()["services"]
    for name, service in services.items():
        assert "healthcheck" in service, name
    assert services["worker"]["healthcheck"]["test"][:3] == ["CMD", "debatebus", "check"]


def test_every_service_restarts_unless_stopped() -> None:
    for name, service in compose()["services"].items():
        assert service.get("restart") == "unless-stopped", name


def test_the_dockerfile_builds_what_the_worker_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "scripts/install-local-model.sh" in dockerfile  # the local model, built portably
    assert 'CMD ["debatebus", "worker", "debatebus.demo:app"]' in dockerfile
    assert (ROOT / "scripts" / "install-local-model.sh").exists()
