"""The cluster configuration file (`cluster_config.yaml`, the seeds' format).

Loaded into pydantic models that forbid unknown keys, so a typo is refused with
the file, the field and the reason instead of being silently ignored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mgpu.hostlist import HostlistError, expand
from mgpu.kubesection import KubernetesSection
from mgpu.resources import SizeError, parse_size_mb
from mgpu.spec import SpecError, parse_time_limit


class ConfigError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MasterAddr(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    header_timeout: float = Field(default=10.0, gt=0, le=600)
    """Seconds a connection has to send a request's line and headers, from its opening or
    from the end of its previous answer; then it is closed (a body or an answer is not
    timed)."""
    connections_per_address: int = Field(default=1024, ge=1)
    """Open HTTP connections one client address may hold; more are refused with a 503.
    Every local account shares 127.0.0.1, and `bench/abuse.py` opens 900 at once from it
    (three floods of 300): generous for that, yet below the master's descriptors (it raises
    its soft limit to the hard one at start)."""
    pending_hellos: int = Field(default=64, ge=1)
    """Agent connections waiting for their hello at once; more are closed (they retry)."""
    websockets_per_address: int = Field(default=256, ge=1)
    """Client WebSockets (`srun --pty`, `alloc`: /api/jobs/ID/attach) one address may hold
    open; more are refused with a 429.  An upgraded connection no longer counts in
    `connections_per_address`, so this bounds them apart."""
    websockets_per_user: int = Field(default=64, ge=1)
    """Client WebSockets one user may hold open (from all addresses)."""
    websockets_per_job: int = Field(default=16, ge=1)
    """Client WebSockets open to one job (its steps included)."""


def _size_mb(value: object) -> object:
    """A memory size in MiB: a number (MiB) or Slurm's text (`4G`, `512M`)."""
    if isinstance(value, str):
        try:
            return parse_size_mb(value)
        except SizeError as e:
            raise ValueError(str(e)) from None
    return value


MiB = Annotated[int, BeforeValidator(_size_mb), Field(ge=0, le=1 << 40)]
"""Memory in the config: MiB, given as a number or with Slurm's units (`4G`)."""


class Reserve(_Strict):
    """What a node holds back for its system, never given to jobs (Slurm's CoreSpecCount
    and MemSpecLimit): its highest-numbered CPUs, whole cores first, and memory."""

    cpus: int = Field(default=0, ge=0, le=4096)
    mem: MiB = 0


class JobResourceDefaults(_Strict):
    """What a job gets when it asks for no CPUs or no memory (Slurm's DefCpuPerGPU,
    DefMemPerGPU), and the most it may ask (MaxMemPerCPU).  None: no default (such a job
    shares its node's CPUs or memory), no maximum."""

    def_cpus_per_gpu: int | None = Field(default=None, ge=1, le=4096)
    def_mem_per_gpu: MiB | None = None
    max_mem_per_cpu: MiB | None = None


class Resources(JobResourceDefaults):
    """CPUs and memory, cluster-wide: the reserve on every node (a node's own `reserve`
    replaces it), and the defaults and maxima of jobs (a partition's replace them)."""

    reserve: Reserve = Field(default_factory=Reserve)


class ClusterSection(_Strict):
    name: str = "mgpu"
    master: MasterAddr = Field(default_factory=MasterAddr)
    allow_unlisted_nodes: bool = True


class NodeEntry(_Strict):
    node_id: str
    hostname: str | None = None
    ip: str | None = None
    port: int | None = None
    """Accepted for the seeds' format; agents dial the master, so it is unused."""
    gpu_count: int | None = Field(default=None, ge=0)
    gpu_type: str | None = None
    rack: str | None = None
    switch: str | None = None
    reserve: Reserve | None = None
    """Held back on this node for its system; None: `resources.reserve`."""


class Networking(_Strict):
    heartbeat_interval: float = Field(default=5.0, gt=0)
    timeout: float = Field(default=30.0, gt=0)
    max_heartbeats_per_second: float = Field(default=50.0, ge=0)
    """Past this many nodes x heartbeats a second, the interval (and the timeout with it)
    stretches to keep the cluster's heartbeats at this rate; 0: never
    (master/control/heartbeats.py)."""


class PriorityWeightsConf(_Strict):
    age: float = 1000.0
    fairshare: float = 10000.0
    job_size: float = 100.0
    user_priority: float = 1000.0
    max_age_hours: float = 168.0


