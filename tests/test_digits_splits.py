"""The default job's three splits are disjoint: the test accuracy is measured on images nothing selected on."""

from __future__ import annotations

import pytest
import torch

from examples.digits import DigitsData


def test_train_validation_and_test_sets_are_disjoint_and_cover_the_digits() -> None:
    data = DigitsData()
    data.setup("fit")
    assert data.train_set is not None and data.val_set is not None and data.test_set is not None
    sets = [data.train_set.tensors[0], data.val_set.tensors[0], data.test_set.tensors[0]]
    assert [len(s) for s in sets] == [1079, 359, 359]
    # Rows as bytes: an image in two sets would show up twice (the digits hold no exact duplicates
    # across these sets, which this also pins down).
    rows = [{bytes(r.numpy().tobytes()) for r in s} for s in sets]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])
    loaders = {"val": data.val_dataloader(), "test": data.test_dataloader()}
    assert torch.equal(next(iter(loaders["test"]))[0], data.test_set.tensors[0][:256])
    assert not torch.equal(next(iter(loaders["val"]))[0][:8], next(iter(loaders["test"]))[0][:8])


@pytest.mark.parametrize(("val", "test"), [(0.2, 0.0), (0.5, 0.5), (0.2, 0.9)])
def test_fractions_that_leave_no_split_are_refused(val: float, test: float) -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        DigitsData(val_fraction=val, test_fraction=test)
