"""Every message between the master and a node agent.

Messages are JSON objects over one WebSocket that the agent dials.  Each has a
`type`; `parse_agent_message` / `parse_master_message` turn raw JSON into the
typed models and refuse anything else.  Job-scoped messages carry the
allocation `epoch`, so a message from an older run of a requeued job is
recognised as stale and ignored (fencing).
"""

from __future__ import annotations

import ipaddress
import json
import math
import string
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError, field_validator

from mgpu.containeropts import ContainerOptions
from mgpu.safetext import escape_controls
from mgpu.spec import SpecError, validate_node_id

PROTOCOL_VERSION = 7
"""2: output offsets, Welcome.resume, Forget; 3: batched frames; 4: node secrets; 5: job
scripts, warning signals (`--signal`), time limits changed while a job runs, terminals
(Launch.pty, terminal_input, terminal_resize); 6: typed input acknowledged
(terminal_ack), the master's flow control of a terminal's input; 7: Launch.grant (what a
run was granted, typed) replaces Launch.gpu_ids and the GPU variables in its `env`: an
agent of 6 would run a job of a 7 master with every GPU visible, hence the new number."""

MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_NODE = 4096
MAX_RUNNING_REPORTS = 10000
"""Runs (jobs and steps) one hello may list: far more than a node runs at once."""


MAX_HOSTNAME = 253
"""A DNS name's longest text form."""
_HOSTNAME_CHARS = frozenset(string.ascii_letters + string.digits + "-._")
MAX_ERROR_TEXT = 1000
"""Characters of an agent's error text (a launch or epilog error) the master keeps."""
MAX_PID = 2**31 - 1
MAX_EXIT_CODE = 2**31 - 1


def check_hostname(value: str) -> str:
    """A host name as a node reports it: it goes into job records, `mgpu rsh` host
    matching and MPI hostfiles (one line each: `HOST slots=N`), so nothing else."""
    if not 0 < len(value) <= MAX_HOSTNAME:
        raise ValueError(f"is {len(value)} characters long; 1 to {MAX_HOSTNAME} are allowed")
    if not _HOSTNAME_CHARS.issuperset(value) or value[0] in "-.":
        raise ValueError(f"{value!r:.80} is not a host name (letters, digits, '-', '.', '_')")
    return value


def _ip(value: str) -> str:
    """An IP address (v4 or v6, with a zone for a link-local one): torchrun's
    MASTER_ADDR and what `mgpu nodes` shows."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r:.80} is not an IP address") from None
    return value


def _error_text(value: str | None) -> str | None:
    """An agent's error sentence, kept but made safe: it becomes a job's reason or a
    node's drain reason, stored and shown to everyone.  Escaped, and cut at
    MAX_ERROR_TEXT characters (refusing it would refuse the run's end with it)."""
    if value is None:
        return None
    text = escape_controls(value)
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 3] + "..."


def _finite(value: float | None) -> float | None:
    """A measurement that is not a number (NaN, infinity) is no measurement."""
    return value if value is None or math.isfinite(value) else None


HostName = Annotated[str, AfterValidator(check_hostname)]
IpAddress = Annotated[str, AfterValidator(_ip)]
ErrorText = Annotated[str | None, AfterValidator(_error_text)]
Measured = Annotated[float | None, AfterValidator(_finite)]
Timestamp = Annotated[float, Field(allow_inf_nan=False)]


def _printable(value: str | None, limit: int) -> str | None:
    """A string that is safe to show and store: bounded, no control characters."""
    if value is None:
        return None
    if len(value) > limit:
        raise ValueError(f"is {len(value)} characters long; at most {limit} are allowed")
    if not value.isprintable():
        raise ValueError("has characters that cannot be shown (control or invalid characters)")
    return value


class GpuDesc(BaseModel):
    index: int = Field(ge=0, lt=1024)
    name: str
    memory_mb: int = Field(ge=0, le=1 << 30)
    uuid: str | None = None
    numa_node: int | None = Field(default=None, ge=0, lt=4096)
    """The NUMA node of its PCI device, where the machine says (None: not said)."""

    @field_validator("name", "uuid")
    @classmethod
    def _short_text(cls, value: str | None) -> str | None:
        return _printable(value, 128)


