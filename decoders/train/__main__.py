"""`python -m decoders.train NAME [options]`: see decoders/train/__init__.py."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from decoders.train import ARTIFACTS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ARTIFACTS:
        listing = "\n".join(f"  {name:10} {what}" for name, what in ARTIFACTS.items())
        print(f"usage: python -m decoders.train NAME [options]\n\nNAME:\n{listing}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown NAME {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(f".{name}", __package__)
    ap = argparse.ArgumentParser(
        prog=f"python -m decoders.train {name}", description=module.__doc__.split("\n\n")[0]
    )
    module.add_arguments(ap)
    args = ap.parse_args(rest)
    card = module.run(args, [name, *rest])
    print(json.dumps(card, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
