"""Per-rank jobs of the FSDP2 and model-parallel tests (importable by spawned ranks), and their references."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from examples.charlm import VOCAB, encode
from examples.charlm_tp import CharLMTP
from tests.helpers.jobs import dataset
from tests.helpers.trainers import quiet_trainer

STEPS = 6
LR = 0.1
PER_RANK = 4  # two ranks: a global batch of 8


def full(t: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value on the CPU (a collective for DTensors: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: full(p) for name, p in module.named_parameters()}


class MetaNet(nn.Module):
    """Two hidden Linear blocks in a ``ModuleList`` (sharded one by one) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 16)])
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def _train_module_class() -> type:
    from trainer import TrainModule

    class Built(TrainModule):
        """Builds :class:`MetaNet` in ``configure_model`` (on the meta device if ``meta``); records dtypes."""

        def __init__(self, meta: bool = False) -> None:
            super().__init__()
            self.meta = meta
            self.net: nn.Module | None = None
            self.mesh_size = 0
            self.compute_dtypes: set[str] = set()
            self.grad_dtypes: set[str] = set()

        def configure_model(self) -> None:
            self.mesh_size = self.device_mesh.size() if self.device_mesh is not None else 0
            torch.manual_seed(0)  # the same draws for a normal and a meta build (see strategies/materialize.py)
            if self.meta:
                with torch.device("meta"):
                    self.net = MetaNet()
            else:
                self.net = MetaNet()
            for m in self.net.modules():
                if isinstance(m, nn.Linear):
                    m.register_forward_pre_hook(self._record)

        def _record(self, module: nn.Module, args: Any) -> None:
            self.compute_dtypes.add(str(module.weight.dtype))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            assert self.net is not None
            return F.cross_entropy(self.net(x), y)

        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            self.grad_dtypes |= {str(p.grad.dtype) for p in self.parameters() if p.grad is not None}

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=LR)

    return Built


def fsdp_train(root: str, meta: bool = False, **kwargs: Any) -> tuple[Any, Any]:
    """``STEPS`` steps of the built net under FSDP on the ranks this runs in (no shuffling)."""
    module = _train_module_class()(meta=meta)
    trainer = quiet_trainer(root, strategy=kwargs.pop("strategy", "fsdp"), max_steps=STEPS, **kwargs)
    trainer.fit(module, DataLoader(dataset(64), batch_size=PER_RANK, shuffle=False))
    return module, trainer


def fsdp_job(root: str) -> dict[str, Any]:
    """Every FSDP2 scenario the tests check, in one pair of processes."""
    from torch.distributed.tensor import DTensor

    from strategies import FSDPStrategy

    out: dict[str, Any] = {}
    module, _ = fsdp_train(f"{root}/bf16", precision="bf16-mixed")
    out["bf16"] = full_weights(module)
    out["bf16_compute"] = sorted(module.compute_dtypes)
    out["bf16_grads"] = sorted(module.grad_dtypes)
    out["bf16_master"] = sorted(
        {str(p.dtype) for p in module.parameters()} | {str(p.to_local().dtype) for p in module.parameters()}
    )
    out["bf16_dtensor"] = all(isinstance(p, DTensor) for p in module.parameters())
    module, _ = fsdp_train(f"{root}/bf16_ac", precision="bf16-mixed", activation_checkpointing=[nn.Linear])
    out["bf16_ac"] = full_weights(module)
    module, _ = fsdp_train(
        f"{root}/bf16_compile", precision="bf16-mixed", compile=True, compile_kwargs={"backend": "aot_eager"}
    )
    out["bf16_compile"] = full_weights(module)
    module, _ = fsdp_train(f"{root}/fp32")
    out["fp32"] = full_weights(module)
    out["mesh_size"] = module.mesh_size
    module, _ = fsdp_train(f"{root}/meta", meta=True)
    out["meta"] = full_weights(module)
    out["meta_local_numel"] = sum(p.to_local().numel() for p in module.parameters())
    module, _ = fsdp_train(f"{root}/offload", strategy=FSDPStrategy(cpu_offload=True))
    out["offload"] = full_weights(module)
    # Lightning's FSDP1 arguments for the bf16 run above: the same policy, offload and recomputation.
    from torch.distributed.fsdp import CPUOffload, MixedPrecision

    lightning = FSDPStrategy(
        sharding_strategy="SHARD_GRAD_OP",
        cpu_offload=CPUOffload(offload_params=True),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        activation_checkpointing_policy={nn.Linear},
    )
    module, _ = fsdp_train(f"{root}/lightning", strategy=lightning)
    out["lightning"] = full_weights(module)
    out["lightning_compute"] = sorted(module.compute_dtypes)
    out["lightning_checkpointed"] = sum(bool(getattr(m, "_geartrain_checkpointed", False)) for m in module.modules())
    return out


