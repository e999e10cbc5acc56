"""Slurm 22.05's job options, each once: the one table sbatch, salloc and srun (and
`#SBATCH` lines) are parsed with, and what mgpu does with each.

OPTIONS is Slurm's own table (src/common/slurm_opt.c, `common_options[]`, tag
slurm-22-05-11-1), one row per entry, in its order: the long name, the short letter (`-`:
none), the argument (`=` required, `?` optional: only as `--name=value` or `-xVALUE`, `-`
none), the commands that take it (`b` sbatch, `r` srun, `a` salloc), and its use in mgpu:

- `job:FIELD`: the submit field FIELD, the value as it is;
- `job`: honoured by `jobopts.submit_fields` (a field or the `slurm` block, with checks;
  CPUs and memory: mgpu.slurm.resources);
- `gpu`: one spelling of the GPU request (`jobopts.GPU_OPTIONS`: one rule for all);
- `cli`: the command's own behaviour (`--parsable`, `--wait`, `--help` ...);
- `step`: srun's, for its tasks' output and life, not the job's;
- `warn`: accepted, and ignored with a warning (nothing about what runs, or when, changes
  beyond what the warning says);
- `refuse`: refused in one sentence (REFUSED): ignoring it would change what runs;
- `pyxis`: NVIDIA pyxis's container options, a SPANK plugin's rows after Slurm's own
  (mgpu.slurm.pyxis: the image and options honoured, or refused in one sentence);
- `=NAME`: another spelling of NAME (Slurm's deprecated and hidden forms: `--cpu_bind`,
  `--tasks-per-node`, `--pack-group`, `--cluster`).

VARIABLES are the input variables (src/{sbatch,salloc,srun/libsrun}/opt.c, `env_vars[]`):
the name, the commands that read it, the option it sets.  sbatch and salloc read theirs
below the command line (and sbatch above its `#SBATCH` lines); srun's are declared but not
read: inside a job the job's own SLURM_* variables are set, and mgpu's steps take their
shape from the job (mgpu.client.steps), as today.
"""

from __future__ import annotations

from mgpu.slurm.opts import Option
from mgpu.slurm.pyxis import ROWS as PYXIS_ROWS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

COMMANDS = {"sbatch": "b", "srun": "r", "salloc": "a"}

