"""The model summary as Lightning's ``utilities.model_summary``: rows, sizes, counts, modes, FLOPs, the table."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import ModelSummary, RichModelSummary
from callbacks.layer_summary import (
    LEFTOVER_PARAMS_NAME,
    NOT_APPLICABLE,
    UNKNOWN_SIZE,
    LayerSummary,
    Summary,
    get_human_readable_count,
    summarize,
)
from tests.helpers.regression import make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule


class TwoBranch(TrainModule):
    """Layers declared out of call order, one never called, a nested block, and a parameter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(4, 2)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.unused = nn.Conv2d(1, 1, 1)
        self.scale = nn.Parameter(torch.ones(2))
        self.example_input_array = torch.zeros(5, 4)
        self.summarising = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.summarising:  # the summary runs the example input in eval mode
            assert not self.training and not self.block[0].training
        return self.late(self.block(x)) * self.scale

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.summarising = False
        return self(batch[0]).sum()

    def on_train_end(self) -> None:
        self.summarising = True

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_rows_follow_declaration_and_sizes_come_from_one_eval_forward() -> None:
    model = TwoBranch()
    model.block[1].eval()  # a mode of its own, restored afterwards
    summary = summarize(model, max_depth=1)
    assert summary.layer_names == ["late", "block", "unused"]
    assert summary.layer_types == ["Linear", "Sequential", "Conv2d"]
    assert summary.in_sizes == [[5, 4], [5, 4], UNKNOWN_SIZE]
    assert summary.out_sizes == [[5, 2], [5, 4], UNKNOWN_SIZE]
    assert summary.param_nums == [10, 20, 2]
    assert summary.total_parameters == summary.trainable_parameters == 34
    assert summary.total_layer_params == 32  # the module's own `scale` is no layer's
    assert summary.training_modes == [True, True, True]
    assert summary.total_training_modes == {"train": 4, "eval": 1}
    assert model.training and model.block[0].training and not model.block[1].training
    # FLOPs of the one forward: two matrix products (2 * rows * in * out each).
    assert summary.total_flops == 2 * 5 * 4 * 4 + 2 * 5 * 4 * 2
    assert summary.model_size == pytest.approx(34 * 4 / 1e6)  # 32-bit parameters without a trainer, in 10**6 bytes


def test_depth_minus_one_lists_every_level_and_zero_none() -> None:
    assert summarize(TwoBranch(), max_depth=-1).layer_names == ["late", "block", "block.0", "block.1", "unused"]
    assert summarize(TwoBranch(), max_depth=0).layer_names == []
    for bad in (-2, "deep", True):
        with pytest.raises(ValueError, match=r"`max_depth` can be -1, 0 or > 0"):
            Summary(TwoBranch(), max_depth=bad)  # type: ignore[arg-type]


def test_the_leftover_row_and_the_table_columns() -> None:
    data = dict(summarize(TwoBranch())._get_summary_data())
    assert list(data) == [" ", "Name", "Type", "Params", "Mode", "FLOPs", "In sizes", "Out sizes"]
    assert [column[-1] for column in data.values()] == [
        " ",
        LEFTOVER_PARAMS_NAME,
        NOT_APPLICABLE,
        "2  ",
        NOT_APPLICABLE,
        NOT_APPLICABLE,
        NOT_APPLICABLE,
        NOT_APPLICABLE,
    ]
    assert data["FLOPs"][:3] == ["80  ", "160  ", "0  "]
    assert all(isinstance(cell, str) for column in data.values() for cell in column)


def test_hooks_are_gone_and_scripted_layers_show_unknown_sizes() -> None:
    model = nn.Sequential(torch.jit.script(nn.Linear(2, 3)), nn.Linear(3, 1))
    model.example_input_array = torch.zeros(4, 2)  # type: ignore[assignment]
    summary = Summary(model)
    assert summary.in_sizes == [UNKNOWN_SIZE, [4, 3]]
    for row in summary._layer_summary.values():
        handle = row._hook_handle
        assert handle is None or handle.id not in handle.hooks_dict_ref()


