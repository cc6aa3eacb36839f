"""the export for SGLang/vLLM."""
