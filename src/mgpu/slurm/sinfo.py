"""`sinfo`: partitions and nodes in Slurm's view (default, `-N`, `-o`, `-h`, `-p`,
`-t`); a node's state is Slurm's (idle, mix, alloc, drain, drng, down) from its GPUs."""

from __future__ import annotations

from mgpu.slurm import common, fields, opts, output, states, tres

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "sinfo"
OPTIONS = opts.table(
    "Node/N noheader/h format=/o Format=/O partition=/p states=/t long/l summarize/s all/a "
    "exact/e responding/r dead/d nodes=/n iterate=/i verbose/v help usage version/V "
    "clusters=/M"
)
COMPACT = {
    "idle": "idle",
    "mixed": "mix",
    "allocated": "alloc",
    "draining": "drng",
    "drained": "drain",
    "down": "down",
}


def compact(state: str) -> str:
    """sinfo's short state, its `*` (not responding) kept: `idle*`, `mix*`."""
    base = state.rstrip("*")
    return COMPACT.get(base, base) + state[len(base) :]


class Partition:
    """A partition as sinfo shows it: name, default or not, time limit, node ids."""

    def __init__(self, name: str, default: bool, limit: str, nodes: list[str]) -> None:
        self.name, self.default, self.limit, self.nodes = name, default, limit, nodes


def partitions(client: Any, nodes: list[dict[str, Any]]) -> list[Partition]:
    """The cluster's partitions (GET /api/partitions); a master without them has one,
    the default, of every node."""
    from mgpu.client.api import RequestError

    try:
        listed = client._request("GET", "/api/partitions")["partitions"]
    except RequestError as e:
        if e.status != 404:
            raise
        ids = [n["node_id"] for n in nodes]
        return [Partition(common.DEFAULT_PARTITION, True, "infinite", ids)]
    return [
        Partition(
            str(p["name"]),
            bool(p.get("default")),
            _limit(p.get("max_time")),
            [str(n) for n in p.get("nodes") or []],
        )
        for p in listed
    ]


def _limit(text: Any) -> str:
    """sinfo writes no limit as `infinite`."""
    return "infinite" if not text or str(text).upper() == "UNLIMITED" else str(text)


def _names(nodes: list[dict[str, Any]]) -> str:
    names = [n["node_id"] for n in nodes]
    if len(names) <= 1:
        return names[0] if names else ""
    from mgpu.hostlist import compress

    return compress(names)


class Row:
    """One line: a partition's nodes in one state (or one node, with -N)."""

    def __init__(self, part: Partition, state: str, nodes: list[Any]) -> None:
        self.partition, self.default, self.limit = part.name, part.default, part.limit
        self.state, self.nodes = state, nodes


def _gres(row: Row) -> str:
    counts = sorted({len(n.get("gpus") or []) for n in row.nodes})
    return ",".join(f"gpu:{c}" for c in counts if c) or "(null)"


COLUMNS: list[tuple[str, str, str, Any]] = [
    # %-letter, its -O name (sinfo's opts.c), title, value
    ("P", "partition", "PARTITION", lambda r: r.partition + ("*" if r.default else "")),
    ("R", "partitionname", "PARTITION", lambda r: r.partition),
    ("a", "available", "AVAIL", lambda r: "up"),
    ("l", "timelimit", "TIMELIMIT", lambda r: r.limit),
    ("D", "nodes", "NODES", lambda r: str(len(r.nodes))),
    ("t", "statecompact", "STATE", lambda r: compact(r.state)),
    ("T", "statelong", "STATE", lambda r: r.state),
    ("N", "nodelist", "NODELIST", lambda r: _names(r.nodes)),
    (
        "n",
        "nodehost",
        "HOSTNAMES",
        lambda r: ",".join(n.get("hostname") or n["node_id"] for n in r.nodes),
    ),
    ("G", "gres", "GRES", _gres),
    ("c", "cpus", "CPUS", lambda r: _least(r, [tres.node_cpus(n)[0] for n in r.nodes], True)),
    ("C", "cpusstate", "CPUS(A/I/O/T)", lambda r: _cpus_aiot(r)),
    ("m", "memory", "MEMORY", lambda r: _least(r, [tres.node_memory(n)[0] for n in r.nodes])),
    ("e", "freemem", "FREE_MEM", lambda r: _free_memory(r)),
    ("E", "reason", "REASON", lambda r: ",".join(n.get("reason") or "none" for n in r.nodes[:1])),
    ("F", "nodeaiot", "NODES(A/I/O/T)", lambda r: _aiot(r)),
]
"""sinfo's fields, each once: `-o %X` by its letter, `-O name` by its name (any case,
whole, as sinfo's opts.c compares them)."""
KNOWN, LONG_NAMES = fields.columns(COLUMNS)


