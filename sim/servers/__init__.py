"""Real servers: measuring them with kvsim's own streams (`kvsim measure`), the OpenAI-compatible client, and the
run CSV format that measured runs are stored in."""
