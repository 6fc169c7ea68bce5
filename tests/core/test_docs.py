"""The design docs stay true to the code: the generated supported-operators page matches the
pattern tables, every relative link resolves, and sources cite docs/architecture.md, not the
upper-case design page it replaced."""

from __future__ import annotations

import re
from pathlib import Path

from tvm_accel import supported_ops

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")


def _markdown_files() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


def _anchor(heading: str, seen: dict[str, int]) -> str:
    """GitHub's anchor of a heading (lower case, punctuation dropped, spaces to hyphens, a
    repeated anchor numbered ``-1``, ``-2`` ...)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else f"{slug}-{n}"


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    return {_anchor(m.group(1), seen) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text,
                                                          re.M)}


def _links(path: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return [m.group(1) for m in _LINK.finditer(text)]


def test_supported_operators_page_is_generated():
    page = DOCS / "supported-operators.md"
    assert page.exists(), f"docs/supported-operators.md is missing; run `{supported_ops.COMMAND}`"
    assert page.read_text(encoding="utf-8") == supported_ops.render(), (
        "docs/supported-operators.md differs from the pattern tables; regenerate it with "
        f"`PYTHONPATH=python {supported_ops.COMMAND}` and commit the result")


def test_relative_links_resolve():
    broken = []
    for md in _markdown_files():
        for link in _links(md):
            if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto: ...
                continue
            target, _, anchor = link.partition("#")
            dest = (md.parent / target).resolve() if target else md
            where = f"{md.relative_to(ROOT)}: {link}"
            if not dest.exists():
                broken.append(f"{where} (no file {target})")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_no_source_cites_the_old_architecture_page():
    old = "ARCHITECTURE" + ".md"  # split, so this file does not cite it either
    cites = []
    for top in ("python", "tests", "sim"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".c", ".h", ".md", ".txt", ".json", ".toml") \
                    or not path.is_file():
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                     .splitlines(), 1):
                if old in line:
                    cites.append(f"{path.relative_to(ROOT)}:{i}")
    assert not cites, (f"cite docs/architecture.md (by section) instead of {old}:\n"
                       + "\n".join(cites))


#: dotted names in the docs that are not Python objects: the targets' entry point group
_NOT_PYTHON = {"tvm_accel.targets"}
_ROLE_REF = re.compile(r":(?:func|class|mod|data|meth|attr|exc):`~?(tvm_[A-Za-z0-9_.]+)`")
_MD_REF = re.compile(r"`(tvm_(?:accel|vta_cp|dpu|marsellus)(?:\.[A-Za-z_]\w*)+)`")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module or an attribute path inside one."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_cross_references_name_objects_that_exist():
    """Every ``:func:`tvm_...``` of a docstring and every dotted `tvm_...` name in the docs
    (the registered ``<package>.run`` functions aside) still names a module or object."""
    refs = [(p, m[1]) for p in sorted((ROOT / "python").rglob("*.py"))
            for m in _ROLE_REF.finditer(p.read_text())]
    refs += [(p, m[1]) for p in _markdown_files() for m in _MD_REF.finditer(p.read_text())
             if m[1] not in _NOT_PYTHON and not re.fullmatch(r"tvm_\w+\.run", m[1])]
    assert len(refs) > 100
    stale = [f"{p.relative_to(ROOT)}: {ref}" for p, ref in refs if not _resolves(ref)]
    assert not stale, stale
