"""How an agent was started (`mgpu node`'s options): one value, handed to the agent and
to its health check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgpu.agent import devices

__all__ = ["AgentOptions"]


@dataclass(frozen=True)
class AgentOptions:
    node_id: str
    master_host: str
    master_port: int
    state_dir: Path
    fake_gpus: int | None = None
    """This many fake GPUs instead of the machine's (tests, demos); None: the real ones."""
    fake_cpus: int | None = None
    """This many fake CPUs (ids 0..N-1) instead of the machine's; None: the real ones."""
    fake_mem_mb: int | None = None
    """This much memory (MiB) instead of the machine's MemTotal; None: the real one."""
    advertise_ip: str | None = None
    """The IP the master and other nodes reach this one at; None: the connection's own."""
    token: str | None = None
    """The join token; None: found in the state dir or $MGPU_JOIN_TOKEN."""
    insecure: bool = False
    """Plain WebSocket, no TLS."""
    scheme: str | None = None
    """`--master-host https://...` ("https": TLS only, from the first dial) or `http://`
    (plain, as --insecure); None: as mgpu.masters.Transport decides."""
    container_runtime: str = "auto"
    gpu_device_dir: Path = devices.DEFAULT_DIR
    """Where the GPUs' device files are (nvidia0, ...): jobs may open only their own."""
    gpu_count: int | None = None
    """Manage only the node's first N GPUs (`mgpu node --gpu-count N`); None: all."""
    masters: tuple[tuple[str, int], ...] = ()
    """Every master's (host, port) when several were given (`--master-host a,b`: one
    leads, the others stand by); empty: the one of `master_host` and `master_port`."""

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The masters to dial, in order (`masters`, else `master_host:master_port`)."""
        return list(self.masters) or [(self.master_host, self.master_port)]

    @property
    def node_dir(self) -> Path:
        """The node's own files: its identity, its spool."""
        return self.state_dir / f"node-{self.node_id}"
