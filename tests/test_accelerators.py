"""Lightning's accelerator objects, ``StrategyRegistry`` and strategy arguments (``strategies/accelerators.py``,
``strategies/lightning_names.py``, ``strategies/registry.py``): each maps onto how geartrain already
chooses devices and builds strategies, so the same run gives the same weights either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import callbacks as cbs
import trainer.lightning as pl
from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    XLAAccelerator,
    find_usable_cuda_devices,
)
from strategies.precision import MixedPrecision, Precision
from strategies.registry import StrategyRegistry
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, seed_everything
from trainer.common.errors import MisconfigurationException


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without CUDA or MPS, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def _fit_weights(**trainer_args: object) -> dict[str, torch.Tensor]:
    seed_everything(3)
    model = TinyMLP(log_loss=False)
    quiet_trainer(max_epochs=1, **trainer_args).fit(model, make_batches(3))
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def test_an_accelerator_object_trains_as_its_name_and_is_trainer_accelerator() -> None:
    by_name = _fit_weights(accelerator="cpu", strategy="auto")
    accelerator = CPUAccelerator()
    by_object = _fit_weights(accelerator=accelerator, strategy="auto")
    assert by_name.keys() == by_object.keys()
    assert all(torch.equal(by_name[key], by_object[key]) for key in by_name)
    trainer = quiet_trainer(accelerator=accelerator, strategy="auto")
    assert trainer.accelerator is accelerator and trainer.strategy.accelerator is accelerator
    assert trainer.strategy.root_device == torch.device("cpu")
    # Without one given, trainer.accelerator is the object for the device in use.
    default = quiet_trainer(strategy=SingleDeviceStrategy(device="cpu"))
    assert isinstance(default.accelerator, CPUAccelerator)


def test_lightning_paths_map_onto_the_same_objects() -> None:
    assert pl.accelerators.CPUAccelerator is CPUAccelerator and pl.accelerators.Accelerator is Accelerator
    assert pl.accelerators.cuda.find_usable_cuda_devices is find_usable_cuda_devices
    assert pl.accelerators.AcceleratorRegistry is AcceleratorRegistry
    assert pl.strategies.StrategyRegistry is StrategyRegistry
    assert pl.accelerators.xla.XLAAccelerator is XLAAccelerator


def test_a_tpu_is_never_available_and_refused_when_given(no_gpu: None) -> None:
    assert not XLAAccelerator.is_available() and XLAAccelerator.auto_device_count() == 0
    assert AcceleratorRegistry["tpu"]["accelerator"] is XLAAccelerator
    with pytest.raises(
        MisconfigurationException, match=r"accelerator=XLAAccelerator: .*TPU/XLA and HPU are not offered"
    ):
        Trainer(accelerator=XLAAccelerator())


def test_accelerator_classmethods_answer_for_this_machine(no_gpu: None) -> None:
    assert CPUAccelerator.is_available() and CPUAccelerator.auto_device_count() == 1
    assert CPUAccelerator.parse_devices("3") == 3
    assert CPUAccelerator.get_parallel_devices(2) == [torch.device("cpu")] * 2
    with pytest.raises(TypeError, match="should be an int > 0"):
        CPUAccelerator.parse_devices([0, 1])
    assert not CUDAAccelerator.is_available() and CUDAAccelerator.auto_device_count() == 0
    assert CUDAAccelerator.parse_devices(0) is None
    with pytest.raises(MisconfigurationException, match=r"only has: \[\]"):
        CUDAAccelerator.parse_devices(2)
    assert CUDAAccelerator.get_parallel_devices([0, 1]) == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert not MPSAccelerator.is_available()
    assert find_usable_cuda_devices(0) == []
    with pytest.raises(ValueError, match="only has 0 GPUs"):
        find_usable_cuda_devices(1)
    CPUAccelerator().setup_device(torch.device("cpu"))
    with pytest.raises(MisconfigurationException, match="Device should be CPU"):
        CPUAccelerator().setup_device(torch.device("meta"))


def test_gpu_kinds_this_machine_lacks_are_refused_in_lightnings_words(no_gpu: None) -> None:
    with pytest.raises(MisconfigurationException, match="No supported gpu backend found!"):
        Trainer(accelerator="gpu")
    with pytest.raises(MisconfigurationException, match=r"`CUDAAccelerator` can not run on your system.*\['cpu'\]"):
        Trainer(accelerator=CUDAAccelerator())
    with pytest.raises(MisconfigurationException, match="`MPSAccelerator` can not run on your system"):
        Trainer(accelerator="mps")
    with pytest.raises(ValueError, match="You selected an invalid accelerator name: `accelerator='nope'`"):
        Trainer(accelerator="nope")


def test_the_accelerator_registry_builds_by_name_and_takes_subclasses() -> None:
    assert {"cpu", "cuda", "mps", "tpu"} <= AcceleratorRegistry.available_accelerators()
    assert isinstance(AcceleratorRegistry.get("cpu"), CPUAccelerator)

    class CountingCPU(CPUAccelerator):
        pass

    AcceleratorRegistry.register("counting_cpu", CountingCPU, description="test")
    try:
        with pytest.raises(MisconfigurationException, match="already present"):
            AcceleratorRegistry.register("counting_cpu", CountingCPU)
        assert isinstance(AcceleratorRegistry.get("counting_cpu"), CountingCPU)
        trainer = quiet_trainer(accelerator=AcceleratorRegistry.get("counting_cpu"), strategy="auto")
        assert isinstance(trainer.accelerator, CountingCPU) and trainer.strategy.root_device.type == "cpu"
    finally:
        AcceleratorRegistry.remove("counting_cpu")

    class Elsewhere(Accelerator):
        @staticmethod
        def is_available() -> bool:
            return True

    with pytest.raises(MisconfigurationException, match=r"accelerator=Elsewhere: .*subclass of one"):
        Trainer(accelerator=Elsewhere())


def test_lightnings_strategy_arguments_build_the_same_strategy() -> None:
    precision = MixedPrecision(torch.bfloat16, "cpu")
    single = SingleDeviceStrategy(torch.device("cpu"), accelerator=CPUAccelerator(), precision_plugin=precision)
    assert single.root_device == torch.device("cpu") and single.precision_plugin is precision is single.precision
    assert SingleDeviceStrategy(accelerator=CPUAccelerator()).root_device == torch.device("cpu")
    with pytest.raises(ValueError, match="accelerator given is for 'cpu'"):
        SingleDeviceStrategy(device="meta", accelerator=CPUAccelerator())
    with pytest.raises(ValueError, match="were both given"):
        SingleDeviceStrategy(device="cpu", precision="16-mixed", precision_plugin=Precision())

    lightning = DDPStrategy(accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")] * 3)
    ours = DDPStrategy(device="cpu", devices=3)
    for strategy in (lightning, ours):
        assert (strategy.num_processes, strategy.world_size, strategy.root_device) == (3, 3, torch.device("cpu"))
        assert strategy.parallel_devices == [torch.device("cpu")] * 3
    assert isinstance(lightning.accelerator, CPUAccelerator)
    with pytest.raises(ValueError, match="devices=2 and 3 parallel_devices disagree"):
        DDPStrategy(devices=2, parallel_devices=[torch.device("cpu")] * 3)
    with pytest.raises(TypeError, match=r"ddp_comm_hook.*DistributedDataParallel"):
        DDPStrategy(ddp_comm_hook=lambda *_: None)


def test_ddp_keyword_arguments_reach_torchs_wrapper(clean_distributed_env: None) -> None:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        strategy = DDPStrategy(devices=1, device="cpu", bucket_cap_mb=1)
        strategy.setup(TinyMLP())
        wrapper = strategy.model
        assert isinstance(wrapper, torch.nn.parallel.DistributedDataParallel)
        assert wrapper.bucket_bytes_cap == 1024 * 1024
    finally:
        dist.destroy_process_group()


def test_the_strategy_registry_lists_every_name_and_builds_registered_ones(tmp_path: Path) -> None:
    entry = StrategyRegistry["ddp_spawn_find_unused_parameters_true"]
    assert entry["strategy"] is DDPStrategy
    assert entry["init_params"] == {"start_method": "spawn", "find_unused_parameters": True}
    assert StrategyRegistry["ddp_find_unused_parameters_false"]["init_params"] == {
        "start_method": "popen",
        "find_unused_parameters": False,
    }
    assert {"single", "single_device", "ddp", "ddp_spawn", "fsdp"} <= set(StrategyRegistry.available_strategies())
    assert isinstance(StrategyRegistry.get("single_device"), SingleDeviceStrategy)
    assert "'ddp_fork'" in repr(StrategyRegistry) and "ddp_fork" in str(StrategyRegistry)

    marker = object()
    StrategyRegistry.register("ddp_marked", DDPStrategy, description="test", checkpoint_io=marker, static_graph=True)
    try:
        with pytest.raises(ValueError, match="already present"):
            StrategyRegistry.register("ddp_marked", DDPStrategy)
        built = Trainer(strategy="ddp_marked", accelerator="cpu", devices=2, logger=False).strategy
        assert isinstance(built, DDPStrategy) and built.checkpoint_io is marker
        assert built.ddp_kwargs["static_graph"] is True and built.num_processes == 2
    finally:
        StrategyRegistry.remove("ddp_marked")
    with pytest.raises(ValueError, match="Unknown strategy 'ddp_marked'"):
        Trainer(strategy="ddp_marked")


def test_a_missing_gpu_is_named_before_the_devices_asked_of_it(no_gpu: None) -> None:
    for devices in (1, 3, [1, 2], -1, "-1"):
        with pytest.raises(MisconfigurationException, match="No supported gpu backend found!"):
            Trainer(accelerator="gpu", devices=devices, strategy="ddp")


def test_the_strategy_hears_of_an_exception_after_the_callbacks(tmp_path: Path) -> None:
    heard: list[tuple[str, BaseException]] = []

    class Listening(SingleDeviceStrategy):
        def on_exception(self, exception: BaseException) -> None:
            heard.append(("strategy", exception))

    class Failing(TinyMLP):
        def on_fit_start(self) -> None:
            raise RuntimeError("boom")

    class Recorder(cbs.Callback):
        def on_exception(self, trainer: object, pl_module: object, exception: BaseException) -> None:
            heard.append(("callback", exception))

    trainer = quiet_trainer(tmp_path, callbacks=[Recorder()], strategy=Listening(device="cpu"), max_epochs=1)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(), make_batches(1))
    assert [who for who, _ in heard] == ["callback", "strategy"]
    assert heard[0][1] is heard[1][1]


def test_a_launcher_runs_the_function_where_the_strategy_runs_it() -> None:
    assert SingleDeviceStrategy(device="cpu").launcher is None
    assert DDPStrategy(start_method="fork").launcher.is_interactive_compatible
    assert not DDPStrategy(start_method="spawn").launcher.is_interactive_compatible
    one_process = DDPStrategy(devices=1, device="cpu")
    assert one_process.launcher.launch(lambda a, b=0: a + b, 2, b=3, trainer=None) == 5


def test_no_device_at_all_is_refused_before_the_accelerator_is_checked(no_gpu: None) -> None:
    for accelerator in ("cpu", "cuda", "tpu"):
        for devices in (0, "0", []):
            with pytest.raises(MisconfigurationException, match="value is not a valid input using"):
                Trainer(accelerator=accelerator, devices=devices)


def test_a_subclass_passing_its_arguments_on_keeps_its_bases_devices() -> None:
    class PassingOn(DDPStrategy):
        def __init__(self, **kwargs: object) -> None:
            super().__init__(**kwargs)  # type: ignore[arg-type]

    built = Trainer(accelerator="cpu", strategy=PassingOn(), devices=2, logger=False).strategy
    assert isinstance(built, PassingOn) and built.root_device.type == "cpu" and built.num_processes == 2


def test_a_cluster_environment_given_to_the_constructor_is_the_strategys() -> None:
    from strategies.environments import LightningEnvironment

    environment = LightningEnvironment()
    strategy = DDPStrategy(accelerator=CPUAccelerator(), cluster_environment=environment)
    assert strategy.cluster_environment is environment
    trainer = Trainer(strategy=strategy, devices=2, logger=False)
    assert trainer.strategy.cluster_environment is environment and isinstance(trainer.accelerator, CPUAccelerator)
