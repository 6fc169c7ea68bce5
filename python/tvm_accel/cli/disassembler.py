"""``tvmc disassemble``: the accelerator programs of a package or blob, as assembly."""

from __future__ import annotations


def cmd_disassemble(args) -> int:
    from tvm_accel.blob import unpack_blob
    from tvm_accel.package import read_blobs
    from tvm_accel.target import get_target

    blobs = read_blobs(args.package)
    if not blobs:
        print("no offloaded functions in this package")
    for name, data in blobs.items():
        target = get_target(unpack_blob(data).target)
        print(f"; function {name} ({target.name}, {len(data)} bytes)")
        print(target.disassemble(data, layer=args.layer, limit=args.limit))
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("disassemble", help="print the accelerator programs of a package or blob")
    d.add_argument("package", help="compiled package (.tar) or a raw program blob")
    d.add_argument("--layer", help="only this layer")
    d.add_argument("--limit", type=int, default=0, help="at most N instructions per layer")
    d.set_defaults(func=cmd_disassemble)