class BillingConf(_Strict):
    """What fairshare charges per second a job holds each (Slurm's TRESBillingWeights)."""

    gpu: float = Field(default=1.0, ge=0)
    cpu: float = Field(default=0.0, ge=0)
    mem_gb: float = Field(default=0.0, ge=0)


class Scheduling(_Strict):
    default_policy: Literal["fill_first", "spread"] = "fill_first"
    policy: Literal["fifo", "priority", "backfill"] = "backfill"
    max_retries: int = Field(default=5, ge=0)
    node_failure_threshold: int = Field(default=3, ge=1)
    retry_backoff_base: float = Field(default=1.0, ge=0)
    retry_backoff_max: float = Field(default=300.0, ge=0)
    default_time_limit: str | None = None
    kill_grace: float = Field(default=10.0, ge=0)
    fairshare_half_life_hours: float = Field(default=168.0, gt=0)
    weights: PriorityWeightsConf = Field(default_factory=PriorityWeightsConf)
    billing: BillingConf = Field(default_factory=BillingConf)
    """Fairshare's charge per GPU, CPU and GiB of memory held (default: GPU-hours)."""
    shares: dict[str, float] = Field(default_factory=dict)
    max_gpus_per_user: int | None = Field(default=None, ge=0)
    max_running_jobs_per_user: int | None = Field(default=None, ge=0)
    preemption: bool = True
    foreign_memory_threshold_mb: int = Field(default=1024, ge=0)
    """A GPU with more memory than this used outside mgpu is not allocated."""
    idle_after_minutes: float = Field(default=30.0, gt=0)
    """A running job whose GPUs stay near 0% utilisation this long is flagged idle."""
    idle_action: Literal["none", "notify", "cancel"] = "none"
    """What happens to an idle interactive job: nothing, a note in its output, cancel."""
    preempt_signal: str | None = None
    """`[B:]SIG@SECONDS` (as `--signal`): a preempted job without a `--signal` of its own
    is sent SIG, then given SECONDS to save its work before it is stopped.  None: only the
    usual SIGTERM, `kill_grace`, SIGKILL."""

    @field_validator("preempt_signal")
    @classmethod
    def _signal(cls, value: str | None) -> str | None:
        if value is not None:
            from mgpu.signalspec import format_signal, parse_signal

            return format_signal(parse_signal(value))  # a SpecError names the problem
        return value


class AccessRule(_Strict):
    """Nodes (ids or node group names) that only these users / Unix groups may use."""

    nodes: list[str]
    users: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)


class Security(_Strict):
    allow_root_jobs: bool = False
    """Allow explicit root grants: the owner's `mgpu token create USER --allow-root` (refused
    while off, and existing grants then count for nothing).  The owner's admin-token runs
    uid-0 jobs either way; no other token ever does without a grant."""
    node_groups: dict[str, list[str]] = Field(default_factory=dict)
    access: list[AccessRule] = Field(default_factory=list)
    """A node named by any rule is open only to the users and groups of its rules."""

    def restricted_nodes(self) -> dict[str, tuple[set[str], set[str]]]:
        """node id -> (users, groups) allowed; nodes absent are open to everyone."""
        out: dict[str, tuple[set[str], set[str]]] = {}
        for rule in self.access:
            for name in rule.nodes:
                for node in self.node_groups.get(name, [name]):
                    users, groups = out.setdefault(node, (set(), set()))
                    users.update(rule.users)
                    groups.update(rule.groups)
        return out


class Admission(_Strict):
    """Rules a job must meet at submit (see mgpu.master.control.admission); unset = no limit."""

    max_gpus_per_job: int | None = Field(default=None, ge=0)
    max_nodes_per_job: int | None = Field(default=None, ge=1)
    max_time_per_job: str | None = None
    """Slurm syntax (`2-00:00:00`); a job without --time gets this as its limit."""
    allowed_users: list[str] = Field(default_factory=list)
    allowed_groups: list[str] = Field(default_factory=list)
    """When either list is set, only these users / members of these Unix groups submit."""
    validator: str | None = None
    """A command (run with /bin/sh -c) given the job as JSON on stdin: non-zero refuses
    the job, its first line of output being the reason (the seeds' job_validator.sh)."""
    validator_timeout: float = Field(default=10.0, gt=0)

    @field_validator("max_time_per_job")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            from mgpu.spec import parse_time_limit

            parse_time_limit(value)  # a SpecError (ValueError) names the problem
        return value


