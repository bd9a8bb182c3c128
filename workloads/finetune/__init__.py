"""Workloads: LoRA, FSDP and ZeRO-3 fine-tunes, their data and tokenizer."""
