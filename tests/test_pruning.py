"""``ModelPruning``: the same weights as a hand-written loop pruning with ``torch.nn.utils.prune``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn

from callbacks import ModelCheckpoint, ModelPruning
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer.common.errors import MisconfigurationException


def _pairs(model: TinyMLP) -> list[tuple[nn.Module, str]]:
    """The pairs ModelPruning chooses by default: every weight, then every bias, module by module."""
    linears = [m for m in model.net if isinstance(m, nn.Linear)]
    return [(m, name) for name in ("weight", "bias") for m in linears]


def _hand_written(epochs: int, amount: float, local: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    pairs = _pairs(model)
    for _ in range(epochs):
        for x, y in make_batches(3):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        if local:
            for module, name in pairs:
                prune.l1_unstructured(module, name=name, amount=amount)
        else:
            prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=amount)
    for module, name in pairs:
        prune.remove(module, name)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _fit(root: Path | None = None, val: bool = False, **kwargs: Any) -> tuple[TinyMLP, ModelPruning]:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    pruning = ModelPruning("l1_unstructured", amount=0.3, use_lottery_ticket_hypothesis=False, **kwargs)
    callbacks: list[Any] = [pruning]
    if root is not None:
        callbacks.append(ModelCheckpoint(dirpath=root, save_last=True, save_top_k=-1))
    trainer = quiet_trainer(
        root, callbacks, max_epochs=2, enable_checkpointing=root is not None, limit_val_batches=1 if val else 0
    )
    trainer.fit(model, make_batches(3), make_batches(1, seed=1) if val else None)
    return model, pruning


@pytest.mark.parametrize("local", [False, True])
def test_pruned_weights_equal_a_hand_written_loop_pruning_at_each_epoch_end(local: bool) -> None:
    model, _ = _fit(use_global_unstructured=not local)
    expected = _hand_written(2, 0.3, local)
    got = model.state_dict()
    assert sorted(got) == sorted(expected)  # permanent at the end: no weight_orig / weight_mask left
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    assert int((got["net.0.weight"] == 0).sum()) > 0


def test_pruning_at_validation_end_trains_on_and_equals_pruning_at_training_end() -> None:
    # Validation inside fit runs under no_grad (as Lightning): masks made there can feed the next epoch.
    at_train, _ = _fit(val=True)
    at_val, _ = _fit(val=True, prune_on_train_epoch_end=False)
    for key, value in at_train.state_dict().items():
        assert torch.equal(at_val.state_dict()[key], value), key


def test_checkpoints_hold_the_pruned_tensors_and_the_module_keeps_its_masks(tmp_path: Path) -> None:
    model, _ = _fit(tmp_path, make_pruning_permanent=True)
    first = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=True)["state_dict"]
    assert not [k for k in first if k.endswith(("_orig", "_mask"))]
    # Global pruning of 30% of every weight and bias after the first epoch, written as plain tensors.
    assert sum(int((t == 0).sum()) for t in first.values()) == round(0.3 * sum(t.numel() for t in first.values()))
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]
    final = model.state_dict()
    assert sorted(last) == sorted(final)
    for key, value in final.items():
        assert torch.equal(last[key], value), key


def test_without_permanence_checkpoints_and_the_module_keep_the_reparametrization(tmp_path: Path) -> None:
    model, _ = _fit(tmp_path, make_pruning_permanent=False)
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]
    assert "net.0.weight_orig" in last and "net.0.weight_mask" in last
    assert hasattr(model.net[0], "weight_mask")


def test_amount_and_apply_pruning_may_be_callables_of_the_epoch() -> None:
    seen: list[int] = []

    def amount(epoch: int) -> float:
        seen.append(epoch)
        return 0.5 if epoch == 1 else 0.0

    model, _ = _fit_amount(amount)
    assert seen == [0, 1]
    weight = model.net[0].weight
    assert int((weight == 0).sum()) == weight.numel() // 2


def _fit_amount(amount: Any) -> tuple[TinyMLP, ModelPruning]:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    pruning = ModelPruning(
        "l1_unstructured", parameters_to_prune=[(model.net[0], "weight")], amount=amount,
        use_global_unstructured=False, use_lottery_ticket_hypothesis=False,
    )  # fmt: skip
    quiet_trainer(None, [pruning], max_epochs=2).fit(model, make_batches(3))
    return model, pruning


def test_lottery_ticket_resets_the_surviving_weights_to_their_values_at_setup() -> None:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    start = model.net[0].weight.detach().clone()
    pruning = ModelPruning(
        "l1_unstructured", parameters_to_prune=[(model.net[0], "weight")], amount=0.5,
        use_lottery_ticket_hypothesis=True, make_pruning_permanent=False,
    )  # fmt: skip
    quiet_trainer(None, [pruning], max_epochs=1).fit(model, make_batches(3))
    assert torch.equal(model.net[0].weight_orig, start)
    model(torch.zeros(1, 32))  # the pruned tensor is recomputed before each forward
    assert torch.equal(model.net[0].weight, start * model.net[0].weight_mask)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pruning_fn": "l1_unstructured", "parameter_names": ["gamma"]}, r"gamma isn't in \('weight', 'bias'\)"),
        ({"pruning_fn": {}}, r"expected to be a str in \["),
        ({"pruning_fn": "random_structured"}, "`pruning_dim` should be provided"),
        ({"pruning_fn": "ln_structured", "pruning_dim": 0}, "`ln_structured` pruning, the `pruning_norm`"),
        ({"pruning_fn": "ln_structured", "pruning_dim": 0, "pruning_norm": 1}, "use_global_unstructured=True"),
        ({"pruning_fn": prune.L1Unstructured, "use_global_unstructured": False}, "currently only supported with"),
        ({"pruning_fn": "l1_unstructured", "amount": "half"}, "either an int, a float or Callable"),
        ({"pruning_fn": "l1_unstructured", "verbose": 3}, r"must be any of \(0, 1, 2\)"),
    ],
)
def test_misconfigurations_are_refused_with_lightnings_words(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationException, match=match):
        ModelPruning(**kwargs)


def test_parameters_to_prune_outside_the_model_are_refused() -> None:
    stranger = nn.Linear(2, 2)
    pruning = ModelPruning("l1_unstructured", parameters_to_prune=[(stranger, "weight")])
    with pytest.raises(MisconfigurationException, match="don't exist in the model"):
        quiet_trainer(None, [pruning], max_epochs=1).fit(TinyMLP(), make_batches(1))


def _fit_to(root: Path, epochs: int, ckpt: Path | None, permanent: bool) -> TinyMLP:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    pruning = ModelPruning(
        "l1_unstructured", amount=0.3, use_lottery_ticket_hypothesis=False, make_pruning_permanent=permanent
    )
    saver = ModelCheckpoint(dirpath=root, save_top_k=-1)
    trainer = quiet_trainer(root, [pruning, saver], max_epochs=epochs, enable_checkpointing=True)
    trainer.fit(model, make_batches(3), ckpt_path=ckpt)
    return model


@pytest.mark.parametrize("permanent", [True, False])
def test_a_run_resumed_inside_pruning_ends_with_the_uninterrupted_runs_weights(tmp_path: Path, permanent: bool) -> None:
    whole = _fit_to(tmp_path / "whole", 3, None, permanent).state_dict()
    resumed = _fit_to(tmp_path / "resumed", 3, tmp_path / "whole" / "epoch=0-step=3.ckpt", permanent).state_dict()
    assert sorted(resumed) == sorted(whole)
    for key, value in whole.items():
        assert torch.equal(resumed[key], value), key
