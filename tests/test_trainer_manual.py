"""Manual optimisation, ``training_step`` returning None or a dict: weights equal a plain loop."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from callbacks.base import Callback
from tests.helpers.regression import Regressor, assert_same_weights, make_loader, plain_copy, sgd


def two_optimizers(net: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer, Any]:
    first = torch.optim.SGD(net[0].parameters(), lr=0.05, momentum=0.9)  # type: ignore[index]
    second = torch.optim.Adam(net[2].parameters(), lr=0.01)  # type: ignore[index]
    return first, second, torch.optim.lr_scheduler.StepLR(first, step_size=1, gamma=0.5)


class Manual(Regressor):
    """Steps the first optimizer every batch and the second every other batch."""

    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        first, second = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self(x), y)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        if batch_idx % 2 == 0:
            second.step()
        return loss

    def on_train_epoch_end(self) -> None:
        self.lr_schedulers().step()  # under manual optimisation the user steps schedulers

    def configure_optimizers(self) -> Any:
        first, second, sched = two_optimizers(self.net)
        return [first, second], [sched]


def test_manual_optimisation_with_two_optimizers_matches_plain_loop(make_trainer: Any) -> None:
    module = Manual()
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=2)
    trainer.fit(module, make_loader(10, 4))  # 3 batches per epoch

    first, second, sched = two_optimizers(net)
    for _ in range(2):
        for batch_idx, (x, y) in enumerate(make_loader(10, 4)):
            loss = F.mse_loss(net(x), y)
            first.zero_grad()
            second.zero_grad()
            loss.backward()
            first.step()
            if batch_idx % 2 == 0:
                second.step()
        sched.step()
    assert_same_weights(module.net, net)
    assert trainer.global_step == 2 * (3 + 2)  # every optimizer step counts, as in Lightning
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.05 * 0.25  # stepped by the user only


def test_manual_optimisation_calls_on_before_optimizer_step(make_trainer: Any) -> None:
    seen: list[int] = []

    class Spy(Callback):
        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            seen.append(id(optimizer))

    trainer = make_trainer(max_epochs=1, callbacks=[Spy()])
    trainer.fit(Manual(), make_loader(6, 2))
    first, second = (id(o) for o in trainer.optimizers)
    assert seen == [first, second, first, first, second]


def test_training_step_returning_none_skips_that_batch(make_trainer: Any) -> None:
    class Skipper(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            return None if batch_idx == 1 else loss

    module = Skipper()
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=2)
    trainer.fit(module, make_loader(10, 4))
    opt = sgd(net)
    for _ in range(2):
        for batch_idx, (x, y) in enumerate(make_loader(10, 4)):
            if batch_idx == 1:
                continue
            F.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert_same_weights(module.net, net)
    # The skipped batches count as steps, as in Lightning (its optimizer is handed a closure giving None).
    assert trainer.global_step == 6


def test_training_step_returning_dict_with_loss(make_trainer: Any) -> None:
    outputs: list[Any] = []

    class DictModule(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return {"loss": super().training_step(batch, batch_idx), "idx": batch_idx}

        def on_train_batch_end(self, out: Any, batch: Any, batch_idx: int) -> None:
            outputs.append(out)

    module = DictModule()
    net = plain_copy(module)
    make_trainer(max_epochs=1).fit(module, make_loader(10, 4))
    opt = sgd(net)
    for x, y in make_loader(10, 4):
        F.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert_same_weights(module.net, net)
    assert [o["idx"] for o in outputs] == [0, 1, 2]
    assert all(isinstance(o["loss"], torch.Tensor) for o in outputs)
