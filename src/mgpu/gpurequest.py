"""The one rule for a job's GPU request where options come in layers (a script's
`#SBATCH` lines < SBATCH_* variables < sbatch's command line; sbatch's request < `#MGPU`
lines < `mgpu submit`'s command line): the request is one thing however it is spelt, so
a layer that names any spelling of it replaces the one below whole (`--gpus 4` over a
script's `--gres=gpu:a100:2` leaves no a100 type behind).  Standard library only."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, MutableMapping
    from typing import Any

MGPU_REQUEST = ("gpus", "gpus_per_node", "gpu_ids", "node_gpu_ids")
"""However mgpu's options (`mgpu submit`, `#MGPU`) ask for GPUs."""


def lay_over(
    into: MutableMapping[str, Any],
    values: Mapping[str, Any],
    request: Iterable[str],
    goes_with: Iterable[str] = (),
) -> None:
    """`values` over `into`; if `values` names any key of `request`, every key of
    `request` (and `goes_with`: e.g. the GPU type) is first dropped from `into`."""
    request = tuple(request)
    if any(key in values for key in request):
        for key in (*request, *goes_with):
            into.pop(key, None)
    into.update(values)
