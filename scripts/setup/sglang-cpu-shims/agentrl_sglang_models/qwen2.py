from sglang.srt.models.qwen2 import Qwen2ForCausalLM

EntryClass = Qwen2ForCausalLM
