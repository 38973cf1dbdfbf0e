"""Random-weight GGUF models of the reference document's architectures for ``llama-server``, made offline.

Per model folder of the seed: a Qwen3-MoE (``qwen3``), a Qwen3.5-MoE whose checkpoint carries the
MTP head (``mtp.*`` tensors: the NEXTN layer that ``--spec-type draft-mtp`` drafts with; the
``qwen35*`` and ``qwen36_fq`` folders), a Qwen3-VL with its vision tower (``qwen3vl``: ``model.gguf``
plus the projector ``mmproj.gguf``). Each is made as a Hugging Face checkpoint with transformers'
own model classes (random weights from a fixed seed), then converted by the converter that ships in
the pinned llama.cpp source (``convert_hf_to_gguf.py``, ``--mmproj`` for the projector), in this
process. A folder ends up holding ``config.json`` (the checkpoint's), ``model.gguf``,
``mmproj.gguf`` (VL only) and ``m1000_engine.json`` (what was made).

The tokenizer is word-level: a SentencePiece model (written here, :func:`sentencepiece_model`) whose
pieces are ``▁w0 .. ▁w{N-1}`` plus the pieces that spell them (``▁``, ``w``, the digits, ``▁w``), so
llama.cpp's SentencePiece tokenizer turns ``w17 w3`` into exactly two tokens: a prompt of N words
``wK`` is N tokens, and ``add_bos_token`` is off. The Qwen converters only write Qwen's byte-level
BPE vocabulary (recognised by a hash of its merges); for these models the converter's own
SentencePiece writer is chosen instead (:func:`convert`), everything else is the converter as shipped.
The vocabulary has 32768 entries, so the agent's probe (token ids in [1000, 30000)) is valid too.

Run with the engine's interpreter (torch + transformers + sentencepiece):
``python -m simulator make-models --engine llama.cpp ROOT`` (needs ``make engine``).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.runtime.core import SimError

__all__ = ["KINDS", "SIZES", "LlamaSize", "make_llama_model", "make_llama_models", "sentencepiece_model",
           "vocabulary"]

VOCAB = 32768
SPECIALS = ("<|video_pad|>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>")  # Qwen3-VL's markers
_SPELL = ["\u2581", "w", *[str(d) for d in range(10)], "\u2581w"]
FIRST_WORD = 3 + len(_SPELL)  # <unk>, <s>, </s>, then the spelling pieces, then the words
WORDS = VOCAB - FIRST_WORD - len(SPECIALS)
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %} {% endfor %}"
)
# model folder kind -> Hugging Face architecture
KINDS = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
         "qwen3_vl": "Qwen3VLForConditionalGeneration"}
KIND_OF_KEY = {"qwen3": "qwen3_moe", "qwen35": "qwen3_5_moe", "qwen35_mtp": "qwen3_5_moe",
               "qwen35_fq": "qwen3_5_moe", "qwen35_fq_mtp": "qwen3_5_moe", "qwen36_fq": "qwen3_5_moe",
               "qwen3vl": "qwen3_vl"}


@dataclass(frozen=True)
class LlamaSize:
    """Dimensions of the random models (``tiny``: CPU tests; ``gpu``: a few hundred million parameters)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_per_tok: int
    moe_intermediate: int
    intermediate: int
    vision_depth: int
    vision_hidden: int
    vision_heads: int


SIZES: dict[str, LlamaSize] = {
    "tiny": LlamaSize("tiny", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, experts=4, experts_per_tok=2,
                      moe_intermediate=32, intermediate=128, vision_depth=2, vision_hidden=64, vision_heads=2),
    "gpu": LlamaSize("gpu", hidden=1024, layers=12, heads=16, kv_heads=4, head_dim=64, experts=16,
                     experts_per_tok=4, moe_intermediate=512, intermediate=3072, vision_depth=6, vision_hidden=512,
                     vision_heads=8),
}


# ----- the word-level SentencePiece vocabulary (pure) ------------------------------------------------------


def vocabulary() -> list[tuple[str, float, int]]:
    """(piece, score, type) of every id; types as SentencePiece's: 1 normal, 2 unknown, 3 control."""
    pieces: list[tuple[str, float, int]] = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(p, 0.0, 1) for p in _SPELL]
    pieces += [(f"\u2581w{i}", -float(i), 1) for i in range(WORDS)]
    pieces += [(s, 0.0, 3) for s in SPECIALS]
    return pieces


def word_id(i: int) -> int:
    """The token id of the word ``w<i>``."""
    if not 0 <= i < WORDS:
        raise ValueError(f"w{i}: not in the vocabulary (w0 .. w{WORDS - 1})")
    return FIRST_WORD + i


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


