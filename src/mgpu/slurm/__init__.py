"""Slurm's commands, talking to mgpu: sbatch, squeue, scancel, scontrol, sinfo, sacct,
salloc and srun (the README, "Your Slurm scripts, unchanged").

One module per command, plus `opts` (Slurm's option syntax), `fields` (its `%` format
strings and sacct's field lists), `states` (mgpu's job states in Slurm's words) and
`common` (errors, the client, times).  Standard library only and light to import: people
run `squeue` in a loop, and the agent's bin dir runs these with the system's python3
(mgpu.agent.slurmbin).  `main` dispatches on the command's name.
"""

COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scancel", "scontrol", "sinfo", "sacct")