OPTIONS = """
accel-bind          - = r   warn
account             A = bra warn
acctg-freq          - = bra warn
array               a = b   job:array
batch               - = b   warn
bcast               - ? r   warn
bcast-exclude       - = r   warn
begin               b = bra job
bell                - - a   warn
bb                  - = bra warn
bbf                 - = bra warn
cluster-constraint  - = bra warn
chdir               D = bra job
cluster             - = bra =clusters
clusters            M = bra warn
comment             - = bra warn
compress            - ? r   warn
container           - = bra warn
context             - = bra warn
contiguous          - - bra warn
constraint          C = bra warn
core-spec           S = bra warn
cores-per-socket    - = bra warn
cpu-bind            - = r   warn
cpu_bind            - = r   =cpu-bind
cpu-freq            - = bra warn
cpus-per-gpu        - = bra job
cpus-per-task       c = bra job
deadline            - = bra warn
debugger-test       - - r   warn
delay-boot          - = bra warn
dependency          d = bra job
disable-status      X - r   warn
distribution        m = bra warn
epilog              - = r   refuse
error               e = br  job
exact               - - r   step
exclude             x = bra job:exclude
exclusive           - ? bra job
export              - = br  job
export-file         - = b   warn
extra-node-info     B = bra warn
get-user-env        - ? ba  warn
gid                 - = bra warn
gpu-bind            - = bra job
gpu-freq            - = bra warn
gpus                G = bra gpu
gpus-per-node       - = bra gpu
gpus-per-socket     - = bra warn
gpus-per-task       - = bra gpu
gres                - = bra gpu
gres-flags          - = bra warn
help                h - bra cli
het-group           - = r   refuse
hint                - = bra warn
hold                H - bra job
ignore-pbs          - - b   warn
immediate           I ? ra  warn
input               i = br  warn
interactive         - - r   warn
jobid               - = r   step
job-name            J = bra job:name
kill-command        K ? a   warn
kill-on-bad-exit    K ? r   step
kill-on-invalid-dep - = b   job
label               l - r   step
licenses            L = bra warn
mail-type           - = bra job
mail-user           - = bra job
threads             T = r   warn
mcs-label           - = bra warn
mem                 - = bra job
mem-bind            - = bra warn
mem-per-cpu         - = bra job
mem-per-gpu         - = bra job
mincpus             - = bra warn
mpi                 - = r   warn
msg-timeout         - = r   warn
multi-prog          - - r   refuse
network             - = bra warn
nice                - ? bra warn
no-allocate         Z - r   refuse
no-bell             - - a   warn
no-kill             k ? bra warn
no-shell            - - a   refuse
no-requeue          - - b   job
nodefile            F = bra warn
nodelist            w = bra job:nodelist
nodes               N = bra job
ntasks              n = bra job
ntasks-per-core     - = bra warn
ntasks-per-gpu      - = bra warn
ntasks-per-node     - = bra job
ntasks-per-socket   - = bra warn
ntasks-per-tres     - = bra warn
open-mode           - = br  job
output              o = br  job
overcommit          O - bra warn
overlap             - ? r   step
oversubscribe       s - bra warn
pack-group          - = r   =het-group
parsable            - - b   cli
partition           p = bra job
power               - = bra warn
prefer              - = bra warn
preserve-env        E - r   warn
priority            - = bra job
profile             - = bra warn
prolog              - = r   refuse
propagate           - ? br  warn
pty                 - - r   step
qos                 q = bra warn
quiet               Q - bra cli
quit-on-interrupt   - - r   warn
reboot              - - bra warn
relative            r = r   warn
requeue             - - b   job
reservation         - = bra job:reservation
resv-ports          - ? r   warn
send-libs           - ? r   warn
signal              - = bra job:signal
slurmd-debug        - = r   warn
sockets-per-node    - = bra warn
spread-job          - - bra warn
switches            - = bra warn
task-epilog         - = r   refuse
task-prolog         - = r   refuse
tasks-per-node      - = bra =ntasks-per-node
test-only           - - br  refuse
thread-spec         - = bra warn
threads-per-core    - = bra warn
time                t = bra job:time
time-min            - = bra warn
tmp                 - = bra warn
uid                 - = bra refuse
unbuffered          u - r   step
use-min-nodes       - - bra warn
verbose             v - bra cli
version             V - bra cli
usage               - - bra cli
wait                W - b   cli
wait-all-nodes      - = ba  warn
wait                W = r   cli
wckey               - = bra warn
whole               - - r   warn
wrap                - = b   cli
x11                 - ? ra  warn
"""

