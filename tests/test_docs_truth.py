"""What the pages and configs say about the repository is true, where a machine can check it.

Every repository path a page (README.md, docs/) or a config (conf/) names exists; every link between
pages reaches a page and a heading that exist; every option a page lists for a config group is a
file of that group, and the configuration page's table lists them all; every ``group=option`` a page
or config writes names an option that exists; every ``_target_`` of ours a config names is a module
that exists; a logger or callback a page names under ``callbacks.`` is one geartrain exports; a list
of our strategies names all of them; no page names a folder of one machine. Pure file reads: the
whole file takes well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
CONFIGS = sorted((REPO_ROOT / "conf").glob("**/*.yaml"))
#: Our config groups: conf/<group>/ holding yaml files (``hydra/launcher`` included).
GROUPS = {
    p.parent.relative_to(REPO_ROOT / "conf").as_posix(): sorted(q.stem for q in p.parent.glob("*.yaml"))
    for p in CONFIGS
    if p.parent != REPO_ROOT / "conf"
}
#: Options a page may name that are not files of ours: Hydra's own launcher, and "no choice".
NOT_OURS = {"hydra/launcher": {"basic", "submitit_local", "submitit_slurm"}}
TOP = ("tests", "conf", "examples", "bench", "trainer", "strategies", "callbacks", "docs")
#: A repository path as pages write it: ``trainer/loops/step.py``, ``conf/strategy/``. One with a
#: placeholder (``conf/<group>/``, ``tests/test_lightning_*.py``, ``conf/GROUP/...``) is checked up to it.
PATH = re.compile(rf"(?<![\w./~$@-])((?:{'|'.join(TOP)})/(?:[a-z0-9_./-]|README)*)(?P<rest>[*<{{A-Z]?)")
EXTENSIONS = (".py", ".yaml", ".md", ".txt", ".npz", ".png", ".toml", ".json", ".sh")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _named_paths(text: str) -> list[str]:
    """Repository paths in ``text``: files with an extension and folders (ending in ``/``)."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if match["rest"]:  # a placeholder follows: the folder before it must exist
            found.append(path[: path.rfind("/") + 1])
        elif path.endswith("/") or path.endswith(EXTENSIONS):
            found.append(path)
        # anything else (``trainer/global_step``, a metric's name) is not a path
    return found


def test_every_path_a_page_or_config_names_exists() -> None:
    missing = [
        f"{source.relative_to(REPO_ROOT)}: {path}"
        for source in [*PAGES, *CONFIGS]
        for path in _named_paths(_text(source))
        if not (REPO_ROOT / path).exists()
    ]
    assert not missing, missing


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, in_code = set(), False
    for line in _text(page).splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := re.match(r"#+ (.*)", line)):
            anchors.add(_slug(heading.group(1)))
    return anchors


def test_every_link_between_pages_reaches_a_page_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert not broken, broken


def _group_table() -> dict[str, list[str]]:
    """docs/configuration.md's table of groups: the options each row lists."""
    rows = {}
    for line in _text(REPO_ROOT / "docs" / "configuration.md").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and (group := re.fullmatch(r"`([\w/]+)`", cells[0])) and group.group(1) in GROUPS:
            rows[group.group(1)] = re.findall(r"`(\w+)`", cells[1])
    return rows


#: Groups of Hydra's own that our configs override once and a user does not choose.
HYDRA_OWN = ("hydra/help", "hydra/hydra_logging")


def test_the_configuration_page_lists_every_option_of_every_group() -> None:
    table = _group_table()
    chosen = {group: options for group, options in GROUPS.items() if group not in HYDRA_OWN}
    assert set(table) == set(chosen), f"groups without a row: {set(chosen) - set(table)}"
    for group, options in chosen.items():
        listed = set(table[group]) - NOT_OURS.get(group, set())
        assert listed == set(options), (
            f"docs/configuration.md lists {group}: {sorted(listed)}; conf/{group}/ holds {options}"
        )


#: Options the pages write on purpose as mistakes, to show what the command answers.
MISTAKES = {"experiment=charlmm", "strategy=foo"}


def test_every_group_option_a_page_or_config_writes_exists() -> None:
    """``logger=csv``, ``strategy=ddp``, ``experiment=charlm``, ``hydra/launcher=slurm`` in the text are options.

    A page's own project adds its options (``my_conf/model/line.yaml`` makes ``model=line``); Python's
    ``Trainer(logger=False, callbacks=[...])`` is not a group choice (capitalised, or a list of objects).
    """
    wrong = []
    for source in [*PAGES, *CONFIGS]:
        text = _text(source)
        for group, options in GROUPS.items():
            own = set(re.findall(rf"/{re.escape(group)}/(\w+)\.yaml", text))
            allowed = {*options, *own, *NOT_OURS.get(group, set()), "null"}
            for bracket, value in re.findall(rf"(?<![\w./+~-]){re.escape(group)}=(\[?)([a-z][\w,]*)", text):
                if bracket and group != "logger":
                    continue  # ``callbacks=[counter]``: a Python list; only the logger group takes a list
                wrong += [
                    f"{source.relative_to(REPO_ROOT)}: {group}={option}"
                    for option in value.split(",")
                    if option not in allowed and f"{group}={option}" not in MISTAKES
                ]
    assert not wrong, wrong


