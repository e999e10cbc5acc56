"""The one writer of every Slurm command (mgpu.textout, a base module: srun's step client
in mgpu.client writes through it too), as `mgpu.slurm.output`."""

from mgpu.textout import err, flush, out, shown, stdout_gone

__all__ = ["err", "flush", "out", "shown", "stdout_gone"]
