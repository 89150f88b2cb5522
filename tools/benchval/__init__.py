"""Validation of the benchmark harness and measurements of the deploy tooling, kept out of the runtime package.

Each module runs from the repository root as ``python -m tools.benchval.<module>`` (the Makefile targets
bench-harness, bench-stack, bench-multinode, bench-verify); their results are written to docs/. They need the
``validate`` extra (``pip install -e '.[validate]'``; `make venv` installs it).
"""
