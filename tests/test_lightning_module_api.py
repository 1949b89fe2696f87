"""TrainModule's Lightning properties and helpers, and ``self.log``'s Lightning options (issue #13)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import ModelSummary
from callbacks.base import Callback
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule


class Two(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)


def test_plain_properties_outside_a_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    m = Two()
    assert (m.global_rank, m.local_rank, m.logger, m.loggers) == (0, 0, None, [])
    assert (m.dtype, m.on_gpu, m.strict_loading, m.device_mesh, m.fabric) == (torch.float32, False, True, None, None)
    assert m.double().dtype == torch.float64
    m.print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"


def test_toggle_optimizer_switches_off_and_restores_requires_grad(tmp_path: Path) -> None:
    """Lightning's rule: the trainer's other optimizers' parameters are switched off; a parameter no optimizer
    holds keeps requiring grad (a layer trained by none still carries the loss's graph)."""
    m = Two()
    m.c = nn.Linear(2, 2)  # held by no optimizer
    m.b.bias.requires_grad = False  # a user's own choice, restored as it was
    opt_a, opt_b = torch.optim.SGD(m.a.parameters(), lr=0.1), torch.optim.SGD(m.b.parameters(), lr=0.1)
    trainer = quiet_trainer(tmp_path)
    trainer.optimizers = [opt_a, opt_b]
    m.trainer = trainer
    with m.toggled_optimizer(opt_a):
        assert [p.requires_grad for p in m.parameters()] == [True, True, False, False, True, True]
    assert [p.requires_grad for p in m.parameters()] == [True, True, True, False, True, True]
    with m.toggled_optimizer(opt_b):
        assert [p.requires_grad for p in m.parameters()] == [False, False, True, False, True, True]
    assert [p.requires_grad for p in m.parameters()] == [True, True, True, False, True, True]


def test_freeze_and_unfreeze() -> None:
    m = Two()
    assert m.freeze() is m and not m.training and not any(p.requires_grad for p in m.parameters())
    assert m.unfreeze() is m and m.training and all(p.requires_grad for p in m.parameters())


def test_all_gather_on_one_process_returns_the_data() -> None:
    seen: list[Any] = []

    class Gather(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            seen.append(self.all_gather({"loss": loss, "n": [torch.tensor(1.0)]}, sync_grads=True))
            return loss

    quiet_trainer(max_epochs=1, limit_train_batches=1).fit(Gather(), make_loader(10, 4))
    assert seen[0]["loss"].requires_grad and torch.equal(seen[0]["n"][0], torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"all_gather\(group=\.\.\.\) is not supported"):
        Two().all_gather(torch.ones(1), group=object())


def test_loggers_are_the_trainers_logging_callbacks(tmp_path: Path) -> None:
    class Sink(Callback):
        is_logger = True  # what makes a callback one of the trainer's loggers

        def on_log_metrics(self, trainer: Any, module: Any, metrics: Any, step: int) -> None:
            pass

    sink = Sink()
    found: list[Any] = []

    class Look(Regressor):
        def on_fit_start(self) -> None:
            found.extend([self.logger, self.loggers])

    quiet_trainer(tmp_path, max_epochs=1, callbacks=[sink]).fit(Look(), make_loader(10, 4))
    assert found[0] is sink and found[1] == [sink]


def test_log_logger_false_stays_out_of_loggers_but_in_callback_metrics(tmp_path: Path) -> None:
    emitted: list[str] = []

    class Sink(Callback):
        is_logger = True  # what makes a callback one of the trainer's loggers

        def on_log_metrics(self, trainer: Any, module: Any, metrics: Any, step: int) -> None:
            emitted.extend(metrics)

    class Quiet(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("hidden", loss, logger=False)
            self.log("shown", loss, reduce_fx=torch.max, on_epoch=True, on_step=False)
            self.log("rz", loss, rank_zero_only=True, metric_attribute="unused", add_dataloader_idx=False)
            return loss

    trainer = quiet_trainer(tmp_path, max_epochs=1, log_every_n_steps=1, callbacks=[Sink()])
    trainer.fit(Quiet(), make_loader(10, 4))
    assert "hidden" in trainer.callback_metrics and "hidden" not in emitted and "hidden" not in trainer.logged_metrics
    assert "shown" in emitted and "rz" in emitted


def test_log_refuses_what_it_cannot_honour(tmp_path: Path) -> None:
    for kwargs, message in (
        ({"reduce_fx": torch.median}, "reduce_fx must be one of .*got 'median'"),
        ({"enable_graph": True}, "enable_graph=True"),
        ({"sync_dist_group": object()}, "sync_dist_group"),
    ):

        class Bad(Regressor):
            def training_step(self, batch: Any, batch_idx: int, kw: Any = kwargs) -> Any:
                loss = super().training_step(batch, batch_idx)
                self.log("x", loss, **kw)
                return loss

        with pytest.raises(ValueError, match=message):
            quiet_trainer(tmp_path, max_epochs=1).fit(Bad(), make_loader(10, 4))


def test_model_summary_shows_io_sizes_with_example_input_array(tmp_path: Path) -> None:
    class WithExample(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.example_input_array = torch.zeros(3, 4)

    out = io.StringIO()
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[ModelSummary(stream=out)]).fit(WithExample(), make_loader(10, 4))
    text = out.getvalue()
    assert "In sizes" in text and "| [3, 4]   | [3, 1]" in text


def test_to_torchscript_and_to_onnx(tmp_path: Path) -> None:
    m = Regressor()
    m.example_input_array = torch.ones(2, 4)
    scripted = m.to_torchscript(tmp_path / "m.pt", method="trace")
    assert torch.equal(scripted(torch.ones(2, 4)), m(torch.ones(2, 4)))
    assert (tmp_path / "m.pt").exists()
    with pytest.raises(NotImplementedError, match="to_tensorrt is not supported"):
        m.to_tensorrt()


class Scriptable(TrainModule):
    """Sets the attributes a Lightning model sets in ``__init__``, and holds a child TrainModule."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.strict_loading = False
        self.prepare_data_per_node = False
        self.example_input_array = torch.ones(2, 2)
        self.child = Two()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child.b(self.child.a(x))


def test_to_torchscript_scripts_a_module_with_lightnings_attributes(tmp_path: Path) -> None:
    """torch.jit.script compiles the module: the trainer-reading properties are skipped, no annotation trips it."""
    m = Scriptable()
    with pytest.warns(DeprecationWarning, match="to_torchscript` has been deprecated"):
        scripted = m.to_torchscript(tmp_path / "sub" / "m.pt")
    x = torch.randn(3, 2)
    assert torch.equal(scripted(x), m(x)) and m.training and not scripted.training
    assert torch.equal(torch.jit.load(str(tmp_path / "sub" / "m.pt"))(x), m(x))
    assert not callable(getattr(scripted, "training_step", None))
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):  # the scripting flag is off again
        _ = m.child.trainer
    with pytest.raises(ValueError, match="only supports 'script' or 'trace'"):
        m.to_torchscript(method="compile")


def test_to_onnx_exports_through_torch_onnx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thin wrapper: eval mode, the example input, the path, the options (onnx itself is not installed here)."""
    calls: list[Any] = []
    monkeypatch.setattr(torch.onnx, "export", lambda model, args, f, **kw: calls.append((model.training, args, f, kw)))
    m = Regressor()
    with pytest.raises(ValueError, match=r"neither `input_sample` nor `model\.example_input_array` attribute is set"):
        m.to_onnx(tmp_path / "m.onnx")
    sample = torch.ones(2, 4)
    m.to_onnx(tmp_path / "m.onnx", sample, opset_version=17)
    assert calls == [(False, (sample,), str(tmp_path / "m.onnx"), {"opset_version": 17})] and m.training
    stream = io.BytesIO()  # Lightning's: a stream is written into, not made a file name
    m.to_onnx(stream, sample)
    assert calls[-1][2] is stream


def test_clip_gradients_refuses_a_value_the_trainer_sets_otherwise(tmp_path: Path) -> None:
    """As Lightning: ``self.clip_gradients`` with a value or algorithm other than the Trainer was given is refused
    (two places would decide one clipping); one the Trainer was not given is the module's to choose."""
    from trainer.common.errors import MisconfigurationException

    class Clips(Regressor):
        def __init__(self, **clip: Any) -> None:
            super().__init__()
            self.clip = clip

        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any, gradient_clip_algorithm: Any
        ) -> None:
            self.clip_gradients(optimizer, **self.clip)

    with pytest.raises(MisconfigurationException, match=r"gradient_clip_val=0\.5\)` and have passed `clip_grad"):
        quiet_trainer(tmp_path, max_epochs=1, gradient_clip_val=0.5).fit(
            Clips(gradient_clip_val=0.1), make_loader(8, 4)
        )
    with pytest.raises(MisconfigurationException, match=r"gradient_clip_algorithm='norm'\)` and have passed"):
        trainer = quiet_trainer(tmp_path, max_epochs=1, gradient_clip_algorithm="norm")
        trainer.fit(Clips(gradient_clip_algorithm="value", gradient_clip_val=0.1), make_loader(8, 4))
    quiet_trainer(tmp_path, max_epochs=1).fit(
        Clips(gradient_clip_algorithm="value", gradient_clip_val=0.1), make_loader(8, 4)
    )


def test_ranks_are_the_trainers() -> None:
    from unittest import mock

    m = Two()
    m.trainer = mock.Mock(global_rank=3, local_rank=1)
    assert (m.global_rank, m.local_rank) == (3, 1)
