"""cluster_config.yaml: validation, `mgpu config check`, and what the master does with it."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers import BIN, local_cluster, wait_for
from mgpu import MgpuError
from mgpu.config import ConfigError, load_config
from mgpu.spec import normalize_gpu_type

SEED_CONFIG = """
cluster:
  name: "gpu-cluster"
  master:
    host: "master.example.com"
    port: 8080

nodes:
  - node_id: "node001"
    hostname: "gpu001.example.com"
    ip: "192.168.1.10"
    port: 8081
    gpu_count: 8
    gpu_type: "A100"
    rack: r1

  - node_id: "node002"
    hostname: "gpu002.example.com"
    ip: "192.168.1.11"
    port: 8081
    gpu_count: 8
    gpu_type: "A100"
    switch: s7

networking:
  heartbeat_interval: 30
  timeout: 60

scheduling:
  default_policy: "fill_first"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster_config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_seed_format_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_CONFIG))
    assert cfg.cluster.name == "gpu-cluster"
    assert [n.node_id for n in cfg.nodes] == ["node001", "node002"]
    assert cfg.networking.timeout == 60
    assert cfg.scheduling.default_policy == "fill_first"
    assert cfg.scheduling.max_retries == 5  # the seed's hard-coded value, now a default
    assert cfg.scheduling.node_failure_threshold == 3


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        ("networking:\n  heartbeat_intervall: 5\n", "networking.heartbeat_intervall", "unknown"),
        ("networking:\n  timeout: soon\n", "networking.timeout", "number"),
        ("scheduling:\n  default_policy: random\n", "scheduling.default_policy", "fill_first"),
        (
            "nodes:\n  - node_id: a\n  - node_id: a\n",
            "nodes",
            "duplicate node_id 'a'",
        ),
        ("nodes:\n  - hostname: x\n", "nodes[0].node_id", "required"),
        ("- just\n- a list\n", "", "mapping"),
        ("cluster: [unclosed\n", "", "YAML"),
        ("limits:\n  max_output_per_job: lots\n", "limits.max_output_per_job", "not a size"),
        ("limits:\n  max_output_per_job: -1\n", "limits.max_output_per_job", "greater than"),
    ],
)
def test_bad_configs_name_file_field_and_reason(
    tmp_path: Path, text: str, field: str, why: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert field in message and why.lower() in message.lower()


@pytest.mark.parametrize(
    ("value", "cap"),
    [("", 1 << 30), ("null", None), ("4096", 4096), ("512M", 512 << 20), ("2 GiB", 2 << 30)],
)
def test_the_output_cap_is_bytes_or_a_size(tmp_path: Path, value: str, cap: int | None) -> None:
    text = f"limits:\n  max_output_per_job: {value}\n" if value else ""
    assert load_config(write(tmp_path, text)).limits.max_output_per_job == cap


def test_config_check_command(tmp_path: Path) -> None:
    good = subprocess.run(
        [str(BIN / "mgpu"), "config", "check", str(write(tmp_path, SEED_CONFIG))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert good.returncode == 0 and "OK (2 nodes" in good.stdout
    bad = subprocess.run(
        [str(BIN / "mgpu"), "config", "check", str(write(tmp_path, "nodez: []\n"))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0
    assert bad.stderr.startswith("mgpu: error: ") and "nodez: unknown key" in bad.stderr
    assert bad.stderr.count("\n") == 1
    missing = subprocess.run(
        [str(BIN / "mgpu"), "master", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode != 0 and "cannot read the file" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_unlisted_nodes_refused_when_the_config_says_so(tmp_path: Path) -> None:
    config = """
    cluster:
      allow_unlisted_nodes: false
    nodes:
      - {node_id: node001, gpu_type: H100, rack: r1}
    """
    with local_cluster(tmp_path, agents=1, gpus=2, config=textwrap.dedent(config)) as c:
        argv = [str(BIN / "mgpu"), "node", "--node-id", "stranger", "--fake-gpus", "1"]
        argv += ["--master-port", str(c.port), "--state-dir", str(tmp_path / "stranger")]
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=c.env,
            timeout=60,
        )
        assert res.returncode != 0
        assert "not listed in the cluster config" in res.stderr
        # The config's gpu_type names node001's GPUs (the fake ones say A100).
        with pytest.raises(MgpuError, match="A100"):
            c.client().submit("true", gpu_type="A100")
        job = c.client().submit("echo typed", gpu_type="h100")
        assert c.client().wait(job.id, timeout=30)["state"] == "completed"


def test_gpu_type_names_are_matched_by_model() -> None:
    assert normalize_gpu_type("NVIDIA A100-SXM4-80GB") == "A100"
    assert normalize_gpu_type("a100") == "A100"
    assert normalize_gpu_type("NVIDIA GeForce RTX 3060") == "RTX3060"
    assert normalize_gpu_type("rtx 3060") == "RTX3060"
    assert normalize_gpu_type("Tesla V100-SXM2-16GB") == "V100"
    assert normalize_gpu_type("Fake GPU (simulated A100)") == "A100"
    assert normalize_gpu_type(None) is None


def test_spread_and_fill_first_per_cluster_and_per_job(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=2, gpus=4) as c:
        client = c.client()
        first = client.submit("sleep 300", gpus=1)
        node_a = wait_for(
            lambda: (j := client.show(first.id))["allocation"] and j, what="first placed"
        )["allocation"][0]["node_id"]
        packed = client.submit("sleep 300", gpus=1)  # default fill_first: same node
        spread = client.submit("sleep 300", gpus=1, policy="spread")  # the emptier node
        pa = wait_for(lambda: client.show(packed.id)["allocation"], what="packed")
        sp = wait_for(lambda: client.show(spread.id)["allocation"], what="spread")
        assert pa[0]["node_id"] == node_a
        assert sp[0]["node_id"] != node_a
        for j in (first, packed, spread):
            client.cancel(j.id)
