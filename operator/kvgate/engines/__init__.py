"""What kvgate knows of vLLM and SGLang: how they launch, their versions and the KV formats they offer."""
