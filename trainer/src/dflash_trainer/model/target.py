"""The frozen target: a HF causal LM from a local directory, returning its tapped hidden states.

Feature of tapped layer id i = the output of decoder layer i = HF `hidden_states[i + 1]` (docs/dflash.md).
For soft labels it also returns the final-normed last hidden state (`last_hidden_state`); the loss
applies lm_head to it chunk by chunk, so full-vocabulary logits never exist for a whole batch.
With `split_over` (several devices, the first = `device`) the layers are spread over them (target_split.py);
the taps and last hidden state come back on `device` either way.
"""

from __future__ import annotations

import torch


class FrozenTarget:
    def __init__(self, model_dir: str, device: torch.device, layer_ids: list[int], need_last_hidden: bool,
                 split_over: list[torch.device] | None = None):
        from transformers import AutoModelForCausalLM

        # bf16 on GPU (the serving dtype); fp32 on CPU, where bf16 matmuls are slow and tests want exactness.
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.layer_devices = None
        if split_over and len(split_over) > 1:
            from dflash_trainer.model.target_split import place_layers
            self.layer_devices = place_layers(self.model, split_over)
        else:
            self.model.to(device)
        self.model.requires_grad_(False)
        self.config = self.model.config
        self.device = device
        self.layer_ids = list(layer_ids)
        self.need_last_hidden = need_last_hidden
        num_layers = getattr(self.config, "text_config", self.config).num_hidden_layers
        if max(self.layer_ids) >= num_layers - 1:
            # hidden_states[num_layers] is the final-normed output in transformers 5, not layer output.
            raise ValueError(f"--target-layer-ids {self.layer_ids} must be below {num_layers - 1}")

    def compile_layers(self) -> str:
        """torch.compile each decoder layer in place (CUDA, the target on one device): fuses the norms, RoPE,
        SwiGLU and casts that eager transformers runs as separate memory-bound kernels (the Qwen3-8B forward:
        0.61 -> 0.78 of the bf16 peak on an H200; benchmarks/target_forward.py). The layers share one graph per
        shape regime. Returns what was done, for the log. Only causal LMs with `model.layers` (Qwen3, Llama):
        the seed's Qwen3.5/3.6 (layers under `model.language_model`, Gated DeltaNet kernels) stays eager until
        measured compiled on a GPU."""
        import torch._dynamo.config as dynamo_config
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if self.device.type != "cuda":
            return "eager (not on CUDA)"
        if self.layer_devices is not None:
            return "eager (split over GPUs)"
        if layers is None:
            return f"eager ({type(self.model).__name__}: not compiled until measured on a GPU)"
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 32)
        for layer in layers:
            layer.compile()
        return f"compiled ({len(layers)} decoder layers)"

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def __call__(self, input_ids_BT: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        # Right padding under a causal mask never changes the states of real positions, so no
        # attention_mask is passed (it would force the slower masked attention path).
        out = self.model.model(input_ids=input_ids_BT.to(self.device), output_hidden_states=True, use_cache=False)
        taps = [out.hidden_states[i + 1].to(self.device) for i in self.layer_ids]
        last = out.last_hidden_state.to(self.device) if self.need_last_hidden else None
        return taps, last
