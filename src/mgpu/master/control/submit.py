"""Submit at the edge: a request validated once into a typed `JobSpec`, and the jobs it makes.

The submit route takes a `JobSpec` directly, so nothing behind it sees a raw dict.  Each
field is checked by `mgpu.spec` and `mgpu.execspec` and holds the parsed value (`time` in
seconds, `gpu_ids` as a tuple, `dependency` as `Dependency` values ...); the rules that
join fields (GPUs against nodes, GPUs per node and explicit GPU lists) live in one model
validator.  Every string that can reach a program is valid UTF-8 without NUL, and argv and
the environment are capped well below what `execve` accepts, so a job that passes never
fails to start because of what it asked for.

A refusal is one sentence that names the option as the user typed it (``--time: time
limit 'soon' is not understood ...``, ``--env[NAME] contains a NUL byte ...``); the route
answers 422 with it and stores nothing.  The JSON a client sends is the same as before
this module existed: it is the wire format of `mgpu.Client.submit`.

`mgpu.master.control.jobbuild` turns a spec into `Job`s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from mgpu import execspec
from mgpu import spec as specs
from mgpu.containeropts import ContainerOptions
from mgpu.master.control.notifytargets import parse_target
from mgpu.master.control.slurmblock import parse_slurm_block
from mgpu.model import SlurmOptions
from mgpu.resources import NO_ASK, ResourceAsk, SizeError, parse_size_mb
from mgpu.scheduler.shares import share_units
from mgpu.signalspec import SignalSpec, format_signal, parse_signal

T = TypeVar("T")

__all__ = [
    "JobSpec",
    "Shape",
    "SubmitError",
]


class SubmitError(ValueError):
    """A request that is refused at submit; the message is one sentence for the user."""


@dataclass
class SubmitResult:
    job_id: str
    task_ids: tuple[str, ...] | None = None
    dropped_env: list[str] = field(default_factory=list)
    """Reserved names in the submitted environment, not passed to the job."""
    warnings: list[str] = field(default_factory=list)
    """Lines about what was asked for and ignored (an unknown partition)."""


def _named(option: str, parse: Callable[[str], T], text: str) -> T:
    """Run a `mgpu.spec` parser; its error becomes a sentence that starts with the option."""
    try:
        return parse(text)
    except specs.SpecError as e:
        raise specs.SpecError(f"{option}: {e}") from None


MAX_OPTION_CHARS = 64 * 1024
"""Longest option string parsed (node lists, arrays ...): parsing stays in milliseconds."""


def _text_of(value: Any, option: str, example: str) -> str | None:
    """A string field's raw value: None for absent (null or ""), else checked text."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise specs.SpecError(f"{option} must be text such as {example}")
    if len(value) > MAX_OPTION_CHARS:
        raise specs.SpecError(
            f"{option} is {len(value)} characters long; at most {MAX_OPTION_CHARS} are allowed"
        )
    return specs.validate_text(value, option)


# ---- field types: the raw JSON value in, the parsed value out -------------------------


def _time(value: Any) -> float | None:
    text = _text_of(value, "--time", "90 or 1:00:00")
    return None if text is None else _named("--time", specs.parse_time_limit, text)


def _gpu_ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list):
        if not value:
            return None
        if len(value) > specs.MAX_GPU_INDEX + 1:
            raise specs.SpecError(
                f"--gpu-ids lists {len(value)} GPUs; that is more than a node has"
            )
        ids: set[int] = set()
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise specs.SpecError(f"--gpu-ids must list whole numbers, not {item!r:.40}")
            if not 0 <= item <= specs.MAX_GPU_INDEX:
                raise specs.SpecError(
                    f"--gpu-ids: GPU id {item} is out of range; indices go from 0 to "
                    f"{specs.MAX_GPU_INDEX}"
                )
            ids.add(item)
        return tuple(sorted(ids))
    text = _text_of(value, "--gpu-ids", "0,1")
    return None if text is None else _named("--gpu-ids", specs.parse_gpu_ids, text)


