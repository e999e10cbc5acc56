"""`mgpu completion bash|zsh`: shell completion scripts generated from the argparse parser,
so they always list the commands and options the installed mgpu has, plus those the
contract fixes and that are on their way (`PLANNED_*`: the parser's own win once it has
them).  The legacy and seed names complete too: `mgpu_client` as `mgpu`, `mgpu_srun` as
`mgpu srun`, and so on (`ALIASES`).

    eval "$(mgpu completion bash)"          # in ~/.bashrc
    mgpu completion zsh > ~/.zfunc/_mgpu    # with ~/.zfunc in $fpath, before compinit
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

PROGRAMS = ("mgpu", "mgpu_client", "mgpu_simple_client")
"""Names that are `mgpu` itself."""

ALIASES = {
    "mgpu_master": "master",
    "mgpu_simple_master": "master",
    "mgpu_master_server": "master",
    "mgpu_node": "node",
    "mgpu_simple_node": "node",
    "mgpu_srun": "srun",
    "mgpu_srun_multinode": "srun",
    "mgpu_queue": "queue",
    "mgpu_cancel": "cancel",
}
"""Names that are one subcommand (pyproject.toml's console scripts)."""


@dataclass
class Option:
    flags: list[str]
    takes_value: bool
    choices: list[str]
    help: str


@dataclass
class Command:
    name: str
    help: str
    options: list[Option] = field(default_factory=list)
    positional_choices: list[str] = field(default_factory=list)


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _options(parser: argparse.ArgumentParser) -> tuple[list[Option], list[str]]:
    options: list[Option] = []
    positional: list[str] = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            # Actions (`reserve create|list|delete`): offered as words, their options merged.
            positional += [str(c) for c in a.choices]
            seen = {f for o in options for f in o.flags}
            for nested in a.choices.values():
                for o in _options(nested)[0]:
                    if not seen & set(o.flags):
                        options.append(o)
                        seen.update(o.flags)
            continue
        if a.help == argparse.SUPPRESS:
            continue  # hidden on purpose (`submit --pty` exists only to be refused)
        choices = [str(c) for c in a.choices] if a.choices else []
        if a.option_strings:
            options.append(
                Option(list(a.option_strings), a.nargs != 0, choices, (a.help or "").strip())
            )
        elif choices:
            positional += choices
    return options, positional


def _value(flag: str, help: str, choices: tuple[str, ...] = ()) -> Option:
    return Option([flag], True, list(choices), help)


def _switch(flag: str, help: str) -> Option:
    return Option([flag], False, [], help)


# The contract's round 2 (issue 14) and shared GPUs and reservations (issue 13): listed
# before the parser has them, so completion needs no change when they land.
_PLANNED_JOB_OPTIONS = [
    _value("--signal", "send a signal SECONDS before the time limit"),
    _switch("--hold", "queue the job held"),
    _value("--notify", "POST to this URL when the job ends"),
    _value("--gpu-share", "a fraction of one GPU, 0 < F < 1"),
    _value("--reservation", "run in this reservation"),
]
PLANNED_OPTIONS: dict[str, list[Option]] = {
    "submit": _PLANNED_JOB_OPTIONS,
    "srun": [*_PLANNED_JOB_OPTIONS, _switch("--pty", "a real terminal for the program")],
    "alloc": _PLANNED_JOB_OPTIONS,
}
"""Options of existing commands, by command."""

PLANNED_COMMANDS: dict[str, tuple[str, list[Option], list[str]]] = {
    "hold": ("keep queued jobs from starting", [], []),
    "release": ("let held jobs start", [], []),
    "requeue": ("stop running jobs and queue them again", [], []),
    "update": (
        "change a queued job (a running one: time, name)",
        [
            _value("--time", "new time limit"),
            _value("--priority", "new user priority"),
            _value("--gpus", "new number of GPUs"),
            _value("--name", "new name"),
        ],
        [],
    ),
    "alloc": ("allocate GPUs, then run ARGV (default $SHELL) here with them", [], []),
    "reserve": (
        "GPUs set aside for a window (admin)",
        [
            _value("--gpus", "GPUs to set aside"),
            _value("--nodelist", "on these nodes"),
            _value("--start", "now, now+MINUTES or YYYY-MM-DDTHH:MM"),
            _value("--duration", "how long"),
            _value("--users", "who may use it, a,b"),
            _switch("--json", "machine-readable output"),
        ],
        ["create", "list", "delete"],
    ),
}
"""Commands the parser may not have yet: (help, options, positional choices)."""


def describe(parser: argparse.ArgumentParser) -> tuple[list[Option], list[Command]]:
    """The top-level options and every subcommand with its options, planned ones added."""
    top, _ = _options(parser)
    sub = _subparsers(parser)
    commands = []
    if sub is not None:
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, sp in sub.choices.items():
            opts, positional = _options(sp)
            commands.append(Command(name, helps.get(name, ""), opts, positional))
    by_name = {c.name: c for c in commands}
    srun = by_name.get("srun")
    for name, (help, opts, positional) in PLANNED_COMMANDS.items():
        if name not in by_name:
            if name == "alloc" and srun is not None:  # the job options, as srun takes them
                opts = [o for o in srun.options if o.flags != ["--pty"]] + opts
            by_name[name] = Command(name, help, list(opts), list(positional))
            commands.append(by_name[name])
    for name, opts in PLANNED_OPTIONS.items():
        command = by_name.get(name)
        if command is None:
            continue
        known = {f for o in command.options for f in o.flags}
        command.options += [o for o in opts if not known & set(o.flags)]
    return top, commands


def bash_script(parser: argparse.ArgumentParser) -> str:
    top, commands = describe(parser)
    value_opts = sorted({f for o in top for f in o.flags if o.takes_value})
    lines = [
        "# bash completion for mgpu (generated by `mgpu completion bash`)",
        "_mgpu() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local i cmd="" opts=""',
        '    case "${COMP_WORDS[0]##*/}" in',
        *_bash_alias_cases(),
        "    esac",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        [[ -n "$cmd" ]] && break',
        '        case "${COMP_WORDS[i]}" in',
        f"            {'|'.join(value_opts) or '--'}) ((i++)) ;;",
        "            -*) ;;",
        '            *) cmd="${COMP_WORDS[i]}"; break ;;',
        "        esac",
        "    done",
        '    if [[ -z "$cmd" ]]; then',
        '        COMPREPLY=($(compgen -W "'
        + " ".join([c.name for c in commands] + [f for o in top for f in o.flags])
        + '" -- "$cur"))',
        "        return 0",
        "    fi",
        '    case "$cmd" in',
    ]
    for c in commands:
        flags = " ".join(f for o in c.options for f in o.flags)
        lines.append(f'        {c.name}) opts="{flags}"')
        for o in c.options:
            if o.choices:
                pattern = "|".join(o.flags)
                words = " ".join(o.choices)
                lines.append(
                    f'            case "$prev" in {pattern}) '
                    f'COMPREPLY=($(compgen -W "{words}" -- "$cur")); return 0 ;; esac'
                )
        if c.positional_choices:
            words = " ".join(c.positional_choices)
            lines.append(
                f'            [[ "$cur" != -* ]] && '
                f'{{ COMPREPLY=($(compgen -W "{words}" -- "$cur")); return 0; }}'
            )
        lines.append("            ;;")
    lines += [
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "    fi",
        "    return 0",
        "}",
        f"complete -o default -F _mgpu {' '.join([*PROGRAMS, *ALIASES])}",
        "",
    ]
    return "\n".join(lines)


def _alias_groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, command in ALIASES.items():
        groups.setdefault(command, []).append(name)
    return groups


def _bash_alias_cases() -> list[str]:
    """`mgpu_srun ...` completes as `mgpu srun ...`."""
    return [f"        {'|'.join(names)}) cmd={cmd} ;;" for cmd, names in _alias_groups().items()]


def _zsh_text(text: str) -> str:
    """Help text safe inside a single-quoted zsh _arguments spec."""
    text = re.sub(r"[\[\]:'\\`$]", "", text.replace("%%", "%"))
    return text.replace("(", "").replace(")", "")


def _zsh_spec(o: Option) -> list[str]:
    out = []
    for f in o.flags:
        spec = f"{f}[{_zsh_text(o.help)}]"
        if o.takes_value:
            action = f"({' '.join(o.choices)})" if o.choices else ""
            spec += f":{f.lstrip('-')}:{action}"
        out.append(f"'{spec}'")
    return out


def zsh_script(parser: argparse.ArgumentParser) -> str:
    top, commands = describe(parser)
    lines = [
        f"#compdef {' '.join([*PROGRAMS, *ALIASES])}",
        "# zsh completion for mgpu (generated by `mgpu completion zsh`)",
        "_mgpu() {",
        '    local curcontext="$curcontext" state line',
        "    typeset -A opt_args",
        "    local -a commands",
        "    case $service in",  # `mgpu_srun ...` completes as `mgpu srun ...`
    ]
    for cmd, names in _alias_groups().items():
        lines.append(
            f'        {"|".join(names)}) words=(mgpu {cmd} "${{(@)words[2,-1]}}"); '
            "(( CURRENT++ )) ;;"
        )
    lines += [
        "    esac",
        "    commands=(",
    ]
    lines += [f"        '{c.name}:{_zsh_text(c.help)}'" for c in commands]
    lines += ["    )", "    _arguments -C \\"]
    lines += [f"        {s} \\" for o in top for s in _zsh_spec(o)]
    lines += [
        "        '1: :->command' \\",
        "        '*:: :->args'",
        "    case $state in",
        "        command) _describe -t commands 'mgpu command' commands ;;",
        "        args)",
        "            case $line[1] in",
    ]
    for c in commands:
        specs = [s for o in c.options for s in _zsh_spec(o)]
        if c.positional_choices:
            specs.append(f"'1:{c.name}:({' '.join(c.positional_choices)})'")
        else:
            specs.append("'*:argument:_files'")
        lines.append(f"                {c.name}) _arguments \\")
        lines += [f"                    {s} \\" for s in specs[:-1]]
        lines.append(f"                    {specs[-1]} ;;")
    lines += [
        "            esac ;;",
        "    esac",
        "}",
        'if [[ "$funcstack[1]" = "_mgpu" ]]; then',
        '    _mgpu "$@"',
        "else",
        f"    compdef _mgpu {' '.join([*PROGRAMS, *ALIASES])}",
        "fi",
        "",
    ]
    return "\n".join(lines)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    if shell == "bash":
        return bash_script(parser)
    if shell == "zsh":
        return zsh_script(parser)
    raise ValueError(f"no completion for {shell!r} (use bash or zsh)")