def test_lazy_parameters_count_zero_with_one_warning() -> None:
    summary = Summary(nn.Sequential(nn.LazyLinear(3)))
    with pytest.warns(UserWarning, match="may be inaccurate"):
        assert summary.total_parameters == 0
    assert summary.trainable_parameters == 0  # warned once per summary


def test_a_layer_summary_records_its_first_call() -> None:
    layer = nn.Conv2d(3, 8, 3)
    row = LayerSummary(layer)
    layer(torch.rand(1, 3, 5, 5))
    layer(torch.rand(2, 3, 7, 7))
    assert (row.layer_type, row.num_parameters, row.in_size, row.out_size) == (
        "Conv2d",
        224,
        [1, 3, 5, 5],
        [1, 8, 3, 3],
    )


def test_human_readable_counts() -> None:
    got = [get_human_readable_count(n) for n in (0, 123, 1234, 2_000_000, 3e9, 4e14, 5e15)]
    assert got == ["0  ", "123  ", "1.2 K", "2.0 M", "3.0 B", "400 T", "5,000 T"]


def test_the_model_size_follows_the_trainers_precision(tmp_path: Any) -> None:
    model = TwoBranch()
    quiet_trainer(tmp_path, max_steps=1, precision="bf16-true").fit(model, make_loader(4, 4))
    assert summarize(model).model_size == pytest.approx(34 * 2 / 1e6)
    quiet_trainer(tmp_path, max_steps=1, precision="bf16-mixed").fit(model, make_loader(4, 4))
    with pytest.warns(UserWarning, match="Precision bf16-mixed is not supported by the model summary"):
        assert summarize(model).model_size == pytest.approx(34 * 4 / 1e6)


def test_the_callback_hands_lightnings_summarize_the_data_and_zero_depth_prints_nothing(tmp_path: Any) -> None:
    seen: list[tuple[Any, ...]] = []

    class Mine(ModelSummary):
        @staticmethod
        def summarize(
            summary_data: Any, total_parameters: int, trainable_parameters: int, *args: Any, **kw: Any
        ) -> None:
            seen.append((summary_data[1], total_parameters, trainable_parameters, kw))

    quiet_trainer(tmp_path, max_steps=1, callbacks=[Mine(colour="red")]).fit(TwoBranch(), make_loader(4, 4))
    assert seen == [
        (("Name", ["late", "block", "unused", LEFTOVER_PARAMS_NAME]), 34, 34, {"total_flops": 240, "colour": "red"})
    ]
    out = io.StringIO()
    quiet_trainer(tmp_path, max_steps=1, callbacks=[ModelSummary(max_depth=0, stream=out)]).fit(
        TwoBranch(), make_loader(4, 4)
    )
    assert out.getvalue() == ""


def test_the_rich_summary_draws_the_same_rows(tmp_path: Any) -> None:
    out = io.StringIO()
    quiet_trainer(tmp_path, max_steps=1, callbacks=[RichModelSummary(stream=out)]).fit(TwoBranch(), make_loader(4, 4))
    text = out.getvalue()
    for cell in ("late", "block", "unused", LEFTOVER_PARAMS_NAME, "[5, 4]", "Total estimated model params size (MB)"):
        assert cell in text, cell


def test_rich_summary_without_rich_is_refused_when_built_through_lightnings_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trainer.lightning.callbacks.rich_model_summary as lightning_module

    # Lightning's module path holds the flag its class reads: a program (or test) that clears it there
    # sees Lightning's refusal, at construction.
    monkeypatch.setattr(lightning_module, "_RICH_AVAILABLE", False)
    with pytest.raises(ModuleNotFoundError, match="`RichModelSummary` requires `rich` to be installed"):
        RichModelSummary()
    ModelSummary()  # the plain table needs no rich
