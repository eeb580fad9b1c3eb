"""Other projects' checkpoint formats read into ours: `hf_llama`, Hugging Face Llama-family folders."""
