"""Small random-weight models of the seed's architectures, made offline (needs torch + transformers).

Each model folder is a real Hugging Face checkpoint that ``transformers serve`` loads:
``config.json`` (a Qwen3-MoE with tiny dimensions, or a larger dense-sized one for the GPU
run), ``model.safetensors`` with random weights from a fixed seed, and a word-level
tokenizer whose vocabulary is ``w0 .. w{V-3}`` plus ``<unk>`` and ``<pad>``: a prompt of N
words ``wK`` is exactly N tokens, so the benchmark knows its input length without a
tokenizer of its own. The tokenizer has no end-of-sequence token, so a request always
generates ``max_tokens`` tokens (``transformers serve`` refuses ``ignore_eos``).

Run with the engine's interpreter: ``python -m simulator make-models --engine transformers ROOT``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from simulator.runtime.core import SimError

__all__ = ["SIZES", "EngineModelSize", "make_engine_model"]

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %} {% endfor %}"
)


@dataclass(frozen=True)
class EngineModelSize:
    """Dimensions of one random Qwen3-MoE (``tiny``: ~1 M parameters, for CPU tests)."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    experts: int
    experts_per_tok: int
    moe_intermediate: int
    intermediate: int


SIZES: dict[str, EngineModelSize] = {
    "tiny": EngineModelSize("tiny", vocab=2048, hidden=64, layers=2, heads=4, kv_heads=2, experts=8,
                            experts_per_tok=2, moe_intermediate=64, intermediate=128),
    # ~0.5 B parameters (for the GPU run): wide enough that the accelerator does real work.
    "0.5b": EngineModelSize("0.5b", vocab=32000, hidden=1024, layers=12, heads=16, kv_heads=4, experts=12,
                            experts_per_tok=4, moe_intermediate=1024, intermediate=4096),
}


def _tokenizer(vocab: int, max_len: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<pad>": 1}
    words.update({f"w{i}": i + 2 for i in range(vocab - 2)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=max_len)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_engine_model(folder: str | os.PathLike[str], size: str = "tiny", seed: int = 0,
                      max_positions: int = 32768) -> Path:
    """Write a random-weight Qwen3-MoE checkpoint with a word-level tokenizer into ``folder`` (idempotent)."""
    if size not in SIZES:
        raise SimError(f"unknown engine model size {size!r} (known: {', '.join(SIZES)})")
    dest = Path(folder)
    marker = dest / "m1000_engine.json"
    if marker.exists() and json.loads(marker.read_text(encoding="utf-8")).get("size") == size:
        return dest
    import torch
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    s = SIZES[size]
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                         head_dim=s.hidden // s.heads, num_experts=s.experts, num_experts_per_tok=s.experts_per_tok,
                         moe_intermediate_size=s.moe_intermediate, max_position_embeddings=max_positions,
                         pad_token_id=1, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16 if size != "tiny" else torch.float32)
    model.generation_config = GenerationConfig(pad_token_id=1, bos_token_id=None, eos_token_id=None,
                                               do_sample=False)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    _tokenizer(s.vocab, max_positions).save_pretrained(dest)
    params = sum(p.numel() for p in model.parameters())
    tmp = dest / f".m1000_engine.json.tmp.{os.getpid()}"
    tmp.write_text(json.dumps({"size": size, "seed": seed, "parameters": params, "architecture": "Qwen3MoeForCausalLM",
                               "random_weights": True}) + "\n", encoding="utf-8")
    os.replace(tmp, marker)
    return dest


def make_engine_models(root: str | os.PathLike[str], keys: list[str] | None = None,
                       size: str = "tiny") -> dict[str, Path]:
    """Random checkpoints under ``root`` for the keys this release serves (default: all of them).

    Keys sharing a folder (``qwen35`` and ``qwen35_mtp``) share the checkpoint; a key the
    release refuses (``qwen3vl``) gets no folder (the release says why it is not served).
    """
    from contract.records import MODEL_KEYS
    from simulator.engine.build import SUPPORTED_KEYS

    chosen = list(SUPPORTED_KEYS) if keys is None else keys
    unknown = [k for k in chosen if k not in MODEL_KEYS]
    if unknown:
        raise SimError(f"unknown model key(s) {', '.join(unknown)} (known: {', '.join(MODEL_KEYS)})")
    out: dict[str, Path] = {}
    for i, key in enumerate(sorted({MODEL_KEYS[k].model_dir for k in chosen if MODEL_KEYS[k].model_dir
                                    in {MODEL_KEYS[s].model_dir for s in SUPPORTED_KEYS}})):
        path = make_engine_model(Path(root) / key, size=size, seed=i)
        out.update({k: path for k in chosen if MODEL_KEYS[k].model_dir == key})
    return out
