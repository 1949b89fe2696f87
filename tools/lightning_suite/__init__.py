"""Lightning's own test suite run against geartrain: the conformance runner.

Given a checkout of Lightning's sources, :mod:`tools.lightning_suite` builds a scratch folder with

* an alias-only package (``lightning``, ``lightning.pytorch``, ``pytorch_lightning``) whose modules
  are ``trainer.lightning``'s, object for object (:mod:`tools.lightning_suite.alias`);
* a copy of Lightning's ``tests/tests_pytorch`` whose harness files (its ``conftest.py`` and
  ``helpers/runif.py``, which reach Lightning's internals to set tests up) are replaced by ours
  (``harness/``);

then runs the test files folder by folder under pytest with a per-test timeout
(:mod:`tools.lightning_suite.run`), and sorts every outcome into one of Lightning-conformance's
classes (:mod:`tools.lightning_suite.classify`), written as JSON lines, CSV and a per-folder table
(:mod:`tools.lightning_suite.report`). ``python -m tools.lightning_suite --help`` says how; the
guide is docs/testing.md ("Lightning's own test suite").
"""
