"""The `vase-triton` command (also `python -m vase_triton`): argument parsing and dispatch.

Subcommands: `generate` (`vase_triton.commands.generate`), `eval` (`vase_triton.eval.command`)
and `autotune` (`vase_triton.autotune.command`). Errors print one line to stderr and exit
non-zero: 2 for arguments the parser refuses (an unknown option, a malformed value), 1 for
every other failure (options valid alone but not together or not for the model, missing
files, out of memory), 130 when interrupted.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from vase_triton.autotune.command import add_autotune_command
from vase_triton.commands.common import CommandError, OneLineErrorParser
from vase_triton.commands.generate import add_generate_command
from vase_triton.eval.command import add_eval_command


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="vase-triton", description="Run reasoning models with a fixed-size VaSE KV cache.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    commands.required = True
    add_generate_command(commands)
    add_eval_command(commands)
    add_autotune_command(commands)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except CommandError as error:
        print(f"vase-triton: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vase-triton: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail
        return 1


if __name__ == "__main__":
    sys.exit(main())