def _least(row: Row, values: list[int], units: bool = False) -> str:
    """sinfo's `N` for nodes alike, `N+` (the least) for nodes that differ; CPUs in
    Slurm's units (`1K`)."""
    low, high = min(values, default=0), max(values, default=0)
    text = tres.convert(low) if units else str(low)
    return text if low == high else f"{text}+"


def _free_memory(row: Row) -> str:
    """FREE_MEM: `N`, or the range `LOW-HIGH`; N/A for nodes that do not say."""
    free = [tres.node_memory(n)[1] for n in row.nodes]
    low = "N/A" if not free or None in free else str(min(f or 0 for f in free))
    high = "N/A" if not free or None in free else str(max(f or 0 for f in free))
    return high if low == high else f"{low}-{high}"


def _cpus_aiot(row: Row) -> str:
    """CPUS(A/I/O/T): held by jobs, free, free on nodes that take no jobs (down,
    drained), all."""
    alloc = idle = other = total = 0
    for node in row.nodes:
        cpus, free = tres.node_cpus(node)
        total += cpus
        alloc += cpus - free
        if states.node_state(node) in ("down", "drained", "draining"):
            other += free
        else:
            idle += free
    return f"{alloc}/{idle}/{other}/{total}"


def _aiot(row: Row) -> str:
    counts = {"A": 0, "I": 0, "O": 0}
    for n in row.nodes:
        s = states.node_state(n)
        counts["A" if s in ("allocated", "mixed") else "I" if s == "idle" else "O"] += 1
    return f"{counts['A']}/{counts['I']}/{counts['O']}/{len(row.nodes)}"


def rows(
    parts: list[Partition], nodes: list[dict[str, Any]], per_node: bool, wanted: set[str] | None
) -> list[Row]:
    by_id = {n["node_id"]: n for n in nodes}
    out = []
    for part in parts:
        by_state: dict[str, list[Any]] = {}
        for node in (by_id[i] for i in part.nodes if i in by_id):
            state = states.node_state(node)
            base = state.rstrip("*")  # `-t idle` lists the idle nodes that do not respond too
            if wanted and not {state, base, compact(state), compact(base)} & wanted:
                continue
            if per_node:
                out.append(Row(part, state, [node]))
            else:
                by_state.setdefault(state, []).append(node)
        out += [Row(part, s, ns) for s, ns in by_state.items()]
    return out


def main(argv: list[str]) -> int:
    given, rest = opts.command_line(
        PROG, argv, OPTIONS, "[-N] [-h] [-o format] [-O fields] [-p partition] [-t states]"
    )
    if rest:
        raise common.fail(PROG, f"Unrecognized option: {rest[0]}")
    client = common.make_client()
    per_node = "Node" in given
    wanted = {s.strip().lower() for s in (given.get("states") or "").split(",") if s.strip()}
    nodes = client.nodes()
    table = rows(partitions(client, nodes), nodes, per_node, wanted or None)
    if given.get("partition"):
        keep = set((given["partition"] or "").split(","))
        table = [r for r in table if r.partition in keep]
    fmt = given.get("format")
    if fmt is None and not given.get("Format"):
        # Slurm's defaults, the partition and node columns as wide as their widest (9 at least)
        width = max([len(KNOWN["P"][1](r)) for r in table] + [9])
        if per_node:
            nwidth = max([len(_names(r.nodes)) for r in table] + [9])
            fmt = f"%{nwidth}N %.6D %.{width}P %6t"
        else:
            fmt = f"%{width}P %.5a %.10l %.6D %.6t %N"
    if given.get("Format"):
        items = fields.parse_long(PROG, given["Format"], KNOWN, LONG_NAMES, what="node")
    else:
        items = fields.parse_percent(PROG, fmt or "", KNOWN, what="node")
    lines = fields.render_percent(items, KNOWN, table, "noheader" not in given)
    if lines:
        output.out("\n".join(lines))
    return 0
