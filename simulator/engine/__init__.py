"""Real-engine releases: the seed's layout, whose server is real inference software.

Two engines: ``transformers serve`` (PyTorch; :func:`build.build_engine_release`) and ``llama-server``
(llama.cpp; :func:`llama_release.build_llama_release`). Both builders write the tarball with the standard
library only, through the steps they share (:mod:`.release`); their programs come from one source,
:mod:`simulator.engine.runtime` (shared modules plus each engine's own), copied into the tarball as
``scripts/ci/musa/m1000_engine`` or ``m1000_llama``. ``models`` and ``llama_models`` write random-weight
models and need torch + transformers (run them with the engine's interpreter).
"""
