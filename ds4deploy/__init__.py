"""ds4deploy: checked, benchmarked container recipes for DeepSeek V4 Flash.

Subpackages, one concern each. A module imports only from its own layer or a lower one (lowest first; enforced by
tests/unit/test_import_graph.py, which reads the line below):

    layers: data < core < parsers < recipe < engines < model < build < render < plan < checks < operate
            < bench < conformance < cli

- data: files shipped with the package (prompt sets, bench profiles, recorded client request shapes, a corpus).
- core: errors, strict YAML reading, addresses, file locks, the secret detector.
- parsers: pure functions from captured tool output (nvidia-smi, ib_write_bw, nccl-tests, show_gids) to data.
- recipe: the schema, recipe files, ``extends:`` and variants, model limits, engine replicas per node.
- engines: each engine family's command line and environment (vLLM, llama.cpp); what is family-specific lives here.
- model: manifests, hub pins, download, verification and staging of model files; the tiny generated model.
- build: engine image build contexts, locked downloads, the host engine venv.
- render: committed renders (compose files, env files, the front door's nginx config) and the recipe index.
- plan: the preflight rule book, inventories, node plans, Ansible play variables, air-gapped bundles.
- checks: host, rail and fabric checks against live nodes.
- operate: running playbooks, status, the supervisor and its service, incident folders, the API key file.
- bench, conformance: measurement and client conformance against a deployed server.
- cli: the ``ds4deploy`` command line, kept thin.
"""
