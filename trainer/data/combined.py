"""Lightning's ``CombinedLoader``: a collection of iterables (lists, tuples, dicts, nested) iterated as one.

The collection is flattened into a list of iterables (:attr:`CombinedLoader.flattened`) and each
batch is put back into the collection's shape. Lightning's rule for what is one iterable: anything
that is not a list, tuple or dict, and a container whose items are all numbers or strings
(``[1, 2, 3]`` is one iterable of three items, not three).

Modes (Lightning's): ``"min_size"`` ends with the shortest iterable, ``"max_size_cycle"`` with the
longest (shorter ones start over), ``"max_size"`` with the longest (``None`` for those that ran
out), ``"sequential"`` runs them one after another. Iterating yields ``(batch, batch_idx,
dataloader_idx)``; ``iter()`` starts the iterables' iterators (their worker processes) at once, all
of them, or in ``"sequential"`` mode the first only, and ``len()`` is known only after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data.dataloader import _BaseDataLoaderIter

__all__ = ["MODES", "CombinedLoader", "Spec", "tree_flatten", "tree_unflatten"]

#: Lightning's modes and how each counts a length from the iterables' lengths.
MODES = {"min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum}


@dataclass
class Spec:
    """The shape of a flattened collection: a leaf, or a container's type, keys and children's shapes."""

    kind: str = "leaf"  # "leaf", "seq" (list, tuple, named tuple) or "map" (dict)
    type: type = object
    keys: list[Any] = field(default_factory=list)
    children: list[Spec] = field(default_factory=list)


def _is_leaf(obj: Any) -> bool:
    """Not a list, tuple or dict, or one whose items are all numbers or strings (Lightning's rule)."""
    if isinstance(obj, dict):
        items: Iterable[Any] = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    else:
        return True
    return all(isinstance(item, (int, float, str)) for item in items)


def tree_flatten(obj: Any) -> tuple[list[Any], Spec]:
    """The leaves of ``obj`` in order (a dict's in its order) and its shape, for :func:`tree_unflatten`.

    >>> tree_flatten({"a": ["x", ["y"]], "b": "z"})[0]
    ['x', ['y'], 'z']
    """
    if _is_leaf(obj):
        return [obj], Spec()
    if isinstance(obj, dict):
        keys, children = list(obj), list(obj.values())
        spec = Spec("map", type(obj), keys)
    else:
        keys, children = [], list(obj)
        spec = Spec("seq", type(obj))
    leaves: list[Any] = []
    for child in children:
        flat, child_spec = tree_flatten(child)
        leaves += flat
        spec.children.append(child_spec)
    return leaves, spec


def tree_unflatten(leaves: list[Any], spec: Spec) -> Any:
    """``leaves`` put back into the shape :func:`tree_flatten` described.

    >>> leaves, spec = tree_flatten([["a"], ("b", ["c"])])  # a list of strings only is one leaf
    >>> leaves, tree_unflatten([1, 2, 3], spec)
    ([['a'], 'b', ['c']], [1, (2, 3)])
    """
    it = iter(leaves)
    out = _build(it, spec)
    if next(it, _END) is not _END:
        raise ValueError(f"tree_unflatten: more leaves ({len(leaves)}) than the shape holds")
    return out


_END = object()


def _build(leaves: Iterator[Any], spec: Spec) -> Any:
    if spec.kind == "leaf":
        value = next(leaves, _END)
        if value is _END:
            raise ValueError("tree_unflatten: fewer leaves than the shape holds")
        return value
    children = [_build(leaves, child) for child in spec.children]
    if spec.kind == "map":
        pairs = zip(spec.keys, children)
        try:
            return spec.type(pairs)  # dict, OrderedDict
        except TypeError:  # a dict type built otherwise (defaultdict): a plain dict
            return dict(zip(spec.keys, children))
    if spec.type in (list, tuple):
        return spec.type(children)
    if hasattr(spec.type, "_fields"):  # a named tuple
        return spec.type(*children)
    return spec.type(children)


def _length(iterable: Any) -> float:
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return float("inf")


class _Iterator:
    """One pass of a :class:`CombinedLoader` in one mode: ``(flat batch or batch, batch_idx, dataloader_idx)``."""

    def __init__(self, iterables: list[Any], mode: str, limits: list[float] | None) -> None:
        self.iterables, self.mode, self.limits = iterables, mode, limits
        self.idx, self.loader_idx = 0, 0
        if mode == "sequential":  # one iterable at a time: one set of worker processes
            self.iterators: list[Iterator[Any] | None] = [iter(iterables[0])] if iterables else []
        else:
            self.iterators = [iter(iterable) for iterable in iterables]
        self.done = [False] * len(iterables)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable mid-pass (a module holding the loader is pickled for ``ddp_spawn``): a DataLoader's
        iterator cannot be pickled, so it is left out, as Lightning leaves it out."""
        state = self.__dict__.copy()
        state["iterators"] = [None if isinstance(it, _BaseDataLoaderIter) else it for it in self.iterators]
        return state

    def __len__(self) -> int:
        lengths = [_length(iterable) for iterable in self.iterables]
        if self.limits is not None:
            if self.mode == "min_size":
                return int(min(lengths + self.limits))
            lengths = [min(length, limit) for length, limit in zip(lengths, self.limits)]
        count: Callable[[list[float]], float] = MODES[self.mode]  # type: ignore[assignment]
        return int(count(lengths))

    def __next__(self) -> tuple[Any, int, int]:
        if self.mode == "sequential":
            return self._next_sequential()
        n = len(self.iterators)
        out: list[Any] = [None] * n
        for i in range(n):
            try:
                if self.iterators[i] is None:
                    continue
                out[i] = next(self.iterators[i])  # type: ignore[arg-type]
            except StopIteration:
                self.done[i] = True
                if self.mode == "min_size" or all(self.done):
                    raise
                if self.mode == "max_size":
                    self.iterators[i] = None
                    continue
                self.iterators[i] = iter(self.iterables[i])  # max_size_cycle: start the shorter one over
                out[i] = next(self.iterators[i])  # type: ignore[arg-type]
        if self.mode == "max_size" and all(self.done):
            raise StopIteration
        index, self.idx = self.idx, self.idx + 1
        return out, index, 0

    def _next_sequential(self) -> tuple[Any, int, int]:
        while self.loader_idx < len(self.iterables):
            limit = self.limits[self.loader_idx] if self.limits is not None else float("inf")
            if self.idx < limit:
                with contextlib.suppress(StopIteration):
                    batch = next(self.iterators[0])  # type: ignore[arg-type]
                    index, self.idx = self.idx, self.idx + 1
                    return batch, index, self.loader_idx
            self.loader_idx, self.idx = self.loader_idx + 1, 0
            self.iterators = [iter(self.iterables[self.loader_idx])] if self.loader_idx < len(self.iterables) else []
        raise StopIteration


class CombinedLoader:
    """Lightning's ``CombinedLoader``: several iterables (any nesting of lists, tuples and dicts) as one.

    Give it to ``trainer.fit`` to choose how training combines loaders (``"max_size_cycle"``,
    ``"min_size"``, ``"max_size"``); give it in ``"sequential"`` mode to ``validate``/``test``/
    ``predict`` (or as validation loaders), which run the loaders one after another with their
    ``dataloader_idx``. Iterating it yields Lightning's ``(batch, batch_idx, dataloader_idx)``.

    >>> combined = CombinedLoader({"a": [1, 2], "b": [10]}, "max_size_cycle")
    >>> list(combined), len(combined)
    ([({'a': 1, 'b': 10}, 0, 0), ({'a': 2, 'b': 10}, 1, 0)], 2)
    >>> list(CombinedLoader([[1, 2], [10]], "sequential"))
    [(1, 0, 0), (2, 1, 0), (10, 0, 1)]
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = tree_flatten(iterables)
        self._mode = mode
        self._pass: _Iterator | None = None
        self._limits: list[float] | None = None

    @property
    def mode(self) -> str:
        """The mode given."""
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables, as given (or as :attr:`flattened` last set it)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables, flat and in order."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(
                f"Mismatch in flattened length ({len(flattened)}) and existing length ({len(self._flattened)})"
            )
        self._iterables = tree_unflatten(flattened, self._spec)
        self._flattened = flattened

    @property
    def sampler(self) -> Any:
        """The iterables' samplers, in the collection's shape (None for an iterable without one)."""
        return tree_unflatten([getattr(it, "sampler", None) for it in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        """The iterables' batch samplers, in the collection's shape (None for an iterable without one)."""
        return tree_unflatten([getattr(it, "batch_sampler", None) for it in self._flattened], self._spec)

    @property
    def limits(self) -> list[float] | None:
        """How many batches of each iterable are used (None: all)."""
        return self._limits

    @limits.setter
    def limits(self, limits: float | list[float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(
                f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(self._flattened)})"
            )
        self._limits = limits

    def __iter__(self) -> CombinedLoader:
        self._pass = _Iterator(self._flattened, self._mode, self._limits)
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._pass is None:
            iter(self)
        assert self._pass is not None
        out, batch_idx, dataloader_idx = next(self._pass)
        if self._mode == "sequential":
            return out, batch_idx, dataloader_idx
        return tree_unflatten(out, self._spec), batch_idx, dataloader_idx

    def __len__(self) -> int:
        if self._pass is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        return len(self._pass)

    def reset(self) -> None:
        """Forget the pass in progress (its iterators, and the worker processes they hold)."""
        self._pass = None
        for iterable in self._flattened:
            if hasattr(iterable, "_iterator"):  # a DataLoader keeps persistent workers' iterator here
                iterable._iterator = None