class Site(_Strict):
    """Site integration: prolog/epilog scripts run by every agent, admission control."""

    prolog: str | None = None
    """Run by the agent before every job (as the agent's user, with the job's environment);
    failure or time-out = node failure: the job is requeued free, the node counts it."""
    epilog: str | None = None
    """Run by the agent after every job; failure or time-out drains the node."""
    prolog_timeout: float = Field(default=30.0, gt=0)
    epilog_timeout: float = Field(default=30.0, gt=0)
    admission: Admission = Field(default_factory=Admission)


class Smtp(_Strict):
    """The mail relay that sends `--notify mailto:` / `--mail-user` notifications."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    host: str
    port: int = Field(default=25, ge=1, le=65535)
    sender: str = Field(default="mgpu@localhost", alias="from")
    starttls: bool = False
    timeout: float = Field(default=10.0, gt=0)


class Notify(_Strict):
    """Notifications when jobs end (mgpu.master.control.notify)."""

    webhook: str | None = None
    """Every job without a `--notify` of its own is reported here (http or https)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """When set, `--notify` may name only these hosts (`*.example.org` for a domain).
    Loopback, link-local and private addresses are refused unless named here."""
    smtp: Smtp | None = None

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """`4096`, `512K`, `64M`, `1G`, `1GiB`: bytes (binary units, as Slurm's --mem)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a size: give bytes or a number with K, M, G or T")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


class Limits(_Strict):
    """What the master keeps for one job."""

    max_output_per_job: int | None = Field(default=1 << 30, ge=0)
    """Bytes of a job's stored output (its file on the master, all its runs together): past
    them one marker line is stored and the rest dropped; the job runs on.  None: no cap."""

    max_output_per_user: int | None = Field(default=20 << 30, ge=0)
    """Bytes of stored output over all of a user's job files: past them each of the user's
    jobs stores one marker line and drops the rest, until retention frees room.  None: no
    cap."""

    @field_validator("max_output_per_job", "max_output_per_user", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value


class Retention(_Strict):
    """How long the master keeps what finished (days; None: for ever).  Pruned a slice at a
    time by master/control/retention.py."""

    output_days: float | None = Field(default=90.0, gt=0)
    """Output files of jobs that ended this long ago."""
    jobs_days: float | None = Field(default=365.0, gt=0)
    """Rows of jobs that ended this long ago (their output file goes with them)."""
    audit_days: float | None = Field(default=365.0, gt=0)
    """Audit events this old."""


DEFAULT_PARTITION = "main"
"""The partition of a cluster whose config names none: every node (SLURM_JOB_PARTITION)."""


class Partition(JobResourceDefaults):
    """A named group of nodes Slurm jobs ask for (`sbatch --partition NAME`); its
    `def_cpus_per_gpu`, `def_mem_per_gpu` and `max_mem_per_cpu`, where set, replace the
    cluster's (`resources`) for its jobs."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
    nodes: list[str] = Field(default_factory=list)
    """Node ids, or host lists of them (`node[01-04]`); empty: every node."""
    default: bool = False
    """The partition of jobs that name none (else the first listed)."""
    max_time: str | None = None
    """The longest --time a job may ask for here, Slurm's syntax (`2-00:00:00`); it is
    also the limit of a job that gives none."""
    kubernetes: KubernetesSection | None = None
    """Its nodes are a Kubernetes cluster's Nodes and its jobs run as Pods."""

    @model_validator(mode="after")
    def _kube_lists_no_nodes(self) -> Partition:
        if self.kubernetes is not None and self.nodes:
            raise ValueError(
                f"partition {self.name!r} is backed by Kubernetes: its nodes are the Nodes "
                "its kubernetes.node_selector picks, not a list"
            )
        return self

    @field_validator("nodes")
    @classmethod
    def _hostlists(cls, nodes: list[str]) -> list[str]:
        try:
            return [n for item in nodes for n in expand(item)]
        except HostlistError as e:
            raise ValueError(str(e)) from None

    @field_validator("max_time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_time_limit(value)
            except SpecError as e:
                raise ValueError(str(e)) from None
        return value

    def node_ids(self) -> tuple[str, ...]:
        return tuple(self.nodes)


class HighAvailability(_Strict):
    """Several masters on one PostgreSQL database (master/ha/leadership.py): the leader's
    lease and a new leader's patience.  The defaults give a failover within 5 s."""

    lease_ttl: float = Field(default=2.5, gt=0, le=600)
    """Seconds a leader's lease lasts past its last renewal (the database's clock)."""
    renew_interval: float = Field(default=0.5, gt=0)
    """Seconds between the leader's renewals (well under the TTL)."""
    retry_interval: float = Field(default=0.5, gt=0)
    """Seconds between a standby's tries to take the lease."""
    takeover_grace: float | None = Field(default=None, ge=0)
    """Seconds after a master took over the lease during which no node it loaded is
    declared lost and no job requeued for it, while the agents reconnect and report what
    they run; default `networking.timeout` + 15."""

    @model_validator(mode="after")
    def _renew_within_ttl(self) -> HighAvailability:
        if self.renew_interval * 2 > self.lease_ttl:
            raise ValueError(
                f"ha.renew_interval ({self.renew_interval:g} s) must be at most half of "
                f"ha.lease_ttl ({self.lease_ttl:g} s): one late renewal must not lose the lease"
            )
        return self


class ClusterConfig(_Strict):
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    nodes: list[NodeEntry] = Field(default_factory=list)
    networking: Networking = Field(default_factory=Networking)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    security: Security = Field(default_factory=Security)
    site: Site = Field(default_factory=Site)
    notify: Notify = Field(default_factory=Notify)
    limits: Limits = Field(default_factory=Limits)
    retention: Retention = Field(default_factory=Retention)
    ha: HighAvailability = Field(default_factory=HighAvailability)
    partitions: list[Partition] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    database: str | None = None
    """`postgresql://USER@HOST:PORT/DB` (or libpq's keyword form): the master keeps its state
    there (several masters may share it); None: SQLite in the state dir.  `mgpu master
    --database` overrides it.  A password here only in a file no other account may read
    (`load_config` checks)."""
    refuse_unknown_partition: bool = False
    """A Slurm job naming a partition that does not exist: refused (as Slurm does), instead
    of one warning and the default partition."""

    @field_validator("partitions")
    @classmethod
    def _one_default(cls, partitions: list[Partition]) -> list[Partition]:
        names = [p.name for p in partitions]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"partition {twice[0]!r} is listed twice")
        if sum(p.default for p in partitions) > 1:
            raise ValueError("more than one partition says default: true")
        return partitions

    def default_partition(self) -> Partition:
        """The partition of jobs that name none: the one marked default, else the first,
        else (no partitions configured) every node under DEFAULT_PARTITION."""
        marked = [p for p in self.partitions if p.default]
        if marked or self.partitions:
            return (marked or self.partitions)[0]
        return Partition(name=DEFAULT_PARTITION, default=True)

    def all_partitions(self) -> list[Partition]:
        return self.partitions or [self.default_partition()]

    def partition(self, name: str) -> Partition | None:
        return next((p for p in self.all_partitions() if p.name == name), None)

    def kube_partitions(self) -> list[Partition]:
        """The partitions backed by Kubernetes (mgpu.master.kube)."""
        return [p for p in self.partitions if p.kubernetes is not None]

    @field_validator("nodes")
    @classmethod
    def _unique_node_ids(cls, nodes: list[NodeEntry]) -> list[NodeEntry]:
        seen: set[str] = set()
        for n in nodes:
            if n.node_id in seen:
                raise ValueError(f"duplicate node_id {n.node_id!r}")
            seen.add(n.node_id)
        return nodes

    def reserve(self, node_id: str) -> Reserve:
        """What node `node_id` holds back for its system."""
        entry = self.node(node_id)
        if entry is not None and entry.reserve is not None:
            return entry.reserve
        return self.resources.reserve

    def node(self, node_id: str) -> NodeEntry | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_config(path: str | Path | None) -> ClusterConfig:
    """Read and validate a config file; None gives the defaults."""
    if path is None:
        return ClusterConfig()
    import yaml

    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the file: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{p}: not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    try:
        config = ClusterConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = _field_path(tuple(err["loc"]))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        return_msg = f"{p}: {field}: {msg}"
        raise ConfigError(return_msg) from None
    if config.database:
        _check_database(p, config.database)
    return config


def _check_database(p: Path, database: str) -> None:
    """`database:` is an address libpq reads, and holds a password only in a config file
    that no other account may read (a world-readable /etc file is the usual place for a
    config; it is as public as a command line)."""
    from mgpu.dbaddress import PASSWORD_PLACES, AddressError, parse, secrets

    try:
        found = secrets(parse(database, f"{p}: database:"))
    except AddressError as e:
        raise ConfigError(str(e)) from None
    mode = p.stat().st_mode & 0o777
    if found and mode & 0o077:
        raise ConfigError(
            f"{p}: database: holds a password, but other accounts may read this file "
            f"(permissions {mode:04o}): chmod 600 {p}, or leave the password out and put "
            f"it in {PASSWORD_PLACES}"
        )
