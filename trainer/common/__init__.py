"""The leaf every room of geartrain may import: tensor trees, RNG state, state-dict keys, loaders.

Nothing here imports another geartrain module (only the standard library and torch; numpy and
omegaconf where a function needs them, imported inside it). Strategies and callbacks depend on this
package, not on the trainer, so the direction of imports stays one way: trainer -> strategies,
callbacks -> this leaf. Import the submodules (``trainer.common.tree``, ...); this file exports nothing.
"""
