"""Records the final weights of tests/ports/numbers_ports.py and pl_programs.py under Lightning (tests/test_lightning_ports.py).

Run from the repository root in a virtual environment with pytorch-lightning 2.6.6 and torch (CPU),
and without geartrain on the path:

    /path/to/lightning-venv/bin/python tests/data/lightning/record_ports.py [numbers_ports] [pl_programs]

It swaps each port's import block for Lightning's (the only lines a port changes), runs every program
and writes ``tests/data/lightning/ports_numbers.pt`` and ``ports_programs.pt``: ``{program: state_dict}``.
Not part of geartrain.
"""

import runpy
import sys
import types
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[2] / "helpers" / "numerics.py"))["pin"]()  # before torch

import pytorch_lightning
import torch

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
START, END = "# --- imports: the only lines that differ from the Lightning program ---", "# --- end of imports ---"
#: port file -> (Lightning's import block, where its weights go)
PORTS = {
    "numbers_ports": (
        """
from pytorch_lightning import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from pytorch_lightning.callbacks import EarlyStopping
""",
        HERE / "ports_numbers.pt",
    ),
    "pl_programs": (
        """
import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info
""",
        HERE / "ports_programs.pt",
    ),
}


def record(name: str, imports: str, out: Path) -> None:
    port = ROOT / "tests" / "ports" / f"{name}.py"
    head, rest = port.read_text().split(START)
    _, tail = rest.split(END)
    module = types.ModuleType(name)
    module.__file__ = str(port)
    sys.modules[name] = module
    exec(compile(head + imports + tail, str(port), "exec"), module.__dict__)
    recorded = {}
    for program_name, program in module.PROGRAMS.items():
        recorded[program_name] = {key: value.detach().clone() for key, value in program().items()}
        print(program_name, "recorded")
    torch.save(recorded, out)
    print(f"pytorch-lightning {pytorch_lightning.__version__}, torch {torch.__version__}: wrote {out}")


def main() -> None:
    torch.set_num_threads(1)
    for name, (imports, out) in PORTS.items():
        if len(sys.argv) < 2 or name in sys.argv[1:]:
            record(name, imports, out)


if __name__ == "__main__":
    main()