def bf16_reference(world: int = 2) -> dict[str, torch.Tensor]:
    """A hand-written loop of what FSDP2's bf16 policy does on ``world`` ranks, in one process.

    Per step and rank: the float32 master weights cast to bfloat16, that rank's half batch through the
    bfloat16 network, gradients cast to float32 and averaged over the ranks, an SGD step in float32.
    """
    torch.manual_seed(0)
    master = MetaNet()
    low = MetaNet().to(torch.bfloat16)
    data = dataset(64)
    x_all, y_all = data.tensors
    batch = PER_RANK * world
    for step in range(STEPS):
        grads = [torch.zeros_like(p) for p in master.parameters()]
        for rank in range(world):
            idx = torch.arange(step * batch + rank, (step + 1) * batch, world)
            with torch.no_grad():
                for lp, mp in zip(low.parameters(), master.parameters(), strict=True):
                    lp.copy_(mp.to(torch.bfloat16))
            low.zero_grad(set_to_none=True)
            F.cross_entropy(low(x_all[idx].to(torch.bfloat16)), y_all[idx]).backward()
            for g, lp in zip(grads, low.parameters(), strict=True):
                assert lp.grad is not None
                g += lp.grad.float()
        with torch.no_grad():
            for p, g in zip(master.parameters(), grads, strict=True):
                p.sub_(LR * (g / world))
    return {f"net.{name}": p.detach().clone() for name, p in master.named_parameters()}


# ----------------------------------------------------------------- model parallel (charlm)
TP_STEPS = 4
TP_GLOBAL_BATCH = 8
TP_SHAPE = {"n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": 16, "sample_chars": 0, "warmup_steps": 2}


def char_windows(n: int = 64, block: int = 16) -> TensorDataset:
    """``n`` (input, next-character target) windows from the start of the bundled novel."""
    from examples.charlm import DEFAULT_PATH

    ids = encode(DEFAULT_PATH.read_text()[: n * block + 1])
    assert int(ids.max()) < len(VOCAB)
    x = torch.stack([ids[i * block : (i + 1) * block] for i in range(n)])
    y = torch.stack([ids[i * block + 1 : (i + 1) * block + 1] for i in range(n)])
    return TensorDataset(x, y)


def charlm_train(
    root: str, strategy: Any, per_rank_batch: int, epochs: int = 1, ckpt_path: str | None = None
) -> tuple[Any, Any]:
    """The tiny charlm: ``epochs`` of ``TP_STEPS`` AdamW steps with clipping, no shuffling, checkpoints on.

    Bounded by epochs, not ``max_steps``, so the learning-rate schedule (which reads ``max_steps``) is
    the same for a run and its resumption.
    """
    torch.manual_seed(0)
    module = CharLMTP(**TP_SHAPE)  # type: ignore[arg-type]
    trainer = quiet_trainer(
        root, strategy=strategy, max_epochs=epochs, gradient_clip_val=0.5, enable_checkpointing=True
    )
    windows = char_windows(TP_STEPS * TP_GLOBAL_BATCH)
    trainer.fit(module, DataLoader(windows, batch_size=per_rank_batch, shuffle=False), ckpt_path=ckpt_path)
    return module, trainer


def model_parallel_job(root: str, dp: int, tp: int, resume_from: str | None = None) -> dict[str, Any]:
    """The charlm under ``ModelParallelStrategy`` on a ``dp`` x ``tp`` mesh: weights, mesh, checkpoint.

    With ``resume_from`` (a checkpoint written on another mesh), also resume it for a second epoch.
    """
    from torch.distributed.tensor import DTensor

    from strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
    module, trainer = charlm_train(f"{root}/mp", strategy, TP_GLOBAL_BATCH // dp)
    mesh = module.device_mesh
    out = {
        "weights": full_weights(module),
        "mesh": (tuple(mesh.mesh_dim_names), tuple(mesh.shape)),
        "sampler": trainer.strategy.distributed_sampler_kwargs,
        "tp_sharded": isinstance(module.model.blocks[0].mlp[0].weight, DTensor),
        "ckpt": str(Path(trainer.checkpoint_callback.last_model_path)),
        "steps": trainer.global_step,
    }
    if resume_from is not None:
        strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
        module, trainer = charlm_train(
            f"{root}/resumed", strategy, TP_GLOBAL_BATCH // dp, epochs=2, ckpt_path=resume_from
        )
        out["resumed"] = full_weights(module)
        out["resumed_steps"] = trainer.global_step
    return out


def _tp_module_class() -> type:
    from trainer import TrainModule

    class TensorParallelNet(TrainModule):
        """:class:`MetaNet` built in ``configure_model`` (on meta if ``meta``), Colwise/Rowwise plus FSDP."""

        def __init__(self, meta: bool) -> None:
            super().__init__()
            self.meta = meta
            self.net: nn.Module | None = None

        def configure_model(self) -> None:
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            torch.manual_seed(0)
            if self.meta:
                with torch.device("meta"):
                    self.net = MetaNet()
            else:
                self.net = MetaNet()
            tp, dp = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
            parallelize_module(self.net.blocks, tp, {"0": ColwiseParallel(), "1": RowwiseParallel()})
            for block in self.net.blocks:
                fully_shard(block, mesh=dp)
            fully_shard(self.net, mesh=dp)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            assert self.net is not None
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=LR)

    return TensorParallelNet


def meta_2d_job(root: str, dp: int, tp: int) -> dict[bool, dict[str, torch.Tensor]]:
    """The same 2-D parallel net built normally and on the meta device; trained weights of both."""
    from strategies import ModelParallelStrategy

    out = {}
    for meta in (False, True):
        module = _tp_module_class()(meta)
        trainer = quiet_trainer(f"{root}/{meta}", strategy=ModelParallelStrategy(dp, tp), max_steps=3)
        trainer.fit(module, DataLoader(dataset(64), batch_size=8 // dp, shuffle=False))
        out[meta] = full_weights(module)
    return out
