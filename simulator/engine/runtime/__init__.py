"""Programs of a real-engine release: one source for both engines.

Each builder copies the shared modules (``common``, ``workflow``, ``precompile``, ``serve``, ``bench``)
and its engine's modules into the tarball as ``scripts/ci/musa/m1000_<x>`` (``m1000_engine``:
``transformers_serve``; ``m1000_llama``: ``llama_server``, ``llama_bench``, ``gguf``), so a release runs
on a module without this tree. The shared programs find their engine through ``bench_config.json``'s
``engine`` (:func:`common.load_engine`).
"""
