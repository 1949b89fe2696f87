"""Every public LightningModule / LightningDataModule name is honoured or refused (issue #13, rule one).

The lists are Lightning 2.6.6's public API (its method names and parameter names). For each name
this test checks that geartrain has it with Lightning's parameters in Lightning's order, and names
the test that shows it honoured, or the one that shows it refused with a message. A name missing
from the tables fails the test, so a new Lightning name cannot slip through unexamined.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from trainer import TrainModule
from trainer.datamodule import DataModule

H = "tests.test_lightning_hooks"
ORDER = "tests.test_lightning_hook_order::test_hook_order_matches_lightning"
P = "tests.test_lightning_hparams"
C = "tests.test_lightning_checkpoint"
A = "tests.test_lightning_module_api"

#: LightningModule 2.6.6: method -> (its parameters, the test that shows geartrain honours or refuses it).
MODULE_METHODS: dict[str, tuple[list[str], str]] = {
    "all_gather": (["data", "group", "sync_grads"], f"{A}::test_all_gather_on_one_process_returns_the_data"),
    "backward": (["loss"], f"{H}::test_backward_override_equals_hand_loop"),
    "clip_gradients": (
        ["optimizer", "gradient_clip_val", "gradient_clip_algorithm"],
        f"{H}::test_configure_gradient_clipping_override_equals_hand_loop",
    ),
    "configure_callbacks": ([], f"{H}::test_configure_callbacks_replace_trainer_callbacks_of_the_same_type"),
    "configure_gradient_clipping": (
        ["optimizer", "gradient_clip_val", "gradient_clip_algorithm"],
        f"{H}::test_configure_gradient_clipping_override_equals_hand_loop",
    ),
    "configure_model": ([], f"{H}::test_configure_model_builds_layers_before_the_optimizers"),
    "configure_optimizers": ([], ORDER),
    "configure_sharded_model": ([], "tests.test_lightning_api_walk::test_configure_sharded_model_is_called"),
    "freeze": ([], f"{A}::test_freeze_and_unfreeze"),
    "load_from_checkpoint": (
        ["checkpoint_path", "map_location", "hparams_file", "strict", "weights_only"],
        f"{P}::test_load_from_checkpoint_rebuilds_the_module",
    ),
    "log": (
        [
            "name",
            "value",
            "prog_bar",
            "logger",
            "on_step",
            "on_epoch",
            "reduce_fx",
            "enable_graph",
            "sync_dist",
            "sync_dist_group",
            "add_dataloader_idx",
            "batch_size",
            "metric_attribute",
            "rank_zero_only",
        ],
        f"{A}::test_log_logger_false_stays_out_of_loggers_but_in_callback_metrics",
    ),
    "log_dict": (["dictionary"], "tests.test_lightning_api_walk::test_log_dict_takes_lightnings_options"),
    "lr_scheduler_step": (["scheduler", "metric"], f"{H}::test_lr_scheduler_step_override_is_called_per_interval"),
    "lr_schedulers": ([], "tests.test_trainer_manual::test_manual_optimisation_with_two_optimizers_matches_plain_loop"),
    "manual_backward": (
        ["loss"],
        "tests.test_trainer_manual::test_manual_optimisation_with_two_optimizers_matches_plain_loop",
    ),
    "on_after_backward": ([], ORDER),
    "on_after_batch_transfer": (["batch", "dataloader_idx"], f"{H}::test_batch_transfer_hooks_module_and_datamodule"),
    "on_before_backward": (["loss"], ORDER),
    "on_before_batch_transfer": (["batch", "dataloader_idx"], f"{H}::test_batch_transfer_hooks_module_and_datamodule"),
    "on_before_optimizer_step": (["optimizer"], ORDER),
    "on_before_zero_grad": (["optimizer"], ORDER),
    "on_fit_end": ([], ORDER),
    "on_fit_start": ([], ORDER),
    "on_load_checkpoint": (["checkpoint"], "tests.test_lightning_api_walk::test_checkpoint_hyper_params_key"),
    "on_predict_batch_end": (["outputs", "batch", "batch_idx", "dataloader_idx"], ORDER),
    "on_predict_batch_start": (["batch", "batch_idx", "dataloader_idx"], ORDER),
    "on_predict_end": ([], ORDER),
    "on_predict_epoch_end": ([], ORDER),
    "on_predict_epoch_start": ([], ORDER),
    "on_predict_model_eval": ([], f"{H}::test_model_eval_and_train_hooks"),
    "on_predict_start": ([], ORDER),
    "on_save_checkpoint": (["checkpoint"], "tests.test_checkpoint_io::test_default_checkpoint_is_a_safe_complete_file"),
    "on_test_batch_end": (["outputs", "batch", "batch_idx", "dataloader_idx"], ORDER),
    "on_test_batch_start": (["batch", "batch_idx", "dataloader_idx"], ORDER),
    "on_test_end": ([], ORDER),
    "on_test_epoch_end": ([], ORDER),
    "on_test_epoch_start": ([], ORDER),
    "on_test_model_eval": ([], f"{H}::test_model_eval_and_train_hooks"),
    "on_test_model_train": ([], f"{H}::test_model_eval_and_train_hooks"),
    "on_test_start": ([], ORDER),
    "on_train_batch_end": (["outputs", "batch", "batch_idx"], ORDER),
    "on_train_batch_start": (["batch", "batch_idx"], ORDER),
    "on_train_end": ([], ORDER),
    "on_train_epoch_end": ([], ORDER),
    "on_train_epoch_start": ([], ORDER),
    "on_train_start": ([], ORDER),
    "on_validation_batch_end": (["outputs", "batch", "batch_idx", "dataloader_idx"], ORDER),
    "on_validation_batch_start": (["batch", "batch_idx", "dataloader_idx"], ORDER),
    "on_validation_end": ([], ORDER),
    "on_validation_epoch_end": ([], ORDER),
    "on_validation_epoch_start": ([], ORDER),
    "on_validation_model_eval": ([], f"{H}::test_model_eval_and_train_hooks"),
    "on_validation_model_train": ([], f"{H}::test_model_eval_and_train_hooks"),
    "on_validation_model_zero_grad": ([], f"{H}::test_model_eval_and_train_hooks"),
    "on_validation_start": ([], ORDER),
    "optimizer_step": (
        ["epoch", "batch_idx", "optimizer", "optimizer_closure"],
        f"{H}::test_optimizer_step_override_warmup_equals_hand_loop",
    ),
    "optimizer_zero_grad": (["epoch", "batch_idx", "optimizer"], f"{H}::test_optimizer_zero_grad_override_is_honoured"),
    "optimizers": (
        ["use_pl_optimizer"],
        "tests.test_trainer_manual::test_manual_optimisation_with_two_optimizers_matches_plain_loop",
    ),
    "predict_dataloader": ([], ORDER),
    "predict_step": ([], ORDER),
    "prepare_data": ([], "tests.test_lightning_distributed::test_prepare_data_runs_once_per_node_under_ddp"),
    "print": ([], f"{A}::test_plain_properties_outside_a_trainer"),
    "remove_ignored_hparams": (["ignore_list"], "tests.test_lightning_api_walk::test_remove_ignored_hparams"),
    "save_hyperparameters": (
        ["ignore", "frame", "logger"],
        f"{P}::test_save_hyperparameters_records_init_args_with_ignore_and_kwargs",
    ),
    "setup": (["stage"], ORDER),
    "teardown": (["stage"], ORDER),
    "test_dataloader": ([], ORDER),
    "test_step": ([], ORDER),
    "to_onnx": (["file_path", "input_sample"], f"{A}::test_to_onnx_exports_through_torch_onnx"),
    "to_tensorrt": ([], f"{A}::test_to_torchscript_and_to_onnx"),  # refused: see that test
    "to_torchscript": (["file_path", "method", "example_inputs"], f"{A}::test_to_torchscript_and_to_onnx"),
    "toggle_optimizer": (["optimizer"], f"{A}::test_toggle_optimizer_switches_off_and_restores_requires_grad"),
    "toggled_optimizer": (["optimizer"], f"{A}::test_toggle_optimizer_switches_off_and_restores_requires_grad"),
    "train_dataloader": ([], ORDER),
    "training_step": ([], f"{H}::test_steps_without_batch_idx"),
    "transfer_batch_to_device": (
        ["batch", "device", "dataloader_idx"],
        f"{H}::test_batch_transfer_hooks_module_and_datamodule",
    ),
    "unfreeze": ([], f"{A}::test_freeze_and_unfreeze"),
    "untoggle_optimizer": (["optimizer"], f"{A}::test_toggle_optimizer_switches_off_and_restores_requires_grad"),
    "val_dataloader": ([], ORDER),
    "validation_step": ([], ORDER),
}

#: LightningModule 2.6.6 public properties and attributes -> the test that reads them.
MODULE_ATTRIBUTES: dict[str, str] = {
    "CHECKPOINT_HYPER_PARAMS_KEY": "tests.test_lightning_api_walk::test_checkpoint_hyper_params_key",
    "CHECKPOINT_HYPER_PARAMS_NAME": "tests.test_lightning_api_walk::test_checkpoint_hyper_params_key",
    "CHECKPOINT_HYPER_PARAMS_TYPE": "tests.test_lightning_api_walk::test_checkpoint_hyper_params_key",
    "automatic_optimization": "tests.test_trainer_manual::test_manual_optimisation_with_two_optimizers_matches_plain_loop",
    "current_epoch": "tests.test_lightning_hooks::test_optimizer_zero_grad_override_is_honoured",
    "device": f"{A}::test_plain_properties_outside_a_trainer",
    "device_mesh": f"{A}::test_plain_properties_outside_a_trainer",
    "dtype": f"{A}::test_plain_properties_outside_a_trainer",
    "example_input_array": f"{A}::test_model_summary_shows_io_sizes_with_example_input_array",
    "fabric": f"{A}::test_plain_properties_outside_a_trainer",
    "global_rank": "tests.test_lightning_distributed::test_prepare_data_runs_once_per_node_under_ddp",
    "global_step": f"{H}::test_optimizer_step_override_warmup_equals_hand_loop",
    "hparams": f"{P}::test_attribute_dict_has_attribute_and_item_access",
    "hparams_initial": f"{P}::test_hparams_initial_is_unchanged_by_later_edits",
    "local_rank": "tests.test_lightning_distributed::test_prepare_data_runs_once_per_node_under_ddp",
    "logger": f"{A}::test_loggers_are_the_trainers_logging_callbacks",
    "loggers": f"{A}::test_loggers_are_the_trainers_logging_callbacks",
    "on_gpu": f"{A}::test_plain_properties_outside_a_trainer",
    "strict_loading": f"{P}::test_strict_loading_and_strict_argument",
    "trainer": f"{P}::test_datamodule_hparams_and_load_from_checkpoint",
}

#: LightningDataModule 2.6.6: method -> (its parameters, the test).
DATAMODULE_METHODS: dict[str, tuple[list[str], str]] = {
    "from_datasets": (
        ["train_dataset", "val_dataset", "test_dataset", "predict_dataset", "batch_size", "num_workers"],
        "tests.test_lightning_api_walk::test_from_datasets",
    ),
    "load_from_checkpoint": (
        ["checkpoint_path", "map_location", "hparams_file", "weights_only"],
        f"{P}::test_datamodule_hparams_and_load_from_checkpoint",
    ),
    "load_state_dict": (["state_dict"], f"{P}::test_datamodule_hparams_and_load_from_checkpoint"),
    "on_after_batch_transfer": (["batch", "dataloader_idx"], f"{H}::test_batch_transfer_hooks_module_and_datamodule"),
    "on_before_batch_transfer": (["batch", "dataloader_idx"], f"{H}::test_batch_transfer_hooks_module_and_datamodule"),
    "on_exception": (["exception"], f"{H}::test_on_exception_reaches_module_and_datamodule"),
    "predict_dataloader": ([], "tests.test_lightning_api_walk::test_from_datasets"),
    "prepare_data": ([], "tests.test_lightning_distributed::test_prepare_data_runs_once_per_node_under_ddp"),
    "remove_ignored_hparams": (["ignore_list"], "tests.test_lightning_api_walk::test_remove_ignored_hparams"),
    "save_hyperparameters": (["ignore", "frame", "logger"], f"{P}::test_datamodule_hparams_and_load_from_checkpoint"),
    "setup": (["stage"], "tests.test_lightning_distributed::test_prepare_data_runs_once_per_node_under_ddp"),
    "state_dict": ([], f"{P}::test_datamodule_hparams_and_load_from_checkpoint"),
    "teardown": (["stage"], "tests.test_trainer_data::test_datamodule_setup_gets_each_stage"),
    "test_dataloader": ([], "tests.test_lightning_api_walk::test_from_datasets"),
    "train_dataloader": ([], "tests.test_lightning_api_walk::test_from_datasets"),
    "transfer_batch_to_device": (
        ["batch", "device", "dataloader_idx"],
        f"{H}::test_batch_transfer_hooks_module_and_datamodule",
    ),
    "val_dataloader": ([], "tests.test_lightning_api_walk::test_from_datasets"),
}


def _test_exists(ref: str) -> bool:
    module_name, _, func = ref.partition("::")
    module = importlib.import_module(module_name)
    return callable(getattr(module, func, None))


def _params(obj: Any) -> list[str]:
    return [
        p.name
        for p in inspect.signature(obj).parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


@pytest.mark.parametrize(("owner", "table"), [(TrainModule, MODULE_METHODS), (DataModule, DATAMODULE_METHODS)])
def test_each_lightning_method_exists_with_lightnings_parameters_and_a_test(owner: type, table: dict[str, Any]) -> None:
    problems = []
    for name, (params, ref) in table.items():
        if not _test_exists(ref):
            problems.append(f"{name}: no test {ref}")
        fn = getattr(owner, name, None)
        if fn is None:
            problems.append(f"{name}: missing on {owner.__name__}")
            continue
        ours = _params(fn)
        if ours[: len(params)] != params:
            problems.append(f"{name}: parameters {ours}, Lightning's {params}")
    assert problems == []


def test_each_lightning_attribute_exists_and_has_a_test() -> None:
    problems = [name for name in MODULE_ATTRIBUTES if not hasattr(TrainModule, name) and name != "hparams"]
    problems += [ref for ref in MODULE_ATTRIBUTES.values() if not _test_exists(ref)]
    assert problems == []


def test_configure_sharded_model_is_called() -> None:
    from tests.helpers.regression import Regressor, make_loader
    from tests.helpers.trainers import quiet_trainer

    calls: list[str] = []

    class Old(Regressor):
        def configure_sharded_model(self) -> None:
            calls.append("configure_sharded_model")

    quiet_trainer(max_epochs=1).fit(Old(), make_loader(10, 4))
    assert calls == ["configure_sharded_model"]


def test_log_dict_takes_lightnings_options() -> None:
    from tests.helpers.regression import Regressor, make_loader
    from tests.helpers.trainers import quiet_trainer

    class Dict(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log_dict({"a": loss, "b": loss * 2}, prog_bar=True, logger=False, on_step=False, on_epoch=True)
            return loss

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Dict(), make_loader(10, 4))
    assert {"a", "b"} <= set(trainer.progress_bar_metrics) and not {"a", "b"} & set(trainer.logged_metrics)


def test_remove_ignored_hparams() -> None:
    m = TrainModule()
    m.save_hyperparameters({"a": 1, "b": 2})
    m.remove_ignored_hparams(["a"])
    assert dict(m.hparams) == {"b": 2}


def test_checkpoint_hyper_params_key(tmp_path: Any) -> None:
    """``checkpoint[TrainModule.CHECKPOINT_HYPER_PARAMS_KEY]`` reads the hyperparameters in on_load_checkpoint."""
    from tests.helpers.regression import Regressor, make_loader
    from tests.helpers.trainers import quiet_trainer

    seen: list[Any] = []

    class Reader(Regressor):
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters()

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            seen.append(checkpoint[self.CHECKPOINT_HYPER_PARAMS_KEY])

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Reader(), make_loader(10, 4))
    trainer.save_checkpoint(tmp_path / "r.ckpt")
    Reader.load_from_checkpoint(tmp_path / "r.ckpt")
    assert seen == [{"width": 3}]
    assert isinstance(TrainModule.CHECKPOINT_HYPER_PARAMS_NAME, str)
    assert isinstance(TrainModule.CHECKPOINT_HYPER_PARAMS_TYPE, str)


def test_from_datasets() -> None:
    import torch
    from torch.utils.data import TensorDataset

    ds = TensorDataset(torch.arange(6.0))
    dm = DataModule.from_datasets(ds, val_dataset=[ds, ds], test_dataset=ds, predict_dataset=ds, batch_size=4)
    assert len(dm.train_dataloader()) == 2  # type: ignore[arg-type]
    assert [len(dl) for dl in dm.val_dataloader()] == [2, 2]  # type: ignore[attr-defined]
    assert next(iter(dm.test_dataloader()))[0].tolist() == [0.0, 1.0, 2.0, 3.0]  # type: ignore[call-overload]
    assert len(dm.predict_dataloader()) == 2  # type: ignore[arg-type]