VARIABLES = """
SALLOC_ACCOUNT            a   account
SALLOC_ACCTG_FREQ         a   acctg-freq
SALLOC_BELL               a   bell
SALLOC_BURST_BUFFER       a   bb
SALLOC_CLUSTERS           a   clusters
SALLOC_CLUSTER_CONSTRAINT a   cluster-constraint
SALLOC_CONSTRAINT         a   constraint
SALLOC_CONTAINER          a   container
SALLOC_CORE_SPEC          a   core-spec
SALLOC_CPUS_PER_GPU       a   cpus-per-gpu
SALLOC_CPU_FREQ_REQ       a   cpu-freq
SALLOC_DEBUG              a   verbose
SALLOC_DELAY_BOOT         a   delay-boot
SALLOC_EXCLUSIVE          a   exclusive
SALLOC_GPUS               a   gpus
SALLOC_GPUS_PER_NODE      a   gpus-per-node
SALLOC_GPUS_PER_SOCKET    a   gpus-per-socket
SALLOC_GPUS_PER_TASK      a   gpus-per-task
SALLOC_GPU_BIND           a   gpu-bind
SALLOC_GPU_FREQ           a   gpu-freq
SALLOC_GRES               a   gres
SALLOC_GRES_FLAGS         a   gres-flags
SALLOC_HINT               a   hint
SALLOC_IMMEDIATE          a   immediate
SALLOC_KILL_CMD           a   kill-command
SALLOC_MEM_BIND           a   mem-bind
SALLOC_MEM_PER_CPU        a   mem-per-cpu
SALLOC_MEM_PER_GPU        a   mem-per-gpu
SALLOC_MEM_PER_NODE       a   mem
SALLOC_NETWORK            a   network
SALLOC_NO_BELL            a   no-bell
SALLOC_NO_KILL            a   no-kill
SALLOC_OVERCOMMIT         a   overcommit
SALLOC_PARTITION          a   partition
SALLOC_POWER              a   power
SALLOC_PROFILE            a   profile
SALLOC_QOS                a   qos
SALLOC_RESERVATION        a   reservation
SALLOC_SIGNAL             a   signal
SALLOC_SPREAD_JOB         a   spread-job
SALLOC_THREADS_PER_CORE   a   threads-per-core
SALLOC_THREAD_SPEC        a   thread-spec
SALLOC_TIMELIMIT          a   time
SALLOC_USE_MIN_NODES      a   use-min-nodes
SALLOC_WAIT_ALL_NODES     a   wait-all-nodes
SALLOC_WCKEY              a   wckey
SBATCH_ACCOUNT            b   account
SBATCH_ACCTG_FREQ         b   acctg-freq
SBATCH_ARRAY_INX          b   array
SBATCH_BATCH              b   batch
SBATCH_BURST_BUFFER       b   bb
SBATCH_CLUSTERS           b   clusters
SBATCH_CLUSTER_CONSTRAINT b   cluster-constraint
SBATCH_CONSTRAINT         b   constraint
SBATCH_CONTAINER          b   container
SBATCH_CORE_SPEC          b   core-spec
SBATCH_CPUS_PER_GPU       b   cpus-per-gpu
SBATCH_CPU_FREQ_REQ       b   cpu-freq
SBATCH_DEBUG              b   verbose
SBATCH_DELAY_BOOT         b   delay-boot
SBATCH_DISTRIBUTION       b   distribution
SBATCH_ERROR              b   error
SBATCH_EXCLUSIVE          b   exclusive
SBATCH_EXPORT             b   export
SBATCH_GET_USER_ENV       b   get-user-env
SBATCH_GPUS               b   gpus
SBATCH_GPUS_PER_NODE      b   gpus-per-node
SBATCH_GPUS_PER_SOCKET    b   gpus-per-socket
SBATCH_GPUS_PER_TASK      b   gpus-per-task
SBATCH_GPU_BIND           b   gpu-bind
SBATCH_GPU_FREQ           b   gpu-freq
SBATCH_GRES               b   gres
SBATCH_GRES_FLAGS         b   gres-flags
SBATCH_HINT               b   hint
SBATCH_IGNORE_PBS         b   ignore-pbs
SBATCH_INPUT              b   input
SBATCH_JOB_NAME           b   job-name
SBATCH_MEM_BIND           b   mem-bind
SBATCH_MEM_PER_CPU        b   mem-per-cpu
SBATCH_MEM_PER_GPU        b   mem-per-gpu
SBATCH_MEM_PER_NODE       b   mem
SBATCH_NETWORK            b   network
SBATCH_NO_KILL            b   no-kill
SBATCH_NO_REQUEUE         b   no-requeue
SBATCH_OPEN_MODE          b   open-mode
SBATCH_OUTPUT             b   output
SBATCH_OVERCOMMIT         b   overcommit
SBATCH_PARTITION          b   partition
SBATCH_POWER              b   power
SBATCH_PROFILE            b   profile
SBATCH_QOS                b   qos
SBATCH_REQUEUE            b   requeue
SBATCH_RESERVATION        b   reservation
SBATCH_SIGNAL             b   signal
SBATCH_SPREAD_JOB         b   spread-job
SBATCH_THREADS_PER_CORE   b   threads-per-core
SBATCH_THREAD_SPEC        b   thread-spec
SBATCH_TIMELIMIT          b   time
SBATCH_USE_MIN_NODES      b   use-min-nodes
SBATCH_WAIT               b   wait
SBATCH_WAIT_ALL_NODES     b   wait-all-nodes
SBATCH_WCKEY              b   wckey
SLURMD_DEBUG              r   slurmd-debug
SLURM_ACCOUNT             r   account
SLURM_ACCTG_FREQ          r   acctg-freq
SLURM_BCAST               r   bcast
SLURM_BCAST_EXCLUDE       r   bcast-exclude
SLURM_BURST_BUFFER        r   bb
SLURM_CLUSTERS            bra clusters
SLURM_CLUSTER_CONSTRAINT  r   cluster-constraint
SLURM_COMPRESS            r   compress
SLURM_CONSTRAINT          r   constraint
SLURM_CORE_SPEC           r   core-spec
SLURM_CPUS_PER_GPU        r   cpus-per-gpu
SLURM_CPU_BIND            r   cpu-bind
SLURM_CPU_FREQ_REQ        r   cpu-freq
SLURM_DEBUG               r   verbose
SLURM_DELAY_BOOT          r   delay-boot
SLURM_DEPENDENCY          r   dependency
SLURM_DISABLE_STATUS      r   disable-status
SLURM_DISTRIBUTION        r   distribution
SLURM_EPILOG              r   epilog
SLURM_EXACT               r   exact
SLURM_EXCLUSIVE           r   exclusive
SLURM_EXPORT_ENV          r   export
SLURM_GPUS                r   gpus
SLURM_GPUS_PER_NODE       r   gpus-per-node
SLURM_GPUS_PER_SOCKET     r   gpus-per-socket
SLURM_GPUS_PER_TASK       r   gpus-per-task
SLURM_GPU_BIND            r   gpu-bind
SLURM_GPU_FREQ            r   gpu-freq
SLURM_GRES                r   gres
SLURM_GRES_FLAGS          r   gres-flags
SLURM_HINT                bra hint
SLURM_JOB_ID              r   jobid
SLURM_JOB_NAME            r   job-name
SLURM_JOB_NUM_NODES       r   nodes
SLURM_KILL_BAD_EXIT       r   kill-on-bad-exit
SLURM_LABELIO             r   label
SLURM_MEM_BIND            r   mem-bind
SLURM_MEM_PER_CPU         r   mem-per-cpu
SLURM_MEM_PER_GPU         r   mem-per-gpu
SLURM_MEM_PER_NODE        r   mem
SLURM_MPI_TYPE            r   mpi
SLURM_NCORES_PER_SOCKET   r   cores-per-socket
SLURM_NETWORK             r   network
SLURM_NO_KILL             r   no-kill
SLURM_NPROCS              r   ntasks
SLURM_NSOCKETS_PER_NODE   r   sockets-per-node
SLURM_NTASKS              r   ntasks
SLURM_NTASKS_PER_GPU      r   ntasks-per-gpu
SLURM_NTASKS_PER_NODE     r   ntasks-per-node
SLURM_NTASKS_PER_TRES     r   ntasks-per-tres
SLURM_OPEN_MODE           r   open-mode
SLURM_OVERCOMMIT          r   overcommit
SLURM_OVERLAP             r   overlap
SLURM_PARTITION           r   partition
SLURM_POWER               r   power
SLURM_PROFILE             r   profile
SLURM_PROLOG              r   prolog
SLURM_QOS                 r   qos
SLURM_REMOTE_CWD          r   chdir
SLURM_RESERVATION         r   reservation
SLURM_RESV_PORTS          r   resv-ports
SLURM_SEND_LIBS           r   send-libs
SLURM_SIGNAL              r   signal
SLURM_SPREAD_JOB          r   spread-job
SLURM_SRUN_MULTI          r   multi-prog
SLURM_STDERRMODE          r   error
SLURM_STDINMODE           r   input
SLURM_STDOUTMODE          r   output
SLURM_TASK_EPILOG         r   task-epilog
SLURM_TASK_PROLOG         r   task-prolog
SLURM_THREADS             r   threads
SLURM_THREADS_PER_CORE    r   threads-per-core
SLURM_THREAD_SPEC         r   thread-spec
SLURM_TIMELIMIT           r   time
SLURM_UNBUFFEREDIO        r   unbuffered
SLURM_USE_MIN_NODES       r   use-min-nodes
SLURM_WAIT                r   wait
SLURM_WCKEY               r   wckey
SLURM_WORKING_DIR         r   chdir
SRUN_CONTAINER            r   container
SRUN_CPUS_PER_TASK        r   cpus-per-task
SRUN_EXPORT_ENV           r   export
"""

