"""fracgpu-bench: one entry point, one subcommand per benchmark area.

Each area lives in its own package under ``bench/`` and exposes ``main(argv) -> int``;
add it to ``_COMMANDS`` below. Areas are imported only when chosen.
"""

import importlib
import sys
from collections.abc import Callable, Sequence

from fracgpu import __version__

# subcommand -> (module with main(argv) -> int, one-line help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "placement": (
        "bench.placement.cli",
        "replay an openb-format trace through the placement policies",
    ),
    "admission": (
        "bench.admission.cli",
        "admission latency budget: empty TLS handler, /mutate, pod creates via kube-apiserver",
    ),
    "admission-cost": (
        "bench.admission.cost",
        "one admission in process: CPU time and (under valgrind) instructions per admission",
    ),
    "admission-stall": (
        "bench.admission.stall",
        "p99 of ordinary pods while pods as large as kube-apiserver stores arrive, vs without",
    ),
    "placement-constraints": (
        "bench.placement.constraints",
        "decision latency per pod shape: nodeSelector, affinity, tolerations, model, multi-GPU",
    ),
    "guard": ("bench.guard.cli", "CI's performance guard: admission and placement vs baseline"),
    "placement-synth": (
        "bench.placement.synth",
        "write a synthetic pod list in the openb format (sharing, multi-GPU, models, CPU)",
    ),
    "kubectl-startup": (
        "bench.kubectl_startup",
        "kubectl fracgpu's start-up time next to importing the kubernetes package",
    ),
}


def _usage() -> str:
    lines = ["usage: fracgpu-bench COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<18} {help_}" for name, (_, help_) in _COMMANDS.items()]
    lines += ["", "fracgpu-bench COMMAND --help shows a command's options; --version the version."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"fracgpu-bench {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in _COMMANDS:
        print(f"fracgpu-bench: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[name][0])
    run: Callable[[list[str]], int] = module.main
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
