"""``tvmc disassemble``: the accelerator programs of a package or blob, as assembly."""

from __future__ import annotations

import difflib
import re

from tvm_accel.errors import AccelError

#: a layer's header line in a target's listing (``\n<layer>:  ; <op> ...``)
_LAYER_HEADER = re.compile(r"^(\S+):  ; ", re.MULTILINE)


def cmd_disassemble(args) -> int:
    from tvm_accel.blob import unpack_blob
    from tvm_accel.package import read_blobs
    from tvm_accel.target import get_target

    if args.limit < 0:
        raise AccelError(f"--limit {args.limit}: give a number of lines >= 0 (0: no limit)")
    blobs = read_blobs(args.package)
    if not blobs:
        print("no offloaded functions in this package")
    listings = []
    for name, data in blobs.items():
        target = get_target(unpack_blob(data).target)
        listings.append((f"; function {name} ({target.name}, {len(data)} bytes)",
                         target.disassemble(data)))
    if args.layer is not None and blobs:
        layers = [ly for _, text in listings for ly in _LAYER_HEADER.findall(text)]
        if args.layer not in layers:
            near = difflib.get_close_matches(args.layer, layers, n=5, cutoff=0)
            raise AccelError(f"--layer {args.layer}: no offloaded layer of that name in "
                             f"{args.package} (nearest: {', '.join(near) or 'none'})")
        listings = [(head, get_target(unpack_blob(data).target).disassemble(data, args.layer))
                    for (head, _), data in zip(listings, blobs.values(), strict=True)]
    lines = [ln for head, text in listings for ln in (head, *text.split("\n"))]
    if args.limit and len(lines) > args.limit:
        lines = [*lines[:args.limit], f"; ... {len(lines) - args.limit} more lines "
                 f"(--limit {args.limit})"]
    print("\n".join(lines))
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("disassemble", help="print the accelerator programs of a package or blob")
    d.add_argument("package", help="compiled package (.tar) or a raw program blob")
    d.add_argument("--layer", help="only this layer (an offloaded layer's name)")
    d.add_argument("--limit", type=int, default=0, metavar="N",
                   help="print at most N lines of the whole listing (default: all)")
    d.set_defaults(func=cmd_disassemble)
