"""The cluster config's CPU and memory settings: the reserve per node, the defaults per
GPU of jobs that ask nothing and the maximum memory per CPU (mgpu.config)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mgpu.config import ConfigError, load_config
from mgpu.master.state.asks import AskRules, defaults_apply
from mgpu.model import Job
from mgpu.resources import NO_ASK, ResourceAsk
from mgpu.slurmoptions import SlurmOptions


def test_sizes_take_slurms_units_and_the_node_reserve_replaces_the_clusters(
    tmp_path: Path,
) -> None:
    config = load_config(
        _write(
            tmp_path,
            """
resources:
  reserve: {cpus: 2, mem: 4G}
  def_cpus_per_gpu: 8
  def_mem_per_gpu: 32000
  max_mem_per_cpu: 8G
nodes:
  - {node_id: gpu01, reserve: {cpus: 1}}
  - {node_id: gpu02}
partitions:
  - {name: debug, def_mem_per_gpu: 1G}
""",
        )
    )
    assert (config.reserve("gpu01").cpus, config.reserve("gpu01").mem) == (1, 0)
    assert (config.reserve("gpu02").cpus, config.reserve("gpu02").mem) == (2, 4096)
    assert config.resources.def_mem_per_gpu == 32000 and config.resources.max_mem_per_cpu == 8192
    rules = AskRules.from_config(config)
    debug = rules.partitions["debug"]
    assert (debug.def_cpus_per_gpu, debug.def_mem_per_gpu, debug.max_mem_per_cpu) == (
        8,  # from the cluster's
        1024,
        8192,
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("resources: {reserve: {cpus: -1}}", "resources.reserve.cpus"),
        ("resources: {def_mem_per_gpu: lots}", "'lots' is not a memory size"),
        ("resources: {def_cpus_per_gpu: 0}", "resources.def_cpus_per_gpu"),
        ("resources: {reserve: {cores: 2}}", "resources.reserve.cores: unknown key"),
        ("partitions: [{name: a, max_mem_per_cpu: -1G}]", "partitions[0].max_mem_per_cpu"),
    ],
)
def test_bad_settings_are_refused_with_the_field(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=f"^{tmp_path}.*{re.escape(error)}"):
        load_config(_write(tmp_path, text))


def test_defaults_fill_only_what_a_job_did_not_ask(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "resources: {def_cpus_per_gpu: 4, def_mem_per_gpu: 2G}"))
    rules = AskRules.from_config(config)
    d = rules.cluster
    assert defaults_apply(NO_ASK, d) == ResourceAsk(cpus_per_gpu=4, mem_per_gpu_mb=2048)
    assert defaults_apply(ResourceAsk(cpus_per_node=1), d) == ResourceAsk(
        cpus_per_node=1, mem_per_gpu_mb=2048
    )
    assert defaults_apply(ResourceAsk(mem_per_node_mb=0), d).mem_per_gpu_mb is None
    whole = ResourceAsk(exclusive=True)
    assert defaults_apply(whole, d) == whole
    job = Job(id="1", user="u", argv=["true"], command="true")
    assert rules.effective(job) == ResourceAsk(cpus_per_gpu=4, mem_per_gpu_mb=2048)
    assert job.ask is NO_ASK  # as given
    nothing = AskRules.from_config(load_config(None))
    assert nothing.effective(job) is NO_ASK
    job.slurm = SlurmOptions(partition="nowhere")  # a partition without settings: the cluster's
    assert rules.effective(job).cpus_per_gpu == 4


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path