MAX_FOREIGN_PROCESSES = 1024
"""Processes mgpu did not start one GPU's telemetry may list."""


class ForeignProcess(BaseModel):
    """A process mgpu did not start that uses a GPU, as the node's agent sees it."""

    pid: int = Field(ge=0, le=MAX_PID)
    user: str | None = None
    """Its owner's account name (its uid as text where the node has no name for it)."""
    memory_mb: int | None = Field(default=None, ge=0, le=1 << 30)
    """GPU memory it holds; None where the driver does not say."""

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return _printable(value, 64)


class GpuTelemetry(BaseModel):
    index: int = Field(ge=0, lt=1024)
    utilization_pct: Measured = None
    memory_used_mb: int | None = Field(default=None, ge=0, le=1 << 30)
    memory_total_mb: int | None = Field(default=None, ge=0, le=1 << 30)
    temperature_c: Measured = None
    power_w: Measured = None
    simulated: bool = False
    foreign_processes: list[int] = Field(default_factory=list, max_length=MAX_FOREIGN_PROCESSES)
    foreign_memory_mb: int | None = Field(default=None, ge=0, le=1 << 30)
    """Memory used on this GPU by processes mgpu did not start (memory the driver reserves
    for itself is not use)."""
    foreign: list[ForeignProcess] = Field(default_factory=list, max_length=MAX_FOREIGN_PROCESSES)
    """Those processes with their owners, most memory first (`foreign_processes` has their
    pids alone, for older masters)."""
    shares_enforced: bool | None = None
    """A share of this GPU (`--gpu-share`) is held to its limits: an MPS control daemon
    runs on the node or the agent can start one.  None: the agent does not say."""


class CpuDesc(BaseModel):
    """One CPU a node offers (mgpu.agent.hostres): its id, its core (the lowest id of its
    hyper-thread siblings) and its NUMA node (None: not said)."""

    id: int = Field(ge=0, lt=1 << 20)
    core: int = Field(ge=0, lt=1 << 20)
    numa: int | None = Field(default=None, ge=0, lt=4096)


class RunningReport(BaseModel):
    job_id: str
    epoch: int
    pid: int | None = None
    exited: bool = False
    exit_code: int | None = None


# ---- agent -> master -------------------------------------------------------


class Hello(BaseModel):
    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    node_id: str
    hostname: str
    ip: str
    gpus: list[GpuDesc]
    gpu_source: str = "fake"
    running: list[RunningReport] = Field(default_factory=list)
    features: list[str] = Field(default_factory=list)
    run_as_user: str | None = None
    """Set when the agent cannot switch users: every job runs as this account."""
    token: str | None = None
    node_secret: str | None = None
    """The secret this node received at its first join (see `Welcome.node_secret`)."""
    containment: str | None = None
    """How the agent contains jobs (mgpu.agent.cgroups: `cgroup-v2`, ...); None: not said."""
    gpu_isolation: str | None = None
    """How it keeps jobs off GPUs they were not given (mgpu.agent.devices: `none`, ...)."""
    cpus: list[CpuDesc] | None = Field(default=None, max_length=MAX_CPUS_PER_NODE)
    """The CPUs it may give jobs (None: an agent from before CPUs were scheduled)."""
    mem_mb: int | None = Field(default=None, ge=0, le=1 << 40)
    """Its memory, MiB (MemTotal, or `--fake-mem`); None: not said."""
    watches_leader: bool = False
    """It knows several masters and leaves this one as soon as another leads (it asks
    their `/readyz`): a master out of its lease need not let it go (master/control/nodes)."""

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str) -> str:
        try:
            return validate_node_id(value)
        except SpecError as e:  # "node id 'x' is not valid; ..." -> "node_id 'x' is ..."
            raise ValueError(str(e).removeprefix("the ").removeprefix("node id ")) from None

    @field_validator("hostname")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_hostname(value)

    @field_validator("ip")
    @classmethod
    def _address(cls, value: str) -> str:
        return _ip(value)

    @field_validator("gpu_source", "run_as_user", "containment", "gpu_isolation")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _printable(value, 255)

    @field_validator("token", "node_secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        return _printable(value, 512)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[GpuDesc]) -> list[GpuDesc]:
        if len(value) > MAX_GPUS_PER_NODE:
            raise ValueError(f"lists {len(value)} GPUs; at most {MAX_GPUS_PER_NODE} per node")
        seen: set[int] = set()
        for gpu in value:
            if gpu.index in seen:
                raise ValueError(f"lists GPU index {gpu.index} twice")
            seen.add(gpu.index)
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: list[CpuDesc] | None) -> list[CpuDesc] | None:
        if value is not None and len({c.id for c in value}) != len(value):
            raise ValueError("lists a CPU id twice")
        return value

    @field_validator("running")
    @classmethod
    def _running(cls, value: list[RunningReport]) -> list[RunningReport]:
        if len(value) > MAX_RUNNING_REPORTS:
            raise ValueError(f"lists {len(value)} runs; at most {MAX_RUNNING_REPORTS}")
        for rep in value:
            _printable(rep.job_id, 128)
        return value

    @field_validator("features")
    @classmethod
    def _features(cls, value: list[str]) -> list[str]:
        if len(value) > 64:
            raise ValueError(f"lists {len(value)} features; at most 64")
        for feature in value:
            _printable(feature, 64)
        return value


