"""Records the final weights of tests/ports/numbers_ports.py under Lightning (tests/test_lightning_ports.py).

Run from the repository root in a virtual environment with pytorch-lightning 2.6.6 and torch (CPU),
and without geartrain on the path:

    /path/to/lightning-venv/bin/python tests/data/lightning/record_ports.py

It swaps the port's import block for Lightning's (the only lines a port changes), runs every program
and writes ``tests/data/lightning/ports_numbers.pt``: ``{program: state_dict}``. Not part of geartrain.
"""

import sys
import types
from pathlib import Path

import pytorch_lightning
import torch

ROOT = Path(__file__).resolve().parents[3]
PORT = ROOT / "tests" / "ports" / "numbers_ports.py"
OUT = Path(__file__).resolve().parent / "ports_numbers.pt"
START, END = "# --- imports: the only lines that differ from the Lightning program ---", "# --- end of imports ---"
LIGHTNING_IMPORTS = """
from pytorch_lightning import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from pytorch_lightning.callbacks import EarlyStopping
"""


def main() -> None:
    source = PORT.read_text()
    head, rest = source.split(START)
    _, tail = rest.split(END)
    module = types.ModuleType("numbers_ports")
    module.__file__ = str(PORT)
    sys.modules["numbers_ports"] = module
    exec(compile(head + LIGHTNING_IMPORTS + tail, str(PORT), "exec"), module.__dict__)
    torch.set_num_threads(1)
    recorded = {}
    for name, program in module.PROGRAMS.items():
        recorded[name] = {key: value.detach().clone() for key, value in program().items()}
        print(name, "recorded")
    torch.save(recorded, OUT)
    print(f"pytorch-lightning {pytorch_lightning.__version__}, torch {torch.__version__}: wrote {OUT}")


if __name__ == "__main__":
    main()
