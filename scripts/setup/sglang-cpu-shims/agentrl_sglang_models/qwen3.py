from sglang.srt.models.qwen3 import Qwen3ForCausalLM

EntryClass = Qwen3ForCausalLM