REFUSED = {
    "test-only": "--test-only is not supported by mgpu",
    "uid": "--uid is for root only",
    "multi-prog": "--multi-prog is not supported by mgpu (each task would run another program)",
    "prolog": "--prolog is not supported by mgpu (it would run a program before the job)",
    "epilog": "--epilog is not supported by mgpu (it would run a program after the job)",
    "task-prolog": "--task-prolog is not supported by mgpu (it would run before each task)",
    "task-epilog": "--task-epilog is not supported by mgpu (it would run after each task)",
    "no-allocate": "--no-allocate is for root only",
    "no-shell": "--no-shell is not supported by mgpu (an allocation runs a command or a shell)",
    "het-group": "heterogeneous jobs (--het-group) are not supported by mgpu",
}
"""Why each `refuse` option is refused: Slurm's error line after `PROG: error: `."""


class Row:
    """One entry of Slurm's table."""

    __slots__ = ("arg", "commands", "name", "short", "use")

    def __init__(self, name: str, short: str, arg: str, commands: str, use: str) -> None:
        self.name, self.use, self.commands = name, use, commands
        self.short = "" if short == "-" else short
        self.arg = {"=": "yes", "?": "optional", "-": "no"}[arg]

    @property
    def canonical(self) -> str:
        """The name its value is kept under (an alias's: the option it spells)."""
        return self.use[1:] if self.use.startswith("=") else self.name


