"""Generation engines behind one interface (`base.Engine`): `hf` (transformers) and `vllm`."""