def sentencepiece_model(pieces: list[tuple[str, float, int]]) -> bytes:
    """A SentencePiece ``ModelProto`` (``tokenizer.model``): the pieces, a BPE trainer spec, an identity
    normalizer that adds the leading ``▁`` (protobuf wire format, written by hand: no protobuf needed)."""
    out = bytearray()
    for text, score, kind in pieces:
        body = _field(1, 2, text.encode()) + _field(2, 5, struct.pack("<f", score)) + _field(3, 0, _varint(kind))
        out += _field(1, 2, body)
    out += _field(2, 2, _field(3, 0, _varint(2)) + _field(4, 0, _varint(len(pieces))))  # model_type BPE
    out += _field(3, 2, _field(1, 2, b"identity") + _field(3, 0, b"\x01") + _field(4, 0, b"\x00")
                  + _field(5, 0, b"\x01"))  # add_dummy_prefix, keep spaces, escape them as ▁
    return bytes(out)


def tokenizer_files(dest: Path) -> None:
    (dest / "tokenizer.model").write_bytes(sentencepiece_model(vocabulary()))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": False, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}, indent=1) + "\n", encoding="utf-8")


# ----- configurations (pure) ---------------------------------------------------------------------------------


def _sections(half: int, share: float) -> list[int]:
    """Interleaved M-RoPE sections (t, h, w) over ``half`` rotary pairs: h and w get ``share`` each."""
    hw = max(1, round(half * share))
    return [half - 2 * hw, hw, hw]


