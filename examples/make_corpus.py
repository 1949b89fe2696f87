"""Write the character-LM corpus (``examples/data/charlm_corpus.txt``) from the Python standard library.

No public-domain book is available offline on these machines, so, as DESIGN.md suggests, the corpus is
English prose every Python installation carries: the docstrings of the standard library's modules,
classes and functions (PSF-licensed text, not public domain). Files are visited in sorted order and
docstrings in source order, characters outside printable ASCII are replaced, and collection stops at
``--size`` bytes, so the same Python version always writes the same file. The committed file was
written by CPython 3.11; ``python -m examples.make_corpus`` rewrites it.
"""

from __future__ import annotations

import argparse
import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path

__all__ = ["VOCAB", "docstrings", "make_corpus", "normalise"]

#: Newline plus printable ASCII: the character LM's whole vocabulary.
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "charlm_corpus.txt"


def normalise(text: str) -> str:
    """Tabs to spaces, other characters outside :data:`VOCAB` to ``?``."""
    allowed = set(VOCAB)
    return "".join(c if c in allowed else "?" for c in text.replace("\t", "    "))


def docstrings(stdlib: Path) -> Iterator[str]:
    """Docstrings longer than a line, from the top-level standard library modules, in sorted order."""
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and "\n" in doc.strip():
                    yield doc.strip()


def make_corpus(size: int = 400_000, stdlib: Path | None = None) -> str:
    """About ``size`` characters of docstrings, separated by blank lines."""
    root = stdlib if stdlib is not None else Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for doc in docstrings(root):
        text = normalise(doc)
        parts.append(text)
        total += len(text) + 2
        if total >= size:
            break
    return "\n\n".join(parts) + "\n"


def main() -> None:
    """Write the corpus file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=400_000, help="characters to collect (default 400,000)")
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH, help="where to write")
    args = parser.parse_args()
    text = make_corpus(args.size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="ascii")
    print(f"wrote {len(text):,} characters to {args.out}")


if __name__ == "__main__":
    main()
