"""A model's architecture, read from a Hugging Face `config.json`: what the roofline step-time model counts.

Only the fields that decide FLOPs and bytes are kept (a scenario stores them inline, so a scenario file is
self-contained): layers, hidden size, attention heads, KV heads, head dim, MLP intermediate size, vocabulary,
dtype, tied embeddings, and for a mixture of experts the experts, the experts per token and their size. Per layer:

    attention projections   hidden x (heads + 2 x kv_heads) x head_dim  +  heads x head_dim x hidden
    gated MLP (SiLU)        3 x hidden x intermediate               (dense; MoE: per expert, moe_intermediate)
    KV per token            layers x 2 (K, V) x kv_heads x head_dim x dtype bytes

Norms, biases and the router of an MoE are ignored (< 0.1 % of the parameters of every shipped model).
Not modelled: multi-head latent attention (DeepSeek), sliding windows, shared experts, quantised weights.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from sim.config import ConfigModel

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}


class ModelArchitecture(ConfigModel):
    """The architecture fields of a Hugging Face config (names as there), with what the time model derives."""

    num_hidden_layers: int = Field(ge=1, description="Transformer layers.")
    hidden_size: int = Field(ge=1, description="Hidden size.")
    num_attention_heads: int = Field(ge=1, description="Query heads.")
    num_key_value_heads: int = Field(ge=1, description="KV heads (grouped-query attention).")
    head_dim: int = Field(ge=1, description="Dimension of one head (default hidden_size / num_attention_heads).")
    intermediate_size: int = Field(ge=1, description="MLP intermediate size (of a dense layer).")
    vocab_size: int = Field(ge=1, description="Vocabulary (the logits' width).")
    dtype_bytes: int = Field(2, ge=1, le=4, description="Bytes per weight and per KV element (from torch_dtype).")
    tie_word_embeddings: bool = Field(False, description="The logits reuse the embedding matrix.")
    num_experts: int = Field(0, ge=0, description="Experts per MoE layer (0: dense).")
    num_experts_per_tok: int = Field(0, ge=0, description="Experts each token is routed to (MoE).")
    moe_intermediate_size: int = Field(0, ge=0, description="Intermediate size of one expert (MoE).")

    @model_validator(mode="after")
    def _check(self) -> ModelArchitecture:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size):
            raise ValueError(f"an MoE config needs 0 < num_experts_per_tok <= num_experts ({self.num_experts}) and "
                             f"moe_intermediate_size > 0")
        return self

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], *, source: str = "config") -> ModelArchitecture:
        """From a `config.json` mapping; a missing field is an error naming it (and the file)."""
        cfg = dict(config.get("text_config") or config)  # multimodal configs nest the language model's
        missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                               "vocab_size") if k not in cfg]
        if missing:
            raise ValueError(f"{source}: not a transformer config.json: no {', '.join(missing)}")
        if cfg.get("kv_lora_rank") or cfg.get("q_lora_rank"):
            raise ValueError(f"{source}: multi-head latent attention (kv_lora_rank) is not modelled")
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{source}: torch_dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
        heads = int(cfg["num_attention_heads"])
        return cls(
            num_hidden_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]),
            num_attention_heads=heads, num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
            dtype_bytes=DTYPE_BYTES[dtype], tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=experts, num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
            # NOTE: Mixtral's experts are full-size MLPs (intermediate_size); Qwen-MoE names theirs.
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]) if experts else 0,
        )

    # ------------------------------------------------------------------------------------------ derived sizes
    @property
    def attention_params_per_layer(self) -> int:
        q = self.num_attention_heads * self.head_dim
        return self.hidden_size * (q + 2 * self.num_key_value_heads * self.head_dim) + q * self.hidden_size

    @property
    def expert_params(self) -> int:
        """Parameters of one MLP: the dense MLP, or one expert of an MoE layer."""
        return 3 * self.hidden_size * (self.moe_intermediate_size if self.num_experts else self.intermediate_size)

    @property
    def layer_params_active(self) -> int:
        """Parameters one token multiplies through, all layers (attention + its experts' MLPs)."""
        experts = self.num_experts_per_tok if self.num_experts else 1
        return self.num_hidden_layers * (self.attention_params_per_layer + experts * self.expert_params)

    def layer_params_read(self, num_tokens: int) -> int:
        """Parameters a step of `num_tokens` tokens reads, all layers: an MoE layer reads at most the experts its
        tokens are routed to (min(experts, tokens x experts per token): an upper bound, as if no two collide)."""
        experts = min(self.num_experts, num_tokens * self.num_experts_per_tok) if self.num_experts else 1
        return self.num_hidden_layers * (self.attention_params_per_layer + experts * self.expert_params)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters (embeddings counted once when tied; norms and biases left out)."""
        experts = self.num_experts or 1
        layers = self.num_hidden_layers * (self.attention_params_per_layer + experts * self.expert_params)
        return layers + self.embedding_params * (1 if self.tie_word_embeddings else 2)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * self.dtype_bytes


def models_dir() -> Path:
    return Path(str(resources.files("sim.timing"))) / "models"


def shipped_models() -> list[str]:
    return sorted(p.stem for p in models_dir().glob("*.json"))


def load_architecture(name_or_path: str, *, relative_to: Path | None = None) -> tuple[str, ModelArchitecture]:
    """A shipped model by name (`Qwen3-0.6B`, case-insensitive) or a `config.json` path; returns (name, arch).
    A relative path is taken from `relative_to` (a scenario's directory) when given, else from the working
    directory. Errors are one line naming the file and what is wrong."""
    by_name = {n.lower(): n for n in shipped_models()}
    if name_or_path.lower() in by_name:
        name = by_name[name_or_path.lower()]
        path = models_dir() / f"{name}.json"
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
        if not path.is_file():
            raise ValueError(f"model config {name_or_path!r}: neither a shipped model ({', '.join(shipped_models())}) "
                             f"nor a config.json file")
        name = path.parent.name if path.name == "config.json" else path.stem
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"model config {path}: not a readable JSON file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model config {path}: a config.json is a JSON object")
    return name, ModelArchitecture.from_hf_config(data, source=str(path))