def hf_config(kind: str, s: LlamaSize) -> dict[str, Any]:
    """The transformers configuration of one random model (keyword arguments of its config class)."""
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
    text = {"vocab_size": VOCAB, "hidden_size": s.hidden, "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
            "max_position_embeddings": 32768, **ids}
    if kind == "qwen3_moe":
        return {**text, "intermediate_size": s.intermediate, "num_experts": s.experts,
                "num_experts_per_tok": s.experts_per_tok, "moe_intermediate_size": s.moe_intermediate}
    if kind == "qwen3_5_moe":
        # hybrid: three Gated DeltaNet (linear attention) layers to one full-attention layer, as Qwen3.5
        types = ["full_attention" if (i + 1) % 4 == 0 or i == s.layers - 1 else "linear_attention"
                 for i in range(s.layers)]
        return {**text, "layer_types": types, "linear_conv_kernel_dim": 4, "linear_key_head_dim": s.head_dim,
                "linear_value_head_dim": s.head_dim, "linear_num_key_heads": max(1, s.kv_heads),
                "linear_num_value_heads": 2 * max(1, s.kv_heads), "num_experts": s.experts,
                "num_experts_per_tok": s.experts_per_tok, "moe_intermediate_size": s.moe_intermediate,
                "shared_expert_intermediate_size": s.moe_intermediate, "mtp_num_hidden_layers": 1,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                    "mrope_section": _sections(s.head_dim // 8, 11 / 32), "mrope_interleaved": True}}
    if kind == "qwen3_vl":
        section = _sections(s.head_dim // 2, 20 / 64)  # t, h, w: Qwen3-VL's 24, 20, 20 scaled to this head
        return {
            "text_config": {**text, "intermediate_size": s.intermediate,
                            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                                "mrope_section": section, "mrope_interleaved": True}},
            "vision_config": {"depth": s.vision_depth, "hidden_size": s.vision_hidden,
                              "intermediate_size": 2 * s.vision_hidden, "num_heads": s.vision_heads,
                              "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                              "out_hidden_size": s.hidden, "num_position_embeddings": 2304,
                              "deepstack_visual_indexes": [0]},
            "image_token_id": VOCAB - 3, "video_token_id": VOCAB - 4, "vision_start_token_id": VOCAB - 2,
            "vision_end_token_id": VOCAB - 1, "tie_word_embeddings": False,
        }
    raise SimError(f"unknown model kind {kind!r} (known: {', '.join(KINDS)})")


PREPROCESSOR = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "patch_size": 16, "merge_size": 2,
                "temporal_patch_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 16777216},
                "image_processor_type": "Qwen2VLImageProcessorFast"}


# ----- making and converting (I/O) ---------------------------------------------------------------------------


def _checkpoint(kind: str, s: LlamaSize, dest: Path, seed: int) -> int:
    """A random Hugging Face checkpoint of ``kind`` in ``dest``; returns its parameter count."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    cfg_cls = {"qwen3_moe": transformers.Qwen3MoeConfig, "qwen3_5_moe": transformers.Qwen3_5MoeTextConfig,
               "qwen3_vl": transformers.Qwen3VLConfig}[kind]
    model_cls = {"qwen3_moe": transformers.Qwen3MoeForCausalLM, "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM,
                 "qwen3_vl": transformers.Qwen3VLForConditionalGeneration}[kind]
    model = model_cls(cfg_cls(**hf_config(kind, s)))
    model.save_pretrained(dest)
    params = sum(p.numel() for p in model.parameters())
    if kind == "qwen3_5_moe":  # the MTP head: transformers has no module for it; the checkpoint carries it
        weights = load_file(str(dest / "model.safetensors"))
        full = model.config.layer_types.index("full_attention")
        gen = torch.Generator().manual_seed(seed + 1)
        mtp: dict[str, Any] = {
            "mtp.fc.weight": torch.randn(s.hidden, 2 * s.hidden, generator=gen) * 0.02,
            **{f"mtp.{n}.weight": torch.zeros(s.hidden) for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden",
                                                                  "norm")},
        }
        layer = f"model.layers.{full}."
        for name, w in weights.items():
            if name.startswith(layer):
                new = "mtp.layers.0." + name[len(layer):]
                mtp[new] = torch.randn(w.shape, generator=gen) * 0.02 if w.dim() > 1 else w.clone()
        params += sum(int(t.numel()) for t in mtp.values())
        save_file({**weights, **mtp}, str(dest / "model.safetensors"), metadata={"format": "pt"})
    if kind == "qwen3_vl":
        (dest / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1) + "\n", encoding="utf-8")
    tokenizer_files(dest)
    return params


def convert(src: Path, checkpoint: Path, out: Path, *, mmproj: bool = False, outtype: str = "f16") -> None:
    """``convert_hf_to_gguf.py`` of the llama.cpp source, run in this process on ``checkpoint``.

    The one change: the Qwen3-MoE and Qwen3.5-MoE converters write the tokenizer with the converter's
    own SentencePiece writer (``_set_vocab_sentencepiece``, which Qwen3-VL's converter already tries
    first), since these models' tokenizer is a word-level SentencePiece model, not Qwen's BPE.
    """
    script = src / "convert_hf_to_gguf.py"
    if not script.exists():
        raise SimError(f"{script}: not found: the llama.cpp source is not unpacked (make engine)")
    for p in (str(src / "gguf-py"), str(src)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import conversion  # llama.cpp's own converter package
    from conversion.base import TextModel

    for arch in ("Qwen3MoeForCausalLM", "Qwen3_5MoeForCausalLM"):
        conversion.get_model_class(arch).set_vocab = TextModel._set_vocab_sentencepiece
    argv = [str(script), str(checkpoint), "--outfile", str(out), "--outtype", outtype,
            *(["--mmproj"] if mmproj else [])]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise SimError(f"convert_hf_to_gguf.py {checkpoint.name}: exit {exc.code}") from None
    finally:
        sys.argv = old
    if not out.exists():
        raise SimError(f"convert_hf_to_gguf.py wrote no {out}")


def make_llama_model(folder: str | os.PathLike[str], kind: str, src: Path, size: str = "tiny",
                     seed: int = 0) -> Path:
    """One model folder (idempotent: a folder already made with the same kind, size and seed is kept)."""
    if size not in SIZES:
        raise SimError(f"unknown llama.cpp model size {size!r} (known: {', '.join(SIZES)})")
    if kind not in KINDS:
        raise SimError(f"unknown model kind {kind!r} (known: {', '.join(KINDS)})")
    dest = Path(folder)
    marker = dest / "m1000_engine.json"
    want = {"engine": "llama.cpp", "kind": kind, "size": size, "seed": seed}
    if marker.exists():
        have = json.loads(marker.read_text(encoding="utf-8"))
        if all(have.get(k) == v for k, v in want.items()):
            return dest
    dest.mkdir(parents=True, exist_ok=True)
    outtype = "f32" if size == "tiny" else "f16"
    with tempfile.TemporaryDirectory(prefix="m1000-ckpt-") as tmp:
        ckpt = Path(tmp)
        params = _checkpoint(kind, SIZES[size], ckpt, seed)
        convert(src, ckpt, dest / "model.gguf", outtype=outtype)
        if kind == "qwen3_vl":
            convert(src, ckpt, dest / "mmproj.gguf", mmproj=True, outtype=outtype)
        shutil.copy2(ckpt / "config.json", dest / "config.json")
    info = {**want, "architecture": KINDS[kind], "parameters": params, "random_weights": True,
            "mtp_layers": 1 if kind == "qwen3_5_moe" else 0, "mmproj": kind == "qwen3_vl", "vocab": VOCAB,
            "words": WORDS, "dtype": outtype}
    tmp_marker = dest / f".m1000_engine.json.tmp.{os.getpid()}"
    tmp_marker.write_text(json.dumps(info) + "\n", encoding="utf-8")
    os.replace(tmp_marker, marker)
    return dest


def make_llama_models(root: str | os.PathLike[str], src: Path, keys: list[str] | None = None,
                      size: str = "tiny") -> dict[str, Path]:
    """Model folders under ``root`` for ``keys`` (default all seven); keys sharing a folder share its model."""
    from contract.records import MODEL_KEYS

    chosen = list(MODEL_KEYS) if keys is None else keys
    unknown = [k for k in chosen if k not in MODEL_KEYS]
    if unknown:
        raise SimError(f"unknown model key(s) {', '.join(unknown)} (known: {', '.join(MODEL_KEYS)})")
    out: dict[str, Path] = {}
    every = list(dict.fromkeys(s.model_dir for s in MODEL_KEYS.values()))  # a folder's seed: its place here
    for d in [d for d in every if any(MODEL_KEYS[k].model_dir == d for k in chosen)]:
        kind = KIND_OF_KEY[next(k for k in chosen if MODEL_KEYS[k].model_dir == d)]
        path = make_llama_model(Path(root) / d, kind, src, size=size, seed=every.index(d))
        out.update({k: path for k in chosen if MODEL_KEYS[k].model_dir == d})
    return out
