"""What :mod:`trainer.lightning.cli` saves as a model's hyperparameters, and reads back from a checkpoint.

With ``load_from_checkpoint_support`` (Lightning's default) the CLI builds the model and data module
through :class:`SavesConfig`, so their hyperparameters are the config it parsed, and
``load_from_checkpoint`` rebuilds them from it; ``--ckpt_path FILE`` reads them back as the model's
defaults (:func:`checkpoint_model_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainer.hparams import given_hyperparameters

__all__ = ["SavesConfig", "checkpoint_model_config"]


def checkpoint_model_config(path: str | Path) -> dict[str, Any]:
    """The model's config saved in a checkpoint file: its hyperparameters, as a class path when it was one.

    Hyperparameters the checkpoint keeps only as a description (``hparams_unsaved``: objects that
    ``weights_only`` loading does not rebuild) are left out, so the config's values stand for them.
    """
    from trainer.checkpoint.reader import read_checkpoint

    state = read_checkpoint(path)  # weights_only, Lightning's AttributeDict read as a dict
    hparams = dict(state.get("hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    for name in state.get("hparams_unsaved", []):
        hparams.pop(name, None)
    if "_class_path" in hparams:
        return {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
    return hparams


class SavesConfig:
    """jsonargparse instantiator: builds the model (or data module) inside :func:`given_hyperparameters`.

    Its ``save_hyperparameters()`` then records the config the CLI parsed for it (a class path as
    ``_class_path``, values linked in from other groups included) and the name of the function that
    rebuilds it from that config, so ``load_from_checkpoint`` works for modules whose arguments are
    objects built from class paths. The name is Lightning's, so the hyperparameters are the ones
    Lightning saves, and either reads the other's checkpoint.
    """

    def __init__(self, cli: Any, key: str) -> None:
        self.cli, self.key = cli, key

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict[str, Any], **kwargs: Any) -> Any:
        config = yaml.safe_load(
            self.cli.parser.dump(self.cli.config, skip_link_targets=False, skip_none=False, format="yaml")
        )
        if "subcommand" in self.cli.config:
            config = config[self.cli.config.subcommand]
        hparams = config.get(self.key, {})
        if "class_path" in hparams:
            hparams = {
                "_class_path": hparams["class_path"],
                **hparams.get("init_args", {}),
                **hparams.get("dict_kwargs", {}),
            }
        prefix = f"{self.key}."
        for link, value in applied_instantiation_links.items():
            if link.startswith(prefix):
                _set_nested(hparams, link[len(prefix) :].removeprefix("init_args."), value)
        with given_hyperparameters(hparams, "lightning.pytorch.cli.instantiate_module"):
            return class_type(*args, **kwargs)


def _set_nested(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    data[last] = value
