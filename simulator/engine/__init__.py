"""A real-engine release: the seed's layout, whose server is ``transformers serve`` (PyTorch).

``build_engine_release`` writes the tarball (standard library only, like the simulated one);
``models.make_engine_model`` writes random-weight checkpoints and needs torch + transformers
(run it with the engine's interpreter). The release's programs are :mod:`simulator.engine.runtime`,
copied into the tarball as ``scripts/ci/musa/m1000_engine``.
"""
