"""The export's transformers model: `AutoModel.from_pretrained(export_dir, trust_remote_code=True)`.

dflash-export copies this file and drafter.py beside the weights (config.json's auto_map names
modeling_dflash.DFlashDraftModel), so the export loads with transformers alone. The math is drafter.py's own
(context_vector, draft_hidden): one implementation, trained and served.

Like the engines, the model has no embedding and no head: the caller embeds the block with the target's
embed_tokens and applies the target's lm_head to the returned hidden states (the z-lab convention).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel, Qwen3Config

from .drafter import DFlashLayer, DrafterConfig, RMSNorm, context_vector, draft_hidden


def drafter_config_from_export(config: dict) -> DrafterConfig:
    """DrafterConfig from an export's config.json (dict)."""
    d = config["dflash_config"]
    rope = dict(config.get("rope_parameters") or {})
    if config.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    rope_theta = config.get("rope_theta", rope.get("rope_theta"))  # transformers 5 keeps it in rope_parameters
    plain = rope.get("rope_type", "default") == "default" and rope.get("partial_rotary_factor", 1.0) == 1.0
    return DrafterConfig(
        hidden_size=config["hidden_size"], num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"], num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"], intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"], target_layer_ids=list(d["target_layer_ids"]),
        num_target_layers=config["num_target_layers"], block_size=d["block_size"],
        mask_token_id=d["mask_token_id"], rms_norm_eps=config["rms_norm_eps"], rope_theta=rope_theta,
        max_position_embeddings=config["max_position_embeddings"], rope_parameters=None if plain else rope)


class DFlashDraftModel(PreTrainedModel):
    config_class = Qwen3Config  # the export's model_type is qwen3 (what the engines expect)
    base_model_prefix = ""
    _no_split_modules = ["DFlashLayer"]

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        self.cfg = drafter_config_from_export(config.to_dict())
        H = self.cfg.hidden_size
        self.fc = nn.Linear(self.cfg.num_taps * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, self.cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(self.cfg) for _ in range(self.cfg.num_hidden_layers))
        self.norm = RMSNorm(H, self.cfg.rms_norm_eps)
        self.post_init()

    def _init_weights(self, module):  # only reached for weights an export lacks; RMSNorm weights start at 1
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def forward(self, target_hidden: torch.Tensor, noise_embedding: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """target_hidden [B, T, K*H]: the K tapped target layers' outputs (config dflash_config.target_layer_ids,
        HF hidden_states[id + 1]) concatenated; noise_embedding [B, Q, H]: the block [last token, MASK...]
        embedded by the target; position_ids [B, Q]: the block's absolute positions; attention_mask: a boolean
        [B, 1, Q, T+Q] (True = visible), default every context position and the whole block.
        Returns the final-normed hidden states [B, Q, H] (logits = target lm_head of them)."""
        H = self.cfg.hidden_size
        taps = list(target_hidden.split(H, dim=-1))
        c = context_vector(self, taps)
        # None reaches attention as no mask (every key visible), which lets SDPA take flash attention on CUDA
        return draft_hidden(self, c, noise_embedding.to(c.dtype), position_ids, attention_mask)
