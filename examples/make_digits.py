"""Write the default job's data (``examples/data/digits.npz``) from scikit-learn's bundled digits.

The data are the test part of UCI's "Optical Recognition of Handwritten Digits" set (E. Alpaydin,
C. Kaynak, 1998; CC BY 4.0 at UCI), as scikit-learn ships it (BSD-3-Clause): 1,797 images of 8x8
pixels with intensities 0-16, and their labels 0-9. They are stored as uint8 in a compressed ``.npz``
(45 KB) so that the default job reads them with NumPy instead of importing scikit-learn and SciPy.
``python -m examples.make_digits`` rewrites the file; it needs scikit-learn (a ``dev`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .digits import DIGITS_PATH

__all__ = ["make_digits"]


def make_digits(path: Path = DIGITS_PATH) -> None:
    """Write scikit-learn's digits to ``path`` as uint8 ``images`` (1797 x 64) and ``labels`` (1797,)."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    # Pixel values are whole numbers 0..16 and labels 0..9: uint8 holds both exactly.
    if not (np.array_equal(images, np.round(images)) and images.min() >= 0 and images.max() <= 16):
        raise ValueError("scikit-learn's digits are no longer whole numbers in 0..16")
    np.savez_compressed(path, images=images.astype(np.uint8), labels=labels.astype(np.uint8))


def main() -> None:
    """``python -m examples.make_digits [--out PATH]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DIGITS_PATH)
    args = parser.parse_args()
    make_digits(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