def test_every_target_of_ours_a_config_names_exists() -> None:
    """``_target_: trainer.cli.sweep_summary.TrialSummary``: the module's file holds that class or function."""
    wrong = []
    for config in CONFIGS:
        for target in re.findall(r"_target_:\s*([\w.]+)", _text(config)):
            module, _, name = target.rpartition(".")
            if not module.startswith(("trainer", "strategies", "callbacks")):
                continue
            # The installed ``trainer.examples`` is the repository's examples/ (pyproject.toml).
            parts = module.replace("trainer.examples", "examples", 1).split(".")
            file = REPO_ROOT.joinpath(*parts).with_suffix(".py")
            if file.is_file():
                found = re.search(rf"^(?:class|def) {name}\b", _text(file), re.MULTILINE) is not None
            else:
                init = REPO_ROOT.joinpath(*parts) / "__init__.py"
                found = init.is_file() and name in _exported(init)
            if not found:
                wrong.append(f"{config.relative_to(REPO_ROOT)}: {target}")
    assert not wrong, wrong


def _exported(init: Path) -> set[str]:
    """The names a package of ours exports, read from its ``__init__.py``'s ``__all__`` (not imported)."""
    source = _text(init)
    block = source[source.index("__all__") :]
    return set(re.findall(r'"(\w+)"', block[: block.index("]")]))


def test_every_callback_or_logger_a_page_names_is_exported() -> None:
    exported = _exported(REPO_ROOT / "callbacks" / "__init__.py")
    wrong = [
        f"{page.relative_to(REPO_ROOT)}: callbacks.{name}"
        for page in PAGES
        for name in re.findall(r"`callbacks\.([A-Z]\w+)", _text(page))  # not the placeholder ``callbacks.X``
        if name not in exported
    ]
    assert not wrong, wrong


def test_a_list_of_our_strategies_names_every_one() -> None:
    """A sentence naming ``single``, ``dp``, ``ddp``, ``amp`` and ``fsdp`` leaves none of ours out."""
    ours = GROUPS["strategy"]
    core = ("single", "dp", "ddp", "amp", "fsdp")
    short = []
    listing = [REPO_ROOT / "strategies" / "registry.py", REPO_ROOT / "strategies" / "__init__.py"]
    for source in [*PAGES, *listing, REPO_ROOT / "trainer" / "arguments.py"]:  # arguments.py: help(Trainer)
        for line in _text(source).splitlines():
            names = set(re.findall(r"[`'\"](\w+)[`'\"]", line))
            if all(name in names for name in core):
                missing = {"model_parallel"} - names if "model_parallel" in ours else set()
                if missing:
                    short.append(f"{source.relative_to(REPO_ROOT)}: {line.strip()[:100]} (lacks {sorted(missing)})")
    assert not short, short


def test_no_page_names_a_folder_of_one_machine() -> None:
    machine = re.compile(r"(?<![\w.])/(?:work|home|Users|scratch|mnt)/\w")
    found = [
        f"{source.relative_to(REPO_ROOT)}: {line.strip()[:100]}"
        for source in [*PAGES, *CONFIGS]
        for line in _text(source).splitlines()
        if machine.search(line)
    ]
    assert not found, found


def test_what_lightning_md_says_raises_when_built_does_and_nothing_else() -> None:
    """Rows of docs/lightning.md saying "building one raises NotImplementedError": each of those names does.

    MLflow's and W&B's loggers are supported, so no such row names them.
    """
    import callbacks

    refused: set[str] = set()
    for line in _text(REPO_ROOT / "docs" / "lightning.md").splitlines():
        cells = line.strip().strip("|").split("|")
        if len(cells) >= 2 and "building one raises `NotImplementedError`" in cells[1]:
            refused |= {name.split(".")[-1] for name in re.findall(r"`([\w.]+)`", cells[0])}
    # Nothing is refused by building any more; a row saying so again must be true.
    for name in sorted(refused):
        try:
            getattr(callbacks, name)()
        except NotImplementedError:
            continue
        raise AssertionError(f"docs/lightning.md says building callbacks.{name} raises NotImplementedError; it did not")
    from trainer.lightning import _CALLBACKS, _LOGGERS

    for name in [*_CALLBACKS, *_LOGGERS]:  # every Lightning callback and logger is a class of ours
        assert name not in refused and isinstance(getattr(callbacks, name), type), name