class RunMemory(BaseModel):
    """A running run's peak memory on this node so far (the kernel's count, MiB)."""

    job_id: str
    epoch: int
    max_rss_mb: int = Field(ge=0)


class Heartbeat(BaseModel):
    type: Literal["heartbeat"] = "heartbeat"
    telemetry: list[GpuTelemetry] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    memory: list[RunMemory] = Field(default_factory=list, max_length=MAX_RUNNING_REPORTS)
    """The running runs' peak memory so far (those whose memory the node counts), so that a
    running job's MaxRSS is known before it ends (`Exited.max_rss_mb` has the last word).
    Absent from an older agent: a master then learns the peak at the end only."""


class Started(BaseModel):
    type: Literal["started"] = "started"
    job_id: str
    epoch: int
    pid: int = Field(ge=0, le=MAX_PID)
    hostname: HostName
    ip: IpAddress
    time: Timestamp
    port: int | None = Field(default=None, ge=1, le=65535)
    share_enforced: bool | None = None
    """A shared job's share is held to its limits here (an MPS server limited before its
    process started); False: it is not (the job was told why); None: not a shared job, or
    an agent that does not say."""


class Output(BaseModel):
    type: Literal["output"] = "output"
    job_id: str
    epoch: int
    stream: Literal["o", "e"]
    data: str
    offset: int | None = None
    """Byte offset in the job's stream where `data` starts, and where it ends: the master
    keeps each run's bytes contiguous, dropping what it already has (a resend after a
    reconnect or an agent restart) and anything past a gap (re-sent from the gap)."""
    end: int | None = None


class Exited(BaseModel):
    type: Literal["exited"] = "exited"
    job_id: str
    epoch: int
    exit_code: int | None = Field(ge=-MAX_EXIT_CODE, le=MAX_EXIT_CODE)
    """The process's exit code; -N where signal N killed it (Python's returncode)."""
    time: Timestamp
    timed_out: bool = False
    launch_error: ErrorText = None
    """Set when the node could not start the job at all: a node failure, not the job's..."""
    fatal: bool = False
    """...unless fatal: the job itself cannot run (unknown user, root refused): it fails."""
    requeue_free: bool = False
    """The node's prolog failed: a node failure, and the requeue costs the job no retry."""
    epilog_error: ErrorText = None
    """The epilog failed after the job ended: the node is drained, the job's result stands."""
    out_of_memory: bool = False
    """The kernel killed the job for its memory limit (the agent then killed all of it):
    the job's own failure, not the node's."""
    max_rss_mb: int | None = Field(default=None, ge=0)
    """The run's peak memory on this node, MiB (None: not counted)."""


class PortReserved(BaseModel):
    """Rank 0's MASTER_PORT: the master takes it only from the job's first node, and
    only while the launch waits for it (master/control/lifecycle.py, `awaits_port`)."""

    type: Literal["port_reserved"] = "port_reserved"
    job_id: str
    epoch: int
    port: int = Field(ge=1, le=65535)


