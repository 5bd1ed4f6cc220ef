"""docker-compose.spark.yml agrees with docker-compose.yml and the code (nothing runs: no
Docker engine on the test machine): its services use the project image, the workers and
the control plane name the master's address, and every setting is a valid ``Settings``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from controlplane.config import Settings

ROOT = Path(__file__).resolve().parent.parent


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())["services"]


def test_spark_services_run_the_project_image_against_one_master() -> None:
    base, spark = load("docker-compose.yml"), load("docker-compose.spark.yml")
    image = base["controlplane"]["image"]
    master, worker = spark["spark-master"], spark["spark-worker"]
    assert master["image"] == worker["image"] == image
    assert master["command"][:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    host = master["command"][master["command"].index("--host") + 1]
    port = master["command"][master["command"].index("--port") + 1]
    url = f"spark://{host}:{port}"
    assert worker["command"][-1] == url and "spark-master" in worker["depends_on"]
    env = spark["controlplane"]["environment"]
    assert env["STREAMPILOT_SPARK_MASTER"] == url
    # spark-class comes with pip's pyspark, which the image installs (the spark extra).
    assert (Path(sys.executable).parent / "spark-class").exists()
    assert spark["worker"]["deploy"]["replicas"] == 0  # workers come from Spark


def test_the_control_plane_settings_are_valid_and_reachable_by_executors() -> None:
    base, spark = load("docker-compose.yml"), load("docker-compose.spark.yml")
    env = {**base["controlplane"]["environment"], **spark["controlplane"]["environment"]}
    fields = {f"STREAMPILOT_{name.upper()}" for name in Settings.model_fields}
    assert set(spark["controlplane"]["environment"]) <= fields
    conf = json.loads(env["STREAMPILOT_SPARK_CONF"])
    settings = Settings(
        backend=env["STREAMPILOT_BACKEND"],
        spark_master=env["STREAMPILOT_SPARK_MASTER"],
        spark_conf=conf,
        local_workers=int(env["STREAMPILOT_LOCAL_WORKERS"]),
        coordinator_host=env["STREAMPILOT_COORDINATOR_HOST"],
    )
    assert settings.backend == "spark" and settings.local_workers > 0
    # The coordinator listens everywhere; executors dial it at the driver's service name.
    assert settings.coordinator_host == "0.0.0.0"
    assert conf["spark.driver.host"] == "controlplane" and "controlplane" in base
