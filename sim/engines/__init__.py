"""Serving engines behind one interface (`sim.engines.interface`): vLLM v1 (`vllm/`) and SGLang (`sglang/`), each
a package of its own that imports nothing of the other. `sim.engines.registry.ENGINES` is the one registry; the
rest of kvsim builds engines through it and knows them only through the interface's Protocols."""