def _node_gpu_ids(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    text = _text_of(value, "--node-gpu-ids", '"node001:0,1;node002:0"')
    if text is None:
        return None
    return _named("--node-gpu-ids", specs.parse_node_gpu_ids, text)


def _node_names(value: Any, info: ValidationInfo) -> tuple[str, ...] | None:
    option = "--" + str(info.field_name)
    if isinstance(value, list):
        if not value:
            return None
        if len(value) > specs.MAX_NODE_LIST:
            raise specs.SpecError(f"{option} names more than {specs.MAX_NODE_LIST} nodes")
        names: dict[str, None] = {}
        for item in value:
            if not isinstance(item, str):
                raise specs.SpecError(f"{option} must list node names, not {item!r:.40}")
            specs.validate_text(item, option)
            names[_named(option, specs.validate_node_id, item)] = None
        return tuple(names)
    text = _text_of(value, option, "node001,node002 or node[001-004]")
    return None if text is None else _named(option, specs.parse_node_list, text)


def _dependency(value: Any) -> tuple[specs.Dependency, ...]:
    text = _text_of(value, "--dependency", "afterok:a1b2c3d4")
    return () if text is None else _named("--dependency", specs.parse_dependency, text)


def _array(value: Any) -> specs.ArraySpec | None:
    text = _text_of(value, "--array", "0-99%8")
    return None if text is None else _named("--array", specs.parse_array, text)


def _command(value: str) -> str:
    return specs.validate_command(value)


def _argv(value: list[str] | None) -> list[str] | None:
    return execspec.validate_argv(value) if value else None  # [] means "not given", as before


def _name(value: str) -> str:
    specs.validate_text(value, "--name")
    return _named("--name", specs.validate_job_name, value)


_USER_RE = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")


def _user(value: str) -> str:
    specs.validate_text(value, "--user")
    if _USER_RE.fullmatch(value) is None:
        raise specs.SpecError(
            f"--user {value!r:.60} is not a user name; use up to 64 letters, digits, "
            "'.', '_' or '-'"
        )
    return value


def _gpu_type(value: str) -> str:
    specs.validate_text(value, "--gpu-type")
    if not value.strip() or len(value) > 64 or not value.isprintable():
        raise specs.SpecError(f"--gpu-type {value!r:.60} is not a GPU type such as A100")
    return value.strip()


def _cwd(value: str) -> str | None:
    return execspec.validate_cwd(value) if value else None


def _env(value: dict[str, str] | None) -> dict[str, str] | None:
    return None if value is None else execspec.validate_env(value)


def _image(value: str) -> str | None:
    return execspec.validate_image(value) if value else None


MAX_SCRIPT_BYTES = 1 << 20
"""A job script sent with the job (and stored with it): 1 MiB."""
OPTION_SOURCES = frozenset({"command line", "#MGPU", "#SBATCH", "default"})


def _signal(value: Any) -> SignalSpec | None:
    text = _text_of(value, "--signal", "USR1@60")
    return None if text is None else _named("--signal", parse_signal, text)


def _notify(value: str) -> str | None:
    return parse_target(value) if value else None


def _script(value: str) -> str:
    specs.validate_text(value, "the job script")
    size = len(value.encode("utf-8"))
    if size > MAX_SCRIPT_BYTES:
        raise specs.SpecError(
            f"the job script is {size} bytes; at most {MAX_SCRIPT_BYTES >> 20} MiB is sent "
            "with a job (keep data in files the script reads)"
        )
    if not value.strip():
        raise specs.SpecError("the job script is empty")
    return value


def _script_name(value: str) -> str:
    specs.validate_text(value, "the job script's name")
    # The agent writes the script under this name in a fresh directory: `.` and `..`
    # name that directory and its parent, not a file in it.
    bad = value in ("", ".", "..") or "/" in value or len(value) > 255
    if bad or not value.isprintable():
        raise specs.SpecError(f"{value!r:.60} is not a file name for the job script")
    return value


def _sources(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > 64:
        raise specs.SpecError("option_sources names more than 64 options")
    for option, source in value.items():
        if re.fullmatch(r"[a-z][a-z_]{0,31}", option) is None or source not in OPTION_SOURCES:
            raise specs.SpecError(
                f"option_sources: {option!r:.40}: {source!r:.40} is not one of "
                f"{', '.join(sorted(OPTION_SOURCES))}"
            )
    return value


def _gpu_share(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise specs.SpecError("--gpu-share must be a number between 0 and 1, such as 0.25")
    try:
        share_units(float(value))
    except ValueError as e:
        raise specs.SpecError(str(e)) from None
    return float(value)


MAX_JOB_CPUS = 4096
"""CPUs a job may ask of one node (protocol.MAX_CPUS_PER_NODE: no node offers more)."""


def _mem(value: Any) -> int | None:
    """`--mem SIZE` per node: MiB as a number, or text in Slurm's units (`8G`, `512M`);
    0 is all of each node's memory (Slurm's `--mem=0`)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise specs.SpecError("--mem must be a size such as 8G or 512M")
    if isinstance(value, int):
        if not 0 <= value <= 1 << 40:
            raise specs.SpecError(f"--mem {value} is not a memory size (like 512M, 16G)")
        return value
    text = _text_of(value, "--mem", "8G or 512M")
    assert text is not None
    try:
        mb = parse_size_mb(text)
    except SizeError as e:
        raise specs.SpecError(f"--mem: {e}") from None
    if mb > 1 << 40:
        raise specs.SpecError(f"--mem {text} is more memory than any node has")
    return mb


_RESERVATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def reservation_name(value: str, option: str = "--reservation") -> str:
    """A reservation's name: up to 64 letters, digits, '.', '_' or '-'."""
    specs.validate_text(value, option)
    if _RESERVATION_RE.fullmatch(value) is None:
        raise specs.SpecError(
            f"{option} {value!r:.60} is not a reservation name; use up to 64 letters, "
            "digits, '.', '_' or '-'"
        )
    return value


def _schema(*types: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [*types, {"type": "null"}]})


_STR = {"type": "string"}
TimeLimit = Annotated[float | None, PlainValidator(_time), _schema(_STR)]
"""Seconds; None = not given (the defaults apply), `math.inf` = ``UNLIMITED``."""
GpuIds = Annotated[
    tuple[int, ...] | None,
    PlainValidator(_gpu_ids),
    _schema(_STR, {"type": "array", "items": {"type": "integer"}}),
]
NodeGpuIds = Annotated[
    tuple[tuple[str, tuple[int, ...]], ...] | None, PlainValidator(_node_gpu_ids), _schema(_STR)
]
NodeNames = Annotated[
    tuple[str, ...] | None,
    PlainValidator(_node_names),
    _schema(_STR, {"type": "array", "items": {"type": "string"}}),
]
Dependencies = Annotated[tuple[specs.Dependency, ...], PlainValidator(_dependency), _schema(_STR)]
Array = Annotated[specs.ArraySpec | None, PlainValidator(_array), _schema(_STR)]
Signal = Annotated[SignalSpec | None, PlainValidator(_signal), _schema(_STR)]
Slurm = Annotated[
    SlurmOptions | None, PlainValidator(parse_slurm_block), _schema({"type": "object"})
]


def _pty_size(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    ok = isinstance(value, list | tuple) and len(value) == 2
    if not ok or not all(type(v) is int and 1 <= v <= 10000 for v in value):
        raise specs.SpecError("--pty size must be [rows, columns], each from 1 to 10000")
    return int(value[0]), int(value[1])


PtySize = Annotated[
    tuple[int, int] | None,
    PlainValidator(_pty_size),
    _schema({"type": "array", "items": {"type": "integer"}}),
]


@dataclass(frozen=True, slots=True)
class Shape:
    """How many GPUs a job takes and how they spread, once the options are reconciled."""

    gpus: int
    """Total GPUs."""
    nodes: int | None = None
    """A gang of this many nodes (`--nodes`), all started together."""
    gpus_per_node: int | None = None


class JobSpec(BaseModel):
    """A job as a client submits it, checked field by field and as a whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: Annotated[str, AfterValidator(_command)] | None = None
    """Run with ``/bin/sh -c``; or give `argv` instead."""
    argv: Annotated[list[str] | None, AfterValidator(_argv)] = None
    """Executed directly (`mgpu srun`)."""
    name: Annotated[str, AfterValidator(_name)] | None = None
    user: Annotated[str, AfterValidator(_user)] | None = None
    """Submit as this user (an admin token only; checked by the route)."""
    gpus: int | None = Field(default=None, ge=0, le=specs.MAX_GPUS)
    gpu_ids: GpuIds = None
    node_gpu_ids: NodeGpuIds = None
    nodes: int | None = Field(default=None, ge=1, le=specs.MAX_NODES)
    gpus_per_node: int | None = Field(default=None, ge=0, le=specs.MAX_GPUS)
    nodelist: NodeNames = None
    exclude: NodeNames = None
    gpu_type: Annotated[str, AfterValidator(_gpu_type)] | None = None
    policy: Literal["fill_first", "spread"] | None = None
    distributed: bool = False
    mpi: bool = False
    time: TimeLimit = None
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    retries: int | None = Field(default=None, ge=0, le=1000)
    dependency: Dependencies = ()
    array: Array = None
    preemptible: bool = False
    interactive: bool = False
    cwd: Annotated[str, AfterValidator(_cwd)] | None = None
    env: Annotated[dict[str, str] | None, AfterValidator(_env)] = None
    image: Annotated[str, AfterValidator(_image)] | None = None
    container: ContainerOptions | None = None
    """pyxis's container options (`srun --container-mounts ...`): with `image` only."""
    signal: Signal = None
    """`--signal [B:]SIG@SECONDS`: a warning before the time limit (and at preemption)."""
    hold: bool = False
    """`--hold`: queued held, until `mgpu release`."""
    begin: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """`--begin`: not started before this epoch time (the client reads Slurm's forms)."""
    notify: Annotated[str, AfterValidator(_notify)] | None = None
    """`--notify URL|mailto:ADDRESS|none` (where the cluster allows: Cluster.submit)."""
    script: Annotated[str, AfterValidator(_script)] | None = None
    """A job script (`mgpu submit FILE`): sent with the job, `argv` being its arguments."""
    script_name: Annotated[str, AfterValidator(_script_name)] | None = None
    option_sources: Annotated[dict[str, str] | None, AfterValidator(_sources)] = None
    gpu_share: Annotated[float | None, PlainValidator(_gpu_share), _schema({"type": "number"})] = (
        None
    )
    reservation: Annotated[str, AfterValidator(reservation_name)] | None = None
    cpus: int | None = Field(default=None, ge=1, le=MAX_JOB_CPUS)
    """`--cpus N`: CPUs held on each node of the job (None: none asked)."""
    mem: Annotated[int | None, PlainValidator(_mem), _schema(_STR, {"type": "integer"})] = None
    """`--mem SIZE`: MiB held on each node of the job; 0: all of its memory."""
    exclusive: bool = False
    """`--exclusive`: whole nodes (every GPU, CPU and all memory of each node it runs on);
    no other job starts on them while it runs."""
    pty: bool = False
    """Run on a pseudo-terminal (`mgpu srun --pty`): one program, on one node."""
    pty_size: PtySize = None
    """The client's terminal as (rows, cols): the pty's size at launch."""
    allocation: bool = False
    """An allocation (`mgpu alloc`): the GPUs are held for the client's steps; the
    command is only shown (it runs on the client's machine)."""
    slurm: Slurm = None
    """Submitted the Slurm way (`sbatch`): Slurm's options without a field of their own
    (mgpu.master.control.slurmblock); such a job that asks for no GPU gets none."""

    _shape: Shape = PrivateAttr(default_factory=lambda: Shape(gpus=1))

    @field_validator("gpus", "nodes", "gpus_per_node", "priority", "retries", "cpus", mode="before")
    @classmethod
    def _whole_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool):  # JSON true is not 1 GPU
            option = "--" + str(info.field_name).replace("_", "-")
            raise specs.SpecError(f"{option} needs a whole number, not {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _whole_request(self) -> JobSpec:
        if self.script is not None:
            if self.command is not None:
                raise specs.SpecError("give either a job script or a command, not both")
            if self.image is not None:
                raise specs.SpecError(
                    "a job script cannot run in --image yet; submit the command that runs "
                    "it instead (mgpu submit --image IMAGE 'sh job.sh')"
                )
        elif self.argv is None and self.command is None:
            raise specs.SpecError("the command is empty; give the command to run")
        if self.container is not None and self.image is None:
            raise specs.SpecError("container options need an image (--container-image)")
        if self.image is not None and self.slurm is not None and self.slurm.batch:
            # Its -o/-e files are opened on the node as its user, which a root runtime is
            # not (docs/SECURITY.md): refused here as the CLI's script + --image is.
            raise specs.SpecError(
                "a Slurm batch job cannot run in --image yet: its -o/-e files are written "
                "on the node, outside the container; submit it without the slurm block's "
                "batch, or without --image"
            )
        if self.argv is not None and self.command is not None:
            raise specs.SpecError("give the command either as a string or as argv, not both")
        sig, limit = self.signal, self.time
        if sig is not None and limit is not None and sig.seconds >= limit:
            raise specs.SpecError(
                f"--signal {format_signal(sig)} would come {sig.seconds} s before the "
                f"end of a job of {specs.format_time_limit(limit)}, before it starts; give "
                "fewer seconds or a longer --time"
            )
        self._shape = _reconcile(self)
        return self

    @model_validator(mode="after")
    def _session(self) -> JobSpec:
        _check_session(self)
        return self

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def ask(self) -> ResourceAsk:
        """The CPUs and memory it asks of each node (`--cpus`, `--mem`)."""
        if self.cpus is None and self.mem is None and not self.exclusive:
            return NO_ASK
        return ResourceAsk(
            cpus_per_node=self.cpus, mem_per_node_mb=self.mem, exclusive=self.exclusive
        )

    @property
    def dropped_env(self) -> list[str]:
        """Names in `env` the scheduler sets itself: valid, but not passed to the job."""
        slurm = self.slurm is not None
        return sorted(n for n in self.env or () if execspec.is_reserved_env_name(n, slurm))


def _reconcile(spec: JobSpec) -> Shape:
    """The job's GPUs from `--gpus`, `--nodes`/`--gpus-per-node`, `--node-gpu-ids` and
    `--gpu-ids`, which must agree wherever several are given."""
    gpus, nodes, per_node = spec.gpus, spec.nodes, spec.gpus_per_node
    pinned, ids = spec.node_gpu_ids, spec.gpu_ids
    gang = nodes is not None or per_node is not None
    if spec.gpu_share is not None:
        return _share_shape(spec)
    if ids is not None and pinned is not None:
        raise specs.SpecError("use either --gpu-ids or --node-gpu-ids, not both")
    if ids is not None and gang:
        raise specs.SpecError(
            "--gpu-ids picks GPUs on one node and cannot be combined with --nodes or "
            "--gpus-per-node; use --node-gpu-ids to pick GPUs on several nodes"
        )
    if pinned is not None:
        total = sum(len(g) for _, g in pinned)
        if nodes is not None and nodes != len(pinned):
            raise specs.SpecError(
                f"--nodes {nodes} does not match the {len(pinned)} nodes in --node-gpu-ids"
            )
        for node, node_ids in pinned:
            if per_node is not None and len(node_ids) != per_node:
                raise specs.SpecError(
                    f"--gpus-per-node {per_node} does not match --node-gpu-ids, which gives "
                    f"{node} {len(node_ids)}"
                )
        if gpus is not None and gpus != total:
            raise specs.SpecError(
                f"--gpus {gpus} does not match the {total} GPUs in --node-gpu-ids"
            )
        return Shape(gpus=total, nodes=nodes, gpus_per_node=per_node)
    if gang:
        nodes = 1 if nodes is None else nodes
        if per_node is None:
            per_node = 1 if gpus is None else gpus // nodes
        if gpus is not None and gpus != nodes * per_node:
            raise specs.SpecError(
                f"--gpus {gpus} does not match --nodes {nodes} × --gpus-per-node {per_node}"
            )
        return Shape(gpus=nodes * per_node, nodes=nodes, gpus_per_node=per_node)
    if ids is not None:
        if gpus is not None and gpus != len(ids):
            raise specs.SpecError(f"--gpus {gpus} does not match the {len(ids)} --gpu-ids")
        return Shape(gpus=len(ids))
    if gpus is None:  # Slurm's default is no GPU; mgpu's own, one
        gpus = 0 if spec.slurm is not None else 1
    return Shape(gpus=gpus)


def _share_shape(spec: JobSpec) -> Shape:
    """`--gpu-share F` is part of one GPU on one node: nothing may ask for more or pin it."""
    share = f"--gpu-share {spec.gpu_share:g}"
    if spec.gpus is not None and spec.gpus != 1:
        raise specs.SpecError(
            f"{share} is part of one GPU and cannot be combined with --gpus {spec.gpus}"
        )
    others = [
        option
        for option, given in (
            ("--nodes", spec.nodes is not None),
            ("--gpus-per-node", spec.gpus_per_node is not None),
            ("--gpu-ids", spec.gpu_ids is not None),
            ("--node-gpu-ids", spec.node_gpu_ids is not None),
            ("--distributed", spec.distributed),
            ("--mpi", spec.mpi),
        )
        if given
    ]
    if others:
        raise specs.SpecError(
            f"{share} is part of one GPU and cannot be combined with {' or '.join(others)}"
        )
    return Shape(gpus=1)


def _check_session(spec: JobSpec) -> None:
    """A terminal is one program on one node; an allocation runs nothing itself and is held
    by its client, so it is never an array, never requeued, never preempted."""
    if spec.pty:
        if spec.allocation:
            raise specs.SpecError(
                "an allocation runs nothing itself: use mgpu srun --pty inside it instead"
            )
        if spec.array is not None:
            raise specs.SpecError("--pty runs one program at a terminal, not a job array (--array)")
        many = (spec.shape.nodes or 1) > 1 or len(spec.node_gpu_ids or ()) > 1
        if many or spec.distributed or spec.mpi:
            raise specs.SpecError(
                "--pty runs one program on one node; drop --nodes, --distributed and --mpi"
            )
        if spec.image is not None:
            raise specs.SpecError(
                "--pty does not work with --image: container jobs get no terminal"
            )
    if not spec.allocation:
        return
    refused = [
        ("--array", spec.array is not None, "start one mgpu alloc per allocation"),
        ("--mpi", spec.mpi, "run mpirun in a step (mgpu srun inside the allocation)"),
        ("--distributed", spec.distributed, "run torchrun in a step"),
        ("--image", spec.image is not None, "give it to the steps' own command"),
        ("--preemptible", spec.preemptible, "its client's steps cannot be requeued"),
        ("--retries", bool(spec.retries), "it is never requeued: its client holds it"),
    ]
    for option, given, why in refused:
        if given:
            raise specs.SpecError(f"{option} does not apply to an allocation (mgpu alloc): {why}")