MAX_TERMINAL_INPUT = 64 * 1024
"""Bytes of typed input one message carries (base64: a third more)."""
TERMINAL_ACK_EVERY = 16 * 1024
"""The agent acknowledges typed input once this many bytes have left it (or at once when
some are dropped): the master keeps far more than this in flight per terminal."""


class TerminalAck(BaseModel):
    """`bytes` of a run's typed input have left the agent: written to its pty, or dropped
    (the run ended, its program does not read).  The master then lets that much more come
    from the run's client (master/state/registry.py, `InputWindow`)."""

    type: Literal["terminal_ack"] = "terminal_ack"
    job_id: str
    epoch: int
    bytes: int = Field(ge=0, le=1 << 40)


AgentMessage = Annotated[
    Hello | Heartbeat | Started | Output | Exited | PortReserved | TerminalAck,
    Field(discriminator="type"),
]

# ---- master -> agent -------------------------------------------------------


class Resume(BaseModel):
    """How much of a run's output the master has (bytes of stdout and stderr)."""

    job_id: str
    epoch: int
    stdout: int = 0
    stderr: int = 0


class Welcome(BaseModel):
    type: Literal["welcome"] = "welcome"
    heartbeat_interval: float
    kill: list[RunningReport] = Field(default_factory=list)
    """Processes the agent runs that the master does not know (or knows as stale)."""
    resume: list[Resume] = Field(default_factory=list)
    """For each run the master expects: how much output it has, so the agent re-sends
    from there (output in flight when a connection broke is neither lost nor doubled)."""
    node_secret: str | None = None
    """Set at a node's first join only: the agent keeps it (0600) and proves its node id
    with it in every later hello; the master keeps only its hash."""
    generation: int | None = None
    """The leader's lease generation (`master/store/fence.py`) when masters share a
    database: the agent keeps the highest it saw and refuses a master with a lower one
    (a deposed leader that wakes up sends no work).  None: a single master."""


class Forget(BaseModel):
    """The master has stored the end (`Exited`) of this run: the agent may forget it.
    Until then the agent keeps the run, lists it in its hello and re-sends its end after
    every reconnect, so an end is never lost with a dropped connection or a master crash."""

    type: Literal["forget"] = "forget"
    job_id: str
    epoch: int


class Refused(BaseModel):
    type: Literal["refused"] = "refused"
    reason: str


class SetHeartbeat(BaseModel):
    """Heartbeat at this interval from now on (the cluster grew or shrank: the master keeps
    its heartbeats to `networking.max_heartbeats_per_second`)."""

    type: Literal["set_heartbeat"] = "set_heartbeat"
    heartbeat_interval: float = Field(gt=0)


class TerminalSize(BaseModel):
    rows: int = Field(ge=1, le=10000)
    cols: int = Field(ge=1, le=10000)


GpuIndex = Annotated[int, Field(ge=0, lt=1024)]
CpuIndex = Annotated[int, Field(ge=0, lt=1 << 16)]


class Grant(BaseModel):
    """What a run was granted on the node it is sent to.  The master decides it; the agent
    alone turns it into the process's environment, device rules and container flags
    (mgpu.agent.grants): the launch's `env` names no GPU."""

    gpus: list[GpuIndex] = Field(max_length=MAX_GPUS_PER_NODE)
    """The GPUs the run may use: the node's GPU indices as its hello listed them."""
    job_gpus: list[GpuIndex] | None = Field(default=None, max_length=MAX_GPUS_PER_NODE)
    """The job's GPUs on this node (`MGPU_GPU_IDS`, `SLURM_JOB_GPUS`): more than `gpus`
    for an srun task given some of them (`--gpus-per-task`); None: `gpus`."""
    share_units: int | None = Field(default=None, ge=1, le=1000)
    """`--gpu-share`: the run's part of each GPU, in thousandths (0.25 = 250); None: whole
    GPUs."""
    gpu_memory_mb: int | None = Field(default=None, ge=0)
    """A share's part of its GPU's memory (MiB, rounded down); None: not said."""
    slurm: bool = False
    """A Slurm job: its GPUs are named in Slurm's variables too."""
    step: bool = False
    """An srun task: `SLURM_STEP_GPUS` names its GPUs."""
    cpus: list[CpuIndex] | None = Field(default=None, max_length=1 << 16)
    """The CPUs the run may use, node CPU ids the master picked (None: not limited): the
    agent holds it to them (a cpuset, or a quota of as many CPUs: mgpu.agent.runlimits)."""
    mem_mb: int | None = Field(default=None, ge=0)
    """The memory the run may use, MiB, swap included (None: not limited)."""