ROWS = [Row(*line.split()) for line in f"{OPTIONS.strip()}\n{PYXIS_ROWS.strip()}".splitlines()]


def rows(command: str) -> list[Row]:
    """The entries `command` takes, in Slurm's order."""
    letter = COMMANDS[command]
    return [r for r in ROWS if letter in r.commands]


def _use(command: str) -> dict[str, str]:
    """Each option's use for `command`, by its canonical name."""
    return {r.name: r.use for r in rows(command) if not r.use.startswith("=")}


def options(command: str) -> list[Option]:
    """`command`'s options for mgpu.slurm.opts.parse: every spelling, the value kept
    under the canonical name."""
    return [Option(r.canonical, r.short, r.arg, spelling=r.name) for r in rows(command)]


def names(command: str, *uses: str) -> frozenset[str]:
    """The canonical names of `command`'s options of these uses (`job:` for every
    `job:FIELD`)."""
    out = set()
    for name, use in _use(command).items():
        if use in uses or (use.startswith("job:") and "job:" in uses):
            out.add(name)
    return frozenset(out)


def fields(command: str) -> dict[str, str]:
    """`job:FIELD` options: option name -> the submit field its value is."""
    return {n: u[4:] for n, u in _use(command).items() if u.startswith("job:")}


def variables(command: str) -> dict[str, str]:
    """The input variables `command` reads: name -> option."""
    letter = COMMANDS[command]
    out = {}
    for line in VARIABLES.strip().splitlines():
        var, commands, option = line.split()
        if letter in commands:
            out[var] = option
    return out


def env_options(command: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """`command`'s options from its input variables (`SBATCH_PARTITION=gpu` ...), a flag's
    value "" whatever the variable says."""
    flags = {r.canonical for r in rows(command) if r.arg == "no"}
    out: list[tuple[str, str]] = []
    for var, name in variables(command).items():
        if var in environ:
            out.append((name, "" if name in flags else environ[var]))
    return out
