"""docker-compose.yml and the Dockerfile agree with each other and with the code.

There is no Docker engine on the test machine, so nothing is built or run: the files are
parsed and every reference checked (services, images, ports, health dependencies, every
``STREAMPILOT_*`` variable against :class:`Settings`, every ``${VAR}`` against
``.env.example``, the database URL against the postgres service, the workers' coordinator
address against the control plane's settings, the Dockerfile's COPY sources and extras).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from controlplane.config import Settings

ROOT = Path(__file__).resolve().parent.parent
VAR = re.compile(r"\$\{(\w+)(?::?[-?+][^}]*)?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def resolve(value: str, env: dict[str, str]) -> str:
    return VAR.sub(lambda m: env[m.group(1)], value)


def example_env() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_every_service_has_an_image_and_buildable_context(compose: dict[str, Any]) -> None:
    images = {s.get("image") for s in services(compose).values() if "build" in s}
    for name, service in services(compose).items():
        assert "image" in service or "build" in service, f"service {name} has no image"
        if "build" in service:
            context = service["build"] if isinstance(service["build"], str) else "."
            assert (ROOT / context / "Dockerfile").is_file(), f"{name}: no Dockerfile"
        elif service["image"].startswith("streampilot"):
            assert service["image"] in images, f"{name} uses an image no service builds"


def test_dependencies_exist_and_health_conditions_have_healthchecks(
    compose: dict[str, Any], dockerfile: list[tuple[str, str]]
) -> None:
    svc = services(compose)
    built_healthcheck = any(op == "HEALTHCHECK" for op, _ in dockerfile)
    for name, service in svc.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in svc, f"{name} depends on unknown service {dep}"
            if spec.get("condition") == "service_healthy":
                has = "healthcheck" in svc[dep] or (
                    svc[dep].get("image", "").startswith("streampilot") and built_healthcheck
                )
                assert has, f"{name} waits for {dep} to be healthy, but {dep} has no healthcheck"
    assert svc["controlplane"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_streampilot_variables_are_settings_fields(compose: dict[str, Any]) -> None:
    fields = {f"STREAMPILOT_{name.upper()}" for name in Settings.model_fields}
    for name in ("controlplane",):
        unknown = {k for k in env_of(services(compose)[name]) if k.startswith("STREAMPILOT_")}
        assert unknown - fields == set(), f"{name} sets variables Settings does not read"


def test_controlplane_settings_parse_and_match_the_other_services(
    compose: dict[str, Any],
) -> None:
    env = example_env()
    cp = services(compose)["controlplane"]
    values = {
        k.removeprefix("STREAMPILOT_").lower(): resolve(v, env)
        for k, v in env_of(cp).items()
        if k.startswith("STREAMPILOT_")
    }
    settings = Settings(**values)  # validates every value as the server would
    url = make_url(settings.database_url)
    pg = env_of(services(compose)["postgres"])
    assert url.host in services(compose), "the database host is not a service"
    assert url.username == pg["POSTGRES_USER"]
    assert url.database == pg["POSTGRES_DB"]
    assert url.password == resolve(pg["POSTGRES_PASSWORD"], env)
    assert url.drivername == "postgresql+psycopg"
    # The API port the server binds is the one published.
    argv = cp["command"]
    port = int(argv[argv.index("--port") + 1])
    assert any(str(p).split(":")[-1] == str(port) for p in cp["ports"])
    host_ports = [
        str(p).split(":")[0] for s in services(compose).values() for p in s.get("ports", [])
    ]
    assert len(host_ports) == len(set(host_ports)), "two services publish the same host port"
    # Workers dial the coordinator where it listens, with the same secret.
    worker = services(compose)["worker"]
    cmd = " ".join(worker["command"]) if isinstance(worker["command"], list) else worker["command"]
    words = shlex.split(cmd.replace("$$", "$"))
    address = words[words.index("--coordinator") + 1]
    host, _, wport = address.partition(":")
    assert host == "controlplane" and int(wport) == settings.coordinator_port
    assert settings.coordinator_host == "0.0.0.0", "the coordinator must listen beyond loopback"
    assert settings.local_workers == 0, "workers run in their own containers"
    assert env_of(worker)["STREAMPILOT_CLUSTER_SECRET"] == env_of(cp)["STREAMPILOT_CLUSTER_SECRET"]


def test_every_variable_is_documented_in_env_example(compose: dict[str, Any]) -> None:
    used = set(VAR.findall((ROOT / "docker-compose.yml").read_text()))
    assert used == set(example_env()), "docker-compose.yml and .env.example disagree"


def test_dockerfile_copies_what_exists_and_installs_a_real_extra(
    dockerfile: list[tuple[str, str]],
) -> None:
    for op, args in dockerfile:
        if op == "COPY":
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such path"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    arg = dict(a.split("=", 1) for op, a in dockerfile if op == "ARG" and "=" in a)
    assert arg["EXTRAS"] in extras, f"the image installs extra {arg['EXTRAS']!r}, not defined"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    copied = {args.split()[0] for op, args in dockerfile if op == "COPY"}
    for pattern in packages:
        assert pattern.rstrip("*") in copied, f"package {pattern} is not copied into the image"
    exposed = {int(p) for op, args in dockerfile if op == "EXPOSE" for p in args.split()}
    assert {8420, 8421} <= exposed
    cmd = next(args for op, args in dockerfile if op == "CMD")
    assert '"streampilot", "server"' in cmd