class Launch(BaseModel):
    type: Literal["launch"] = "launch"
    job_id: str
    epoch: int
    argv: list[str]
    env: dict[str, str]
    """The job's variables, none of which names a GPU (the agent adds those: `grant`)."""
    cwd: str | None = None
    grant: Grant
    time_limit: float | None = None
    kill_grace: float = 10.0
    user: str | None = None
    allow_root: bool = False
    """May this job run as uid 0 (only the master owner's, unless the config allows)."""
    mpi: bool = False
    """Set up mpirun: the agent writes `hostfile` and points Open MPI / MPICH at it
    and at `mgpu rsh` as their remote launcher."""
    hostfile: str | None = None
    image: str | None = None
    """Run inside this container image with the node's container runtime."""
    container: ContainerOptions | None = None
    """The container's options beyond its image (pyxis's: mounts, working directory ...);
    None: an `--image` job's defaults."""
    prolog: str | None = None
    """Site scripts (the cluster config's `site:`): run by the agent before / after."""
    epilog: str | None = None
    prolog_timeout: float = 30.0
    epilog_timeout: float = 30.0
    signal: int | None = None
    """`--signal`: send this signal `signal_lead` seconds before the time limit..."""
    signal_lead: float = 0.0
    signal_batch: bool = False
    """...to the job's top process only (`B:`), else to every process of the job."""
    script: str | None = None
    """A job script: the agent writes it (private to the job's user) and runs it with its
    `#!` interpreter (else /bin/sh), `argv` being its arguments."""
    script_name: str | None = None
    pty: TerminalSize | None = None
    """Run on a pseudo-terminal of this size (`mgpu srun --pty`): stdin, stdout and stderr
    are its slave side, the program's controlling terminal; the output is one stream."""
    output_file: str | None = None
    """A Slurm batch job's -o file (relative to `cwd` unless absolute), written by the job's
    own user from the start, besides the output the master gets (mgpu.agent.outputfiles);
    also enters `cwd` as Slurm does: one it cannot enter is an error line, then /tmp."""
    error_file: str | None = None
    """Its -e file (the same as `output_file` for one file)."""
    open_append: bool = False
    """--open-mode=append: the files are appended to, not truncated."""


class Kill(BaseModel):
    type: Literal["kill"] = "kill"
    job_id: str
    epoch: int | None = None
    """None = whatever epoch the agent runs."""
    reason: str = "cancelled"
    grace: float = 10.0
    signal: int | None = None
    """Send this signal first and wait up to `signal_lead` seconds for the job to end
    before SIGTERM (a preempted job's warning, as `--signal`)."""
    signal_lead: float = 0.0
    signal_batch: bool = False


class SetTimeLimit(BaseModel):
    """A running job's time limit changed (`mgpu update --time`): seconds from its start,
    None for no limit."""

    type: Literal["set_time_limit"] = "set_time_limit"
    job_id: str
    epoch: int
    time_limit: float | None


class SignalRun(BaseModel):
    """Send `signal` to a run now (`scancel --signal`, `mgpu cancel --signal`): to every
    process of it, or with `top_only` to its top process only (the batch script's shell,
    Slurm's `scancel -b`).  Nothing else changes: the run goes on unless the signal ends
    it."""

    type: Literal["signal"] = "signal"
    job_id: str
    epoch: int
    signal: int = Field(ge=1, le=64)
    top_only: bool = False


class ReservePort(BaseModel):
    type: Literal["reserve_port"] = "reserve_port"
    job_id: str
    epoch: int


