"""The ``rlvr-alloc`` console script: ``rlvr-alloc COMMAND ...``.

Commands:

- ``advise LOG [--k 8] [--batch 32] [--out DIR]``: will allocation pay on this run? (docs/advisor.md)
"""

from __future__ import annotations

import sys
from typing import Callable


def _advise(argv: list[str]) -> int:
    from rlvr_core.advise.report import main

    return main(argv)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "advise": (_advise, "replay every allocator on a run's rollout log and recommend one (docs/advisor.md)"),
}


def usage() -> str:
    return "usage: rlvr-alloc COMMAND [ARGS]\n\ncommands:\n" + "".join(
        f"  {name:<8} {doc}\n" for name, (_, doc) in COMMANDS.items())


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0 if args else 2
    if args[0] not in COMMANDS:
        sys.stderr.write(f"rlvr-alloc: unknown command {args[0]!r}\n" + usage())
        return 2
    return COMMANDS[args[0]][0](args[1:])


if __name__ == "__main__":
    sys.exit(main())
