"""docker-compose.yml, checked without a Docker engine: its shape, and that it is the topology we test.

CI has no Docker engine to run `docker compose config`, so the file is validated against the part
of the Compose specification it uses (unknown keys are errors, as Compose's own schema makes
them), then its references and the scale-out topology are checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

ROOT = Path(__file__).resolve().parents[2]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Healthcheck(_M):
    test: list[str]
    interval: str
    timeout: str
    retries: int


class DependsOn(_M):
    condition: Literal["service_started", "service_healthy", "service_completed_successfully"]


class Service(_M):
    image: str | None = None
    build: str | None = None
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    environment: dict[str, str | None] | None = None  # None: taken from the shell, as Compose does
    ports: list[str] | None = None
    volumes: list[str] | None = None
    depends_on: dict[str, DependsOn] | None = None
    healthcheck: Healthcheck | None = None
    stop_grace_period: str | None = None


class Compose(_M):
    services: dict[str, Service]
    volumes: dict[str, None] | None = None


def _load() -> dict[str, Any]:
    text = (ROOT / "docker-compose.yml").read_text()
    # ${VAR:-default} is Compose's interpolation; resolve defaults as `docker compose config` would.
    text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)
    raw = yaml.safe_load(text)
    return {k: v for k, v in raw.items() if not k.startswith("x-")}


@pytest.fixture(scope="module")
def compose() -> Compose:
    return Compose.model_validate(_load())


def test_references_resolve(compose: Compose) -> None:
    for name, svc in compose.services.items():
        assert svc.image or svc.build, name
        for dep in svc.depends_on or {}:
            assert dep in compose.services, f"{name} depends on unknown service {dep}"
        for vol in svc.volumes or []:
            source = vol.split(":")[0]
            if not source.startswith((".", "/")):
                assert compose.volumes and source in compose.volumes, f"{name}: undeclared volume {source}"
            else:
                assert (ROOT / source).exists(), f"{name}: missing file {source}"


def test_topology_is_two_replicas_behind_a_balancer(compose: Compose) -> None:
    s = compose.services
    replicas = [n for n, svc in s.items() if svc.command and "--config" in svc.command]
    assert sorted(replicas) == ["router-a", "router-b"]
    envs = [s[r].environment or {} for r in replicas]
    # Stateless replicas: the same Redis, the same PostgreSQL, the same trace collector.
    for key in ("ROUTER_REDIS_URL", "ROUTER_STORE", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        assert envs[0][key] == envs[1][key]
    assert envs[0]["ROUTER_REDIS_URL"].startswith("redis://redis:")
    assert envs[0]["ROUTER_STORE"].startswith("postgresql://") and "@postgres:" in envs[0]["ROUTER_STORE"]
    assert "phoenix" in envs[0]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    lb = s["lb"]
    assert set(lb.depends_on or {}) == {"router-a", "router-b"}
    nginx = (ROOT / "deploy/nginx.conf").read_text()
    assert "router-a:8080" in nginx and "router-b:8080" in nginx and "proxy_buffering off" in nginx
    for name in ("router-a", "router-b", "lb", "redis", "postgres", "phoenix", "upstream"):
        assert s[name].healthcheck is not None, f"{name} has no healthcheck"


def test_env_example_names_every_variable_compose_reads() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    documented = {
        line.split("=")[0] for line in (ROOT / ".env.example").read_text().splitlines() if "=" in line
    }
    assert used <= documented, used - documented


def test_prometheus_scrapes_both_replicas_and_grafana_loads_the_dashboard(compose: Compose) -> None:
    import json

    s = compose.services
    scrape = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    [job] = scrape["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert sorted(job["static_configs"][0]["targets"]) == ["router-a:8080", "router-b:8080"]
    assert any(v.endswith(":/etc/prometheus/prometheus.yml:ro") for v in s["prometheus"].volumes or [])
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/router.yml").read_text())
    mounted = {v.split(":")[1]: v.split(":")[0] for v in s["grafana"].volumes or []}
    assert mounted[provider["providers"][0]["options"]["path"]] == "./deploy/grafana/dashboards"
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/router.json").read_text())
    uids = {t.get("datasource", {}).get("uid") for p in dashboard["panels"] for t in [p]}
    assert uids == {datasource["datasources"][0]["uid"]}
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in (
        "throughput",
        "error",
        "ttft",
        "inter-token gap",
        "spend",
        "fallbacks",
        "breakers",
        "revision",
    ):
        assert topic in titles, topic