class TerminalInput(BaseModel):
    """Bytes typed at a run's terminal, to write to its pty (base64: any byte travels)."""

    type: Literal["terminal_input"] = "terminal_input"
    job_id: str
    epoch: int
    data: str = Field(max_length=MAX_TERMINAL_INPUT * 4 // 3 + 4)


class TerminalResize(BaseModel):
    """The user's terminal changed size: set it on the run's pty (the program gets
    SIGWINCH)."""

    type: Literal["terminal_resize"] = "terminal_resize"
    job_id: str
    epoch: int
    size: TerminalSize


MasterMessage = Annotated[
    Welcome
    | Refused
    | Launch
    | Kill
    | ReservePort
    | Forget
    | SetTimeLimit
    | SignalRun
    | TerminalInput
    | TerminalResize
    | SetHeartbeat,
    Field(discriminator="type"),
]

_agent_adapter: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)
_master_adapter: TypeAdapter[MasterMessage] = TypeAdapter(MasterMessage)


_agent_batch: TypeAdapter[list[AgentMessage]] = TypeAdapter(list[AgentMessage])
_master_batch: TypeAdapter[list[MasterMessage]] = TypeAdapter(list[MasterMessage])


def parse_agent_message(raw: str | bytes) -> AgentMessage:
    return _agent_adapter.validate_json(raw)


class HelloError(ValueError):
    """A first message that is not a valid hello; the text is one sentence for the agent."""


def parse_hello(raw: str | bytes) -> Hello:
    """The agent's first message, or HelloError naming the field that is wrong."""
    try:
        data: Any = json.loads(raw)
    except ValueError:
        raise HelloError("the first message must be hello (it is not JSON)") from None
    if not isinstance(data, dict) or data.get("type") != "hello":
        raise HelloError("the first message must be hello")
    try:
        return Hello.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "hello"
        why = str(err.get("msg", "is invalid")).removeprefix("Value error, ")
        why = why.replace("Input should be", "should be").replace("Field required", "is missing")
        raise HelloError(f"invalid hello: {where} {why}") from None


def parse_agent_messages(raw: str | bytes, errors: list[str] | None = None) -> list[AgentMessage]:
    """One frame: a message, or a JSON array of them (a busy sender batches).

    In an array, one invalid message does not cost the others: it is left out and, when
    `errors` is given, one line saying why is added to it (else the ValidationError is
    raised).  A frame that is not JSON, or one single invalid message, raises."""
    if raw[:1] not in ("[", b"["):
        return [_agent_adapter.validate_json(raw)]
    try:
        return _agent_batch.validate_json(raw)
    except ValidationError:
        if errors is None:
            raise
    # The slow path, only for a frame with a bad message in it: each message on its own.
    items = json.loads(raw)
    if not isinstance(items, list):
        raise ValueError("an agent frame must be a message or a JSON array of messages")
    out: list[AgentMessage] = []
    for i, item in enumerate(items):
        try:
            # Through JSON again, so each message is judged exactly as in the fast path.
            out.append(_agent_adapter.validate_json(json.dumps(item)))
        except (ValidationError, ValueError) as e:
            kind = item.get("type") if isinstance(item, dict) else None
            errors.append(f"message {i} ({kind or 'no type'}): {_first_error(e)}")
    return out


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))
    return str(e).splitlines()[0][:200]


def parse_master_messages(raw: str | bytes) -> list[MasterMessage]:
    if raw[:1] in ("[", b"["):
        return _master_batch.validate_json(raw)
    return [_master_adapter.validate_json(raw)]


def batch_frames(encoded: list[str], limit: int = 1 << 20) -> list[str]:
    """Join already-encoded messages into as few frames as fit `limit` characters: one
    WebSocket frame (and one write) for many messages when a sender falls behind."""
    if len(encoded) == 1:
        return encoded
    frames: list[str] = []
    group: list[str] = []
    size = 0
    for item in encoded:
        if group and size + len(item) > limit:
            frames.append("[" + ",".join(group) + "]")
            group, size = [], 0
        group.append(item)
        size += len(item) + 1
    if group:
        frames.append("[" + ",".join(group) + "]" if len(group) > 1 else group[0])
    return frames


def parse_master_message(raw: str | bytes) -> MasterMessage:
    return _master_adapter.validate_json(raw)


def encode(message: BaseModel) -> str:
    return message.model_dump_json()
