"""The character LM under tensor and 2-D parallelism (``strategy=model_parallel``).

:class:`CharLMTP` is :class:`~examples.charlm.CharLM` with a ``configure_model`` that applies a
tensor-parallel plan over ``self.device_mesh["tensor_parallel"]`` and ``fully_shard`` over
``self.device_mesh["data_parallel"]``, as torchtitan does. The weights, their names and the
checkpoints are the plain model's, so a run under any mesh resumes under any other strategy.

    geartrain experiment=charlm_tp    # four processes, a 2x2 mesh
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .charlm import GPT, CharLM, decode, encode

__all__ = ["CharLMTP", "parallelize_gpt"]


def parallelize_gpt(gpt: GPT, mesh: Any, mp_policy: Any = None) -> GPT:
    """Shard ``gpt`` over a ``("data_parallel", "tensor_parallel")`` mesh in place; return it.

    Tensor parallel, per block: the MLP's first Linear is split by output columns
    (``ColwiseParallel``) and its second by input rows (``RowwiseParallel``), so the hidden activation
    stays split and one all-reduce joins the MLP's output; the attention's output projection is split
    by rows as well (each rank multiplies its slice of the heads' output). The fused ``qkv``
    projection stays replicated: split by columns, a rank would hold part of q and part of k. A model
    with separate q/k/v projections splits them with ``ColwiseParallel`` too.

    Data parallel: each block, then the rest at the root, is ``fully_shard``-ed over the data-parallel
    ranks (with ``mp_policy``, a ``MixedPrecisionPolicy``, when given).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if tp.size() > 1:
        plan = {
            "proj": RowwiseParallel(input_layouts=Replicate()),
            "mlp.0": ColwiseParallel(),
            "mlp.2": RowwiseParallel(),
        }
        for block in gpt.blocks:
            parallelize_module(block, tp, plan)
    if dp.size() > 1:
        policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
        blocks: list[nn.Module] = list(gpt.blocks)
        for block in blocks:
            fully_shard(block, mesh=dp, mp_policy=policy)
        fully_shard(gpt, mesh=dp, mp_policy=policy)
    return gpt


class CharLMTP(CharLM):
    """:class:`~examples.charlm.CharLM` parallelised in ``configure_model`` (same arguments)."""

    def configure_model(self) -> None:
        """Apply :func:`parallelize_gpt` when a model-parallel strategy gave a mesh; else train as is."""
        if self.device_mesh is not None:
            parallelize_gpt(self.model, self.device_mesh)

    def on_fit_end(self) -> None:
        """Generate the sample on every rank (a sharded forward is a collective), print it on rank 0.

        The ranks compute the same logits and draw with the same seeded generator, so they append the
        same characters and stay in step.
        """
        if self.sample_chars <= 0:
            return
        was_training = self.training
        self.eval()
        start = encode(self.prompt).unsqueeze(0).to(self.device)
        self.sample = decode(self.model.generate(start, self.sample_chars)[0])
        self.train(was_training)
        if self.trainer.is_global_zero:
            print(f"--- sample after {self.global_step} steps ---\n{self.sample}\n---")
